#!/usr/bin/env bash
# Megatron-core against the operator's decision, on the GPU node
# (docs/benchmarks/megatron-h200.md):
#   1. this node's report from the agent's own NVML code (`offload-agent probe`);
#   2. per case, the operator's decision for a Megatron TrainingJob of that GPT shape
#      (`offload-operator explain` against the report and the node's memory), and its estimate;
#   3. that decision's OFFLOAD_MEGATRON_ARGS trained by Megatron-core's own GPTModel
#      (hack/gpu/megatron_step.py, under torchrun), then each fraction of the case's sweep, each
#      with the operator's estimate for that fraction (the job with offloadRatio fixed), so every
#      row has its estimate beside what was measured.
# Usage: hack/gpu/megatron-bench.sh OPERATOR AGENT OUT DEADLINE_S CASE...
# A CASE is NAME:LAYERSxHIDDEN:HEADS:SEQ[:SWEEP[:TP[:DP]]] — a GPT of LAYERS blocks of width
# HIDDEN with HEADS heads, SEQ tokens a step, vocabulary 50304; SWEEP the fractions to try
# besides the decision's (comma-separated, 0 for no offload); TP the tensor-parallel size, DP the
# data-parallel size, over which the distributed optimizer shards its state (GPUs: TP × DP, one
# a pod in the TrainingJob).
# The operator renders Megatron-LM's --manual-gc (a collection before the first step) with the
# offload flags; MANUAL_GC=1 adds it to every run (those without offload too), MANUAL_GC=0
# declares `manualGc: false` in every job (no collection rendered, the first copy counted).
# Leaves OUT/megatron.jsonl (one object a run), OUT/log.txt and the decisions.
set -uo pipefail
ops=$1 agent=$2 out=$3 deadline=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
start=$SECONDS
# shellcheck source=hack/gpu/common.sh
source "$here/common.sh"
gpu_python || exit 1
# Megatron-core's tensor parallelism orders its kernels on one connection.
export CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__, "gpus", torch.cuda.device_count())' 2>&1 | tail -1 | tee -a "$out/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/nvidia-smi.csv" 2>&1

node=$(node_report "$agent")
hostmem=$(host_memory)

# The TrainingJob of a case, with the offload fixed at a fraction where one is given.
job() { # NAME LAYERS HIDDEN HEADS SEQ TP DP [FRACTION]
  local offload="{mode: Auto, overlap: Auto}" gc=""
  [[ ${MANUAL_GC:-} == 0 ]] && gc=", manualGc: false"
  if [[ -n ${8:-} ]]; then
    if [[ $8 == 0 ]]; then offload="{mode: Disabled}"; else offload="{mode: CPUCopy, overlap: Auto, offloadRatio: \"$8\"}"; fi
  fi
  cat <<EOF
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: $1, namespace: bench, annotations: {offload.dev/profile: default}}
spec:
  replicas: $(($6 * $7))
  framework: {name: Megatron, version: "0.14.0"}
  megatron: {tensorParallel: $6, sequenceParallel: true, transformerImpl: Local$gc}
  model: {architecture: GPT, hiddenSize: $3, layers: $2, attentionHeads: $4, vocabSize: 50304, tokensPerStep: $5}
  offload: $offload
  template:
    spec:
      containers:
        - {name: train, image: bench, resources: {limits: {nvidia.com/gpu: 1}}}
EOF
}

# The decision's flags and estimate, separated by the unit separator (empty fields kept):
# ARGS, GPU_BYTES, HOST_BYTES, PLACEMENT; or, where the operator does not run it, three empty
# fields and why.
decide() { # FILE
  "$ops" explain -f "$1" --node-report "h200=$node" --node-memory "h200=$hostmem" -o json \
    2>>"$out/explain.log" | tee "${1%.yaml}.json" | python3 -c '
import json, sys
e = json.load(sys.stdin)
if not e.get("resolved"):
    print("\x1f\x1f\x1f" + (e.get("message") or e.get("reason") or "not resolved"))
    sys.exit(0)
env = {x["name"]: x.get("value", "") for x in e.get("env", [])}
if not env:
    c = e["object"]["spec"]["template"]["spec"]["containers"][0]
    env = {x["name"]: x.get("value", "") for x in c.get("env", [])}
m = e["decision"].get("memory") or {}
print("\x1f".join([env.get("OFFLOAD_MEGATRON_ARGS", ""), str(m.get("gpuBytes", "")),
                 str(m.get("hostBytesPerPod", "")), m.get("placement", "")]))'
}

for case in "$@"; do
  IFS=: read -r name shape heads seq sweep tp dp <<<"$case"
  IFS=x read -r layers hidden <<<"$shape"
  tp=${tp:-1} dp=${dp:-1}
  fractions=(decision)
  [[ -n ${sweep:-} ]] && IFS=, read -r -a more <<<"$sweep" && fractions+=("${more[@]}")
  for f in "${fractions[@]}"; do
    if ((SECONDS - start > deadline)); then
      log "$name $f: deadline reached"
      echo "{\"case\": \"$name\", \"fraction\": \"$f\", \"skipped\": true}" >>"$out/megatron.jsonl"
      continue
    fi
    file=$out/$name-$f.yaml
    if [[ $f == decision ]]; then job "$name" "$layers" "$hidden" "$heads" "$seq" "$tp" "$dp" >"$file"
    else job "$name" "$layers" "$hidden" "$heads" "$seq" "$tp" "$dp" "$f" >"$file"; fi
    IFS=$'\x1f' read -r args gpu host placement <<<"$(decide "$file")"
    if [[ $f == decision ]]; then
      if [[ -z $args ]]; then
        log "$name: the operator does not run it: $placement"
        python3 -c 'import json,sys; print(json.dumps({"case": sys.argv[1], "fraction": "decision", "refused": sys.argv[2]}))' \
          "$name" "$placement" >>"$out/megatron.jsonl"
        continue 2
      fi
      decided=$args
    elif [[ -z $args ]]; then
      # A sweep point the operator would not run still runs: the truth beside the estimate
      # (read from its refusal), with the decision's flags at this fraction.
      gpu=$(grep -o "needs about [0-9.]* GiB of the" <<<"$placement" | head -1 | awk '{printf "%.0f", $3 * 1073741824}')
      placement="refused by the operator: ${placement:0:300}"
      if [[ $f == 0 ]]; then args="--use-distributed-optimizer"
      else args=$(sed -E "s/--optimizer-offload-fraction [0-9.]+/--optimizer-offload-fraction $f/" <<<"$decided"); fi
      [[ $args == *--optimizer-cpu-offload* || $f == 0 ]] ||
        args="$args --optimizer-cpu-offload --use-precision-aware-optimizer --optimizer-offload-fraction $f"
    fi
    # MANUAL_GC=1: each run with Megatron-LM's --manual-gc (a collection before the first step).
    [[ ${MANUAL_GC:-} == 1 && $args != *--manual-gc* ]] && args="$args --manual-gc"
    log "$name $f: $placement (estimate GPU $gpu, host $host): $args"
    result=$(timeout 300 torchrun --standalone --nproc-per-node "$((tp * dp))" "$here/megatron_step.py" \
      --layers "$layers" --hidden "$hidden" --heads "$heads" --vocab 50304 --seq "$seq" \
      --tp "$tp" --sequence-parallel --args="$args" --label "$name-$f" \
      2>>"$out/$name-$f.err" | grep '^{' | tail -1)
    [[ -z $result ]] && result='{"ended": "no output (killed, or the host ran out of memory)"}'
    python3 -c '
import json, sys
r = json.loads(sys.argv[1])
r.update({"case": sys.argv[2], "fraction": sys.argv[3], "placement": sys.argv[4],
          "estimate_gpu_bytes": int(sys.argv[5] or 0), "estimate_host_bytes": int(sys.argv[6] or 0)})
print(json.dumps(r))' "$result" "$name" "$f" "$placement" "$gpu" "$host" >>"$out/megatron.jsonl"
    log "$name $f: $(tail -1 "$out/megatron.jsonl" | python3 -c '
import json, sys
r = json.load(sys.stdin)
g = r.get("gpu_allocated_peak_bytes")
print(r.get("ended"), "allocated", g and round(g / 2**30, 1), "GiB, estimate",
      round(r["estimate_gpu_bytes"] / 2**30, 1), "GiB, step", r.get("step_ms_median"), "ms",
      r.get("error", "")[:200])')"
  done
done
# One archive beside the folder: the device returns a limited number of files.
tar czf "$out.tgz" -C "$out" .
exit 0
