#!/usr/bin/env bash
# The traced memory model against real training on this GPU node (docs/benchmarks/memory-traced.md):
#   1. this node's report from the agent's own NVML code (`offload-agent probe`);
#   2. per case, the operator's first decision for a DeepSpeed ZeRO-3 TrainingJob that gives its
#      model's config.json and tokens per step (`offload-operator explain --trace`: the sizer
#      this release ships, run here with this node's torch and transformers), and the counted
#      model's decision beside it (`explain` without `--trace`);
#   3. the decision trained (hack/gpu/hf_sweep.py: random weights, bf16, AdamW, the decided
#      DeepSpeed JSON), then the next faster share (FASTER hundredths less offloaded; `none`
#      where that is no offload at all).
# Usage: hack/gpu/sizer-proof.sh OPERATOR AGENT OUT DEADLINE_S CASE...
# A CASE is MODEL:TOKENS[:FASTER[:OPTIONS]] — hack/gpu/models/MODEL.json at one micro-batch of
# TOKENS, the faster share FASTER hundredths below the decision (default 5), hf_sweep OPTIONS
# (`attn=default` for a type that refuses SDPA).
set -uo pipefail
ops=$1 agent=$2 out=$3 deadline=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$SECONDS
# shellcheck source=hack/gpu/common.sh
source "$here/common.sh"
gpu_python || exit 1
node=$(node_report "$agent")
hostmem=$(host_memory)
log "node: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["node"], [g["name"] + " " + str(g["memoryTotalBytes"]) for g in r["gpus"]])' "$node"), host $hostmem"
python3 -c 'import torch, transformers, deepspeed; print("torch", torch.__version__, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__)' 2>&1 | grep -v Warn | tee -a "$out/log.txt"

for case in "$@"; do
  IFS=: read -r model tokens faster options <<<"$case"
  faster=${faster:-5}
  name=${model##*/}
  left=$((deadline - (SECONDS - start)))
  if ((left < 60)); then
    log "$name: skipped, ${left}s left"
    continue
  fi
  job=$out/job-$name.yaml
  sed "s/tokensPerStep: .*/tokensPerStep: $tokens/" "$here/loop/job-cfg.yaml" >"$job"
  args=(-f "$job" --node-report "gpu=$node" --node-memory "gpu=$hostmem"
    --profile "$here/loop/profile-learn.yaml" --deepspeed-config "loop-ds=$here/loop/ds.json"
    --model-config "loop-model=$here/models/$model.json")
  "$ops" explain "${args[@]}" --trace -o json >"$out/$name-traced.json" 2>>"$out/explain.log"
  "$ops" explain "${args[@]}" --trace >"$out/$name-traced.txt" 2>&1
  "$ops" explain "${args[@]}" -o json >"$out/$name-counted.json" 2>>"$out/explain.log"
  read -r ratio group counted < <(python3 - "$out/$name-traced.json" "$out/$name-counted.json" "$out/$name-ds.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
c = json.load(open(sys.argv[2]))
ds = e.get("deepspeedConfig")
if ds:
    json.dump(ds, open(sys.argv[3], "w"))
z = (ds or {}).get("zero_optimization", {})
opt = z.get("offload_optimizer", {})
ratio = opt.get("ratio", 1.0 if opt.get("device") == "cpu" else 0.0) if ds else -1
cd = c.get("decision") or {}
print(ratio, z.get("sub_group_size", 0), "%s/%s" % (cd.get("mode"), cd.get("ratio")))
EOF
)
  log "$name at $tokens tokens: traced decision ratio $ratio (sub-group $group); counted model's: $counted"
  if [[ $ratio == -1 ]]; then
    log "$name: held, nothing trained — $(head -c 400 "$out/$name-traced.txt")"
    continue
  fi
  runs=("$model:@$out/$name-ds.json#decision:1x$tokens:steps=${STEPS:-5}${options:++$options}")
  below=$(python3 -c "r=float('$ratio'); f=int('$faster'); g='$group'; print('none' if r <= f / 100 + 1e-9 else 'ratio=%.2f%s' % (r - f / 100, '/' + g if g not in ('0', '') else ''))")
  [[ $ratio != 0 && $ratio != 0.0 ]] && runs+=("$model:$below:1x$tokens:steps=${STEPS:-5}${options:++$options}")
  left=$((deadline - (SECONDS - start)))
  python3 "$here/hf_sweep.py" --out "$out" --deadline-s "$left" "${runs[@]}" 2>&1 | tee -a "$out/log.txt"
done
exit 0
