#!/usr/bin/env bash
# The memory model against what training measures (docs/benchmarks/memory-h200.md), in two steps:
#   hack/gpu/memory-bench.sh render OPERATOR OUT [SIZE...]   here: for each model size, a
#       TrainingJob with model hints and its DeepSpeed config go through
#       `offload-operator explain --candidates -o json` against the recorded H200 report and the
#       node's host memory (NODE_MEMORY, default 125Gi); every placement it sizes (the choice,
#       no offload, a partial share, the optimizer state, optimizer state and parameters) is
#       written to OUT/SIZE-LABEL.json, with the estimate, into OUT/plan.tsv;
#   hack/gpu/memory-bench.sh run OUT [SIZE...]               on the GPU node: each planned
#       configuration trains in its own process (hack/gpu/memory_sweep.py, hack/gpu/ds_step.py);
#       the peaks and step times go to OUT/measured/memory.jsonl.
# Sizes: 1b 4b 6b 9b 13b (the decoder of hack/gpu/ds_step.py: hidden 2048/3072/4096/4096/5120,
# 20/32/32/44/40 layers, vocabulary 32000; micro-batch 4 x 512 tokens, bf16, ZeRO-3, AdamW).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
step=$1
shift

shape() {
  case $1 in
    1b) echo "2048 20" ;; 4b) echo "3072 32" ;; 6b) echo "4096 32" ;; 9b) echo "4096 44" ;;
    13b) echo "5120 40" ;; *) echo "unknown size $1" >&2; return 1 ;;
  esac
}

if [[ $step == render ]]; then
  ops=$1 out=$2
  shift 2
  sizes=${*:-1b 4b 6b 9b 13b}
  mkdir -p "$out"
  printf 'size\tlabel\tfile\tfits\tgpuBytes\tgpuBudgetBytes\thostBytesPerPod\thostBudgetBytes\tplacement\tchosen\n' >"$out/plan.tsv"
  cat >"$out/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "weight_decay": 0.0}},
 "steps_per_print": 1000000, "zero_optimization": {"stage": 3}}
JSON
  for size in $sizes; do
    read -r h layers < <(shape "$size") || exit 1
    # The decoder's exact parameter count: embedding and head, 12h^2 + 13h per block, a norm.
    params=$(( 2 * 32000 * h + layers * (12 * h * h + 13 * h) + 2 * h ))
    cat >"$out/$size-job.yaml" <<YAML
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: bench-$size, namespace: default, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  deepspeed: {configMapRef: {name: bench-ds}}
  model: {parameters: $params, tokensPerStep: 2048, architecture: GPT, hiddenSize: $h, layers: $layers, intermediateSize: $((4 * h)), attentionHeads: $((h / 128)), vocabSize: 32000, rotaryEmbeddings: false}
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: train:1
          resources: {limits: {nvidia.com/gpu: 1}}
YAML
    "$ops" explain -f "$out/$size-job.yaml" \
      --node-report "h200=$root/crates/testenv/fixtures/node-report-h200.json" \
      --node-memory "h200=${NODE_MEMORY:-125Gi}" \
      --deepspeed-config "bench-ds=$out/ds.json" --candidates -o json >"$out/$size-explain.json"
    echo "$size ($params parameters): explain exit $? (1 when the job is held)"
    python3 - "$out" "$size" <<'PY'
import json, sys
out, size = sys.argv[1], sys.argv[2]
e = json.load(open(f"{out}/{size}-explain.json"))
print("  decision:", e.get("reason") or "", e.get("message", "")[:300])
seen = {}
with open(f"{out}/plan.tsv", "a") as plan:
    for c in e.get("candidates", []):
        if c["label"] not in ("chosen", "no_offload", "partial", "offload_optimizer", "offload_optimizer+param"):
            continue
        cfg, m = c.get("deepspeedConfig"), c.get("memory") or {}
        if not cfg:
            continue
        key = json.dumps(cfg["zero_optimization"], sort_keys=True)
        if key in seen:
            print(f"  {c['label']}: the same configuration as {seen[key]}")
            continue
        seen[key] = c["label"]
        path = f"{out}/{size}-{c['label']}.json"
        json.dump(cfg, open(path, "w"))
        row = [size, c["label"], path.rsplit("/", 1)[1], str(m.get("fits", "")).lower(), m.get("gpuBytes", ""),
               m.get("gpuBudgetBytes", ""), m.get("hostBytesPerPod", ""), m.get("hostBudgetBytes", ""),
               m.get("placement", ""), str(c["label"] == "chosen").lower()]
        plan.write("\t".join(str(x) for x in row) + "\n")
        print(f"  {c['label']}: {m.get('placement')} fits={m.get('fits')} -> {path}")
PY
  done
  exit 0
fi

if [[ $step == run ]]; then
  out=$1
  shift
  want=" ${*:-1b 4b 6b 9b 13b} "
  # What the memory model says fits first; what it says cannot run last (the host's OOM
  # killer takes a while), so a deadline cuts those.
  fitting=() refused=()
  while IFS=$'\t' read -r size label file fits _; do
    [[ $size == size || $want != *" $size "* ]] && continue
    if [[ $fits == false ]]; then
      refused+=("$size:@$out/$file#$label")
    else
      fitting+=("$size:@$out/$file#$label")
    fi
  done <"$out/plan.tsv"
  runs=("${fitting[@]}" "${refused[@]}")
  mkdir -p "$out/measured"
  python3 "$here/memory_sweep.py" --out "$out/measured" --deadline-s "${DEADLINE_S:-560}" "${runs[@]}"
  exit 0
fi
echo "usage: hack/gpu/memory-bench.sh render OPERATOR OUT [SIZE...] | run OUT [SIZE...]" >&2
exit 2
