#!/usr/bin/env bash
# The same agent checks with two builds of offload-agent, one after the other, on the GPU
# machine: what NVML says (`probe`), five overlap self-tests, the start-up guard as configured
# for this node and with a mismatched expectation, and `observe -- COMMAND` of a short process.
# For a change that must not change behaviour: the two builds' outputs side by side.
# Usage: hack/gpu/agent-same.sh OUT_DIR NAME=AGENT [NAME=AGENT ...]
set -uo pipefail
out=$1
shift
mkdir -p "$out"
for pair in "$@"; do
  name=${pair%%=*}
  agent=${pair#*=}
  d="$out/$name"
  mkdir -p "$d"
  echo "== $name: $agent" | tee -a "$out/summary.txt"
  "$agent" probe >"$d/probe.json" 2>>"$d/log.txt"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('probe:', r['memoryModel'], [(g['name'], g['addressingMode'], g['c2c']['enabled'], g['memoryTotalBytes']) for g in r['gpus']])" "$d/probe.json" | tee -a "$out/summary.txt"
  for i in 1 2 3 4 5; do
    "$agent" selftest >"$d/selftest-$i.json" 2>>"$d/log.txt"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r.get('selftest') or r; print('selftest:', json.dumps({k: s.get(k) for k in ('verdict','efficiency','overlap')}))" "$d/selftest-$i.json" 2>&1 | tee -a "$out/summary.txt"
  done
  "$agent" verify --mode=cpu-copy --node-class=discrete --pin-memory=1 --termination-log /dev/null >"$d/verify-ok.txt" 2>&1
  echo "verify as configured: exit $?" | tee -a "$out/summary.txt"
  "$agent" verify --mode=unified-memory --node-class=coherent --pin-memory=1 --termination-log /dev/null >"$d/verify-mismatch.txt" 2>&1
  echo "verify mismatched: exit $? ($(head -c 160 "$d/verify-mismatch.txt" | tr '\n' ' '))" | tee -a "$out/summary.txt"
  "$agent" observe --seconds 3 --interval-ms 100 -- sleep 2 >"$d/observe.json" 2>>"$d/log.txt"
  echo "observe -- sleep 2: exit $? ($(head -c 200 "$d/observe.json" | tr '\n' ' '))" | tee -a "$out/summary.txt"
done
