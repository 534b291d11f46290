#!/usr/bin/env bash
# The closed loop on the GPU node, end to end with the real agent and operator binaries
# (docs/benchmarks/closed-loop-h200.md):
#   1. this node's report from the agent's own NVML code (`offload-agent probe`);
#   2. per case, the operator's decision for a TrainingJob that gives no model hints
#      (`offload-operator explain` against that report, with the case's profile), its DeepSpeed
#      JSON as the pods would get it;
#   3. that configuration trained (hack/gpu/hf_step.py) under `offload-agent observe -- …`,
#      whose JSON (the GPU and host peaks, how the run ended, its last lines) is the evidence;
#   4. `explain --observed` with every run so far gives the next decision; repeated until a
#      decision repeats a configuration that trained, or the case's runs are spent.
# Usage: hack/gpu/closed-loop.sh OPERATOR AGENT OUT DEADLINE_S CASE...
# A CASE is NAME:PROFILE:MODEL:PHASES[:MAX_RUNS] — the job hack/gpu/loop/job-NAME.yaml, the
# profile hack/gpu/loop/profile-PROFILE.yaml, the model hack/gpu/models/MODEL.json trained with
# PHASES (micro-batch x sequence).
set -uo pipefail
ops=$1 agent=$2 out=$3 deadline=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
start=$SECONDS
# shellcheck source=hack/gpu/common.sh
source "$here/common.sh"
gpu_python || exit 1
# This bench's log is loop.txt.
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/loop.txt"; }

node=$(node_report "$agent")
log "node report: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["node"], r["memoryModel"], [g["name"] + " " + str(g["memoryTotalBytes"]) for g in r["gpus"]])' "$node")"
hostmem=$(host_memory)

for case in "$@"; do
  IFS=: read -r name profile model phases max <<<"$case"
  max=${max:-3}
  # A model under a folder of hack/gpu/models (new/nemotron-4b) is named by its file alone.
  stem=${model##*/}
  observed=()
  declare -A trained=()
  for k in $(seq 1 "$max"); do
    if ((SECONDS - start > deadline)); then
      log "$name: deadline reached before run $k"
      break
    fi
    decision=$out/$name-$stem-decision-$k.json
    # The job's tokensPerStep is the case's micro-batch × sequence (one GPU, no accumulation).
    IFS=x read -r micro seq <<<"${phases%%,*}"
    job=$out/job-$name-$stem.yaml
    sed "s/tokensPerStep: .*/tokensPerStep: $((micro * seq))/" "$here/loop/job-$name.yaml" >"$job"
    args=(-f "$job" --node-report "h200=$node" --node-memory "h200=$hostmem"
      --profile "$here/loop/profile-$profile.yaml" --deepspeed-config "loop-ds=$here/loop/ds.json")
    # A job that names the model's config.json (ConfigMap loop-model) gets the case's model.
    grep -q loop-model "$job" && args+=(--model-config "loop-model=$here/models/$model.json")
    "$ops" explain "${args[@]}" "${observed[@]}" -o json >"$decision" 2>>"$out/explain.log"
    "$ops" explain "${args[@]}" "${observed[@]}" >"$out/$name-$stem-decision-$k.txt" 2>&1
    summary=$(python3 - "$decision" "$out/$name-$stem-ds-$k.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
json.dump(e["deepspeedConfig"], open(sys.argv[2], "w"))
d = e["decision"]
z = e["deepspeedConfig"]["zero_optimization"]
opt = z.get("offload_optimizer", {})
par = z.get("offload_param", {})
print("mode=%s ratio=%s offload_optimizer=%s%s offload_param=%s" % (
    d["mode"], d["ratio"], opt.get("device", "none"),
    ("(ratio %s)" % opt["ratio"]) if "ratio" in opt else "", par.get("device", "none")))
EOF
)
    if [[ -z $summary ]]; then
      # No configuration (a held job): its reason is the result; nothing is trained.
      log "$name $model decision $k: none — $(head -c 600 "$out/$name-$stem-decision-$k.txt")"
      break
    fi
    log "$name $model decision $k: $summary"
    if [[ -n ${trained[$summary]:-} ]]; then
      log "$name: decision $k repeats the configuration that trained in run ${trained[$summary]}: the loop is done"
      break
    fi
    run=$out/$name-$stem-run-$k.json
    # A profile that asks for the allocator's figures: the operator's reporter (the
    # sitecustomize.py it renders beside the config) on the run's PYTHONPATH, as in a pod.
    pypath=/tmp/site
    if grep -q "reportAllocatorPeaks: true" "$here/loop/profile-$profile.yaml"; then
      mkdir -p "$out/reporter" && cp "$root/src/render/memory_report.py" "$out/reporter/sitecustomize.py"
      pypath=$out/reporter:/tmp/site
    fi
    # The decision's rendered variables in the run's environment, as a pod has them: the agent
    # records the configuration the run was given (OFFLOAD_MODE, OFFLOAD_RATIO, …).
    mapfile -t runenv < <(python3 -c '
import json, sys
for v in json.load(open(sys.argv[1])).get("env", []):
    if v.get("name", "").startswith("OFFLOAD_") and "value" in v:
        print("%s=%s" % (v["name"], v["value"]))' "$decision")
    env "${runenv[@]}" PYTHONPATH=$pypath "$agent" observe --interval-ms 100 --out "$run" -- \
      python3 "$here/hf_step.py" --config "$out/$name-$stem-ds-$k.json" --model "$here/models/$model.json" \
      --phases "$phases" --steps "${STEPS:-6}" --label "$name $model run $k" 2>"$out/$name-$stem-run-$k.log"
    grep '^{' "$out/$name-$stem-run-$k.log" | tail -1 >"$out/$name-$stem-step-$k.json"
    log "$name $model run $k: $(python3 - "$run" "$out/$name-$stem-step-$k.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["pod"]
try:
    s = json.load(open(sys.argv[2]))
except Exception:
    s = {}
g = lambda b: "%.1f GiB" % (b / 2**30) if isinstance(b, (int, float)) else "-"
t = p.get("stepSeconds")
print("exit %s after %.0f s; NVML GPU peak %s of %s, host peak %s (%s); step median %s ms (the reporter: %s); torch peak allocated %s (the reporter: %s)" % (
    r.get("exitCode", "signal %s" % r.get("signal")), r["seconds"], g(p.get("gpuMemoryPeakBytes")),
    g(p.get("gpuMemoryTotalBytes")), g(p.get("hostMemoryPeakBytes")), p.get("hostMemorySource"),
    s.get("medianMs", "-"), "%.0f ms" % (t * 1000) if isinstance(t, (int, float)) else "-",
    g(s.get("peakGpuBytes")), g(p.get("allocatorPeakBytes"))))
EOF
)"
    observed+=(--observed "$run")
    ok=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("exitCode"))' "$run")
    [[ $ok == 0 ]] && trained[$summary]=$k
  done
done
tar czf "$out/ext.tgz" -C /tmp/torch-ext . 2>/dev/null
# Everything but the built ops in one file (what comes back from the node is counted by files).
tar czf "$out.tgz" --exclude ext.tgz -C "$out" .
exit 0
