#!/usr/bin/env bash
# The operator's DeepSpeed decision against every alternative it could render, measured on this
# GPU node (docs/benchmarks/decision-h200.md):
#   1. this node's own agent report (`offload-agent selftest`), as the operator reads it;
#   2. for each case, a TrainingJob and its DeepSpeed config, rendered by
#      `offload-operator explain --candidates` against that report: the choice and each knob
#      flipped on its own (pin_memory, offload_param, super_offload, zenflow);
#   3. every candidate trained in its own process (hack/gpu/ds_step.py), one model size per case;
#      with --observe, the agent's observed GPU-busy fraction beside the profiler's truth.
# Cases: small-z3, large-z3, large-z2 (model size and ZeRO stage).
# Usage: hack/gpu/decision-bench.sh OPERATOR AGENT OUT_DIR [--observe] CASE...
# ONLY="chosen offload_param=on" runs only the candidates of those labels; NODE_REPORT=FILE uses
# a report recorded earlier instead of measuring the node again.
set -uo pipefail
ops=$1 agent=$2 out=$3
shift 3
observe=()
if [[ ${1:-} == --observe ]]; then
  observe=(--observe "$agent" --observe-seconds 6)
  shift
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
mkdir -p "$out"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/decision.txt"; }

node=$out/node-report.json
if [[ -n ${NODE_REPORT:-} ]]; then
  cp "$NODE_REPORT" "$node"
  log "node report: $NODE_REPORT (recorded on this node earlier)"
elif [[ ! -s $node ]]; then
  # NVML's utilization covers the last sample period: let a previous GPU user's tail pass, or
  # the self-test is (rightly) postponed.
  sleep 3
  "$agent" selftest >"$node" 2>>"$out/log.txt"
  log "node report: exit $?"
fi
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); s=r["selftest"]; print("node %s: %s, overlap %s (efficiency %s), pinned %s" % (r["node"], r["memoryModel"], s["verdict"], s.get("efficiency"), s.get("pinnedMemory")))' "$node" | tee -a "$out/decision.txt"

for case in "$@"; do
  size=${case%%-*}
  stage=${case##*-z}
  cat >"$work/tj.yaml" <<YAML
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: bench-$case, namespace: default, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  deepspeed: {zeroStage: $stage, configMapRef: {name: bench-ds}}
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: train:1
          resources: {limits: {nvidia.com/gpu: 1}}
YAML
  cat >"$work/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "weight_decay": 0.0}},
 "steps_per_print": 1000000, "zero_optimization": {"stage": $stage}}
JSON
  "$ops" explain -f "$work/tj.yaml" --node-report "$node" --deepspeed-config "bench-ds=$work/ds.json" --candidates -o json >"$work/cands.json" 2>>"$out/log.txt"
  log "$case: explain exit $?"
  python3 - "$work/cands.json" "$work" 2>>"$out/decision.txt" <<'PY' | while IFS=$'\t' read -r label cfg same; do
import json, os, sys
e = json.load(open(sys.argv[1]))
only = os.environ.get("ONLY", "").split()
print("decision:", e.get("message"), file=sys.stderr)
for i, c in enumerate(e.get("candidates", [])):
    if c.get("refused") or not c.get("deepspeedConfig"):
        print(f"  {c['label']}: not written ({c.get('refused')})", file=sys.stderr)
        continue
    if only and c["label"] not in only:
        continue
    path = f"{sys.argv[2]}/cand-{i}.json"
    json.dump(c["deepspeedConfig"], open(path, "w"))
    print(f"{c['label']}\t{path}\t{c['sameSemantics']}")
PY
    python3 "$here/ds_step.py" --config "$cfg" --size "$size" --label "$case $label" "${observe[@]}" </dev/null >>"$out/decision.jsonl" 2>>"$out/log.txt"
    tail -1 "$out/decision.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); o=r.get("observation") or {}; ob=(o.get("observed") or [{}])[0]; print("%-26s %s median %s ms steps %s peak %s MiB%s%s" % (r["label"], "ok " if r.get("ok") else "ERR", r.get("medianMs"), r.get("stepsMs"), r.get("peakGpuMiB"), (" | busy truth %.3f kernel-time %.3f observed %.3f (%s kernels)" % (o["trueBusyFraction"], o.get("kernelTimeFraction") or -1, ob.get("busyFraction", -1), o.get("kernels"))) if o else "", "" if r.get("ok") else " " + r.get("error", "")))' | tee -a "$out/decision.txt"
  done
done
rm -rf "$work"
log "done"
