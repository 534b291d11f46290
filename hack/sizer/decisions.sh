#!/usr/bin/env bash
# The first decisions of the traced model beside the counted one's, offline, for DeepSpeed 0.19.8
# ZeRO-3 TrainingJobs (hack/gpu/loop/job-cfg.yaml: one GPU, one micro-batch of TOKENS) of each
# model against a recorded node report (the H100's by default), with each model's trace read
# from TRACES/MODEL-1xTOKENS.json. Prints one Markdown row per case.
#   hack/sizer/decisions.sh [--node REPORT] TRACES MODEL:TOKENS...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
node=docs/benchmarks/raw/2026-12-06-h100-loop/node-report.json
if [[ ${1:-} == --node ]]; then node=$2; shift 2; fi
traces=$1
shift
ops=${OFFLOAD_OPERATOR:-target/debug/offload-operator}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
summary() {
  python3 -c '
import json, sys
e = json.load(sys.stdin)
d = e.get("decision")
if not d:
    print("held: " + e.get("reason", "?"))
    sys.exit()
m = d.get("memory") or {}
z = (e.get("deepspeedConfig") or {}).get("zero_optimization", {})
what = "no offload" if d["mode"] == "Disabled" else (
    "optimizer state and parameters" if "offload_param" in z else
    "%d %% of the optimizer state" % round(100 * d["ratio"]))
print("%s (estimate %.1f of %.1f GiB)" % (what, m.get("gpuBytes", 0) / 2**30, m.get("gpuBudgetBytes", 0) / 2**30))'
}
echo "| model type | micro-batch | counted model's decision | traced model's decision | parameters counted / traced |"
echo "|---|---|---|---|---|"
for case in "$@"; do
  model=${case%%:*} tokens=${case##*:}
  sed "s/tokensPerStep: .*/tokensPerStep: $tokens/" hack/gpu/loop/job-cfg.yaml >"$tmp/job.yaml"
  args=(-f "$tmp/job.yaml" --node-report "gpu=$node" --node-memory gpu=125Gi
    --profile hack/gpu/loop/profile-learn.yaml --deepspeed-config loop-ds=hack/gpu/loop/ds.json
    --model-config "loop-model=hack/gpu/models/new/$model.json" -o json)
  # A held job's explain exits 1: its reason is the row's answer.
  counted=$({ "$ops" explain "${args[@]}" 2>/dev/null || true; } | summary)
  { "$ops" explain "${args[@]}" --trace-file "$traces/$model-1x$tokens.json" 2>/dev/null || true; } >"$tmp/traced.json"
  traced=$(summary <"$tmp/traced.json")
  params=$(python3 -c 'import json,re,sys; e=json.load(sys.stdin); t=" ".join(r.get("message", "") for r in e.get("reasons") or []) + e.get("message", ""); m=re.search(r"(\d+\.\d+)B parameters, 1 ×", t); c=re.search(r"per-type count has (\d+\.\d+)B", t); print("%s / %s B" % (c.group(1) if c else "same", m.group(1) if m else "?"))' <"$tmp/traced.json")
  mt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_type"])' "hack/gpu/models/new/$model.json")
  echo "| $mt ($model) | 1 × $tokens | $counted | $traced | $params |"
done
