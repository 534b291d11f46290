#!/usr/bin/env bash
# The agent on a GPU machine, everything docs/benchmarks/agent-h200.md and observe-h200.md
# report, in one call (device time is scarce):
#   1. `offload-agent probe`;
#   2. 20 consecutive `offload-agent selftest` runs on the idle GPU(s), then the PyTorch peer of
#      exactly the same shape and schedule (hack/gpu/peer_selftest.py), 20 runs;
#   3. a self-test while a process trains on the GPU: postponed; then forced;
#   4. the start-up guard: `offload-agent verify` as configured for this node, and with a
#      unified-memory configuration forced by flag (a mismatch on a discrete GPU);
#   5. `offload-agent observe` beside a synthetic offload loop that times itself
#      (hack/gpu/overlap_truth.py), serial and pipelined, three shapes.
# Usage: hack/gpu/agent-batch.sh AGENT OUT_DIR [RUNS]
# PARTS (default "selftest busy guard observe") and SHAPES (default "4:4 8:2 2:8", GPU:CPU ms per
# chunk) choose what runs.
set -uo pipefail
agent=$1
out=$2
runs=${3:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
parts=${PARTS:-selftest busy guard observe}
shapes=${SHAPES:-4:4 8:2 2:8}
want() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$out"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }

nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$out/summary.txt"
log "cpus: $(nproc), $(uname -r)"
"$agent" probe 2>>"$out/log.txt" | python3 -c "import json,sys; r=json.load(sys.stdin); print('probe:', r['memoryModel'], [(g['name'], g['addressingMode'], g['c2c']['enabled']) for g in r['gpus']], r['nvml'])" | tee -a "$out/summary.txt"

# --- 2. 20 consecutive runs, then the peer --------------------------------------------------
if want selftest; then
: >"$out/selftest.jsonl"
for i in $(seq 1 "$runs"); do
  start=$(date +%s%N)
  "$agent" selftest >"$out/run.json" 2>>"$out/log.txt"
  rc=$?
  wall=$(( ($(date +%s%N) - start) / 1000000 ))
  python3 - "$out/run.json" "$i" "$wall" "$rc" >>"$out/selftest.jsonl" <<'PY'
import json, sys
path, i, wall, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    st = json.load(open(path))["selftest"]
except Exception as e:  # a run that printed nothing usable
    st = {"error": f"unreadable report: {e}"}
print(json.dumps({"run": i, "rc": rc, "wallMs": wall, "selftest": st}))
PY
  tail -1 "$out/selftest.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); s=r["selftest"]; print("run %2d rc=%d wall=%5d ms verdict=%s eff=%s range=%s..%s p/max=%s s/p=%s chunkElems=%s gpus=%d" % (r["run"], r["rc"], r["wallMs"], s.get("verdict"), s.get("efficiency"), s.get("efficiencyMin"), s.get("efficiencyMax"), s.get("pipelinedOverMax"), s.get("serialOverPipelined"), s.get("chunkElems"), max(1, len(s.get("perGpu", [])))))' | tee -a "$out/summary.txt"
done
rm -f "$out/run.json"
elems=$(head -1 "$out/selftest.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["selftest"].get("chunkElems") or 0)')
chunks=$(head -1 "$out/selftest.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["selftest"].get("chunks") or 16)')
if [[ $elems -gt 0 ]]; then
  log "peer: $runs runs of the same shape (K=$chunks, E=$elems)"
  python3 "$here/peer_selftest.py" --chunks "$chunks" --elems "$elems" --repeats 5 --runs "$runs" >"$out/peer.jsonl" 2>>"$out/log.txt"
  log "peer exit $?"
fi
python3 "$here/peer_copy.py" | tee -a "$out/summary.txt"
fi

# --- 3. never over a running job ------------------------------------------------------------
if want busy; then
python3 "$here/overlap_truth.py" --schedule pipelined --gpu-ms 4 --cpu-ms 1 --seconds 25 --warmup 1 >/dev/null 2>&1 &
job=$!
sleep 6
"$agent" selftest >"$out/run.json" 2>>"$out/log.txt"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["selftest"]; print("busy GPU, not forced: verdict=%s postponed=%s efficiency=%s" % (s.get("verdict"), s.get("postponed"), s.get("efficiency")))' "$out/run.json" | tee -a "$out/summary.txt"
"$agent" selftest --force >"$out/run.json" 2>>"$out/log.txt"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["selftest"]; print("busy GPU, --force: verdict=%s efficiency=%s" % (s.get("verdict"), s.get("efficiency")))' "$out/run.json" | tee -a "$out/summary.txt"
kill "$job" 2>/dev/null; wait "$job" 2>/dev/null
rm -f "$out/run.json"
fi

# --- 4. the start-up guard ------------------------------------------------------------------
want guard && {
  echo "\$ offload-agent verify --mode=cpu-copy --node-class=discrete --pin-memory=1"
  "$agent" verify --mode=cpu-copy --node-class=discrete --pin-memory=1 --termination-log /dev/null 2>&1
  echo "exit $?"
  echo "\$ offload-agent verify --mode=unified-memory --node-class=coherent --pin-memory=1   # forced mismatch"
  "$agent" verify --mode=unified-memory --node-class=coherent --pin-memory=1 --termination-log /dev/null 2>&1
  echo "exit $?"
} | tee -a "$out/summary.txt"

# --- 5. observed GPU-busy fraction against the truth ----------------------------------------
want observe && for shape in $shapes; do
  set -- ${shape/:/ }
  for schedule in serial pipelined; do
    python3 "$here/overlap_truth.py" --schedule "$schedule" --gpu-ms "$1" --cpu-ms "$2" --seconds 10 --warmup 2 >"$out/truth.json" 2>>"$out/log.txt" &
    job=$!
    sleep 4   # torch import, calibration and warm-up
    obs=$("$agent" observe --seconds 8 --interval-ms 100 2>>"$out/log.txt")
    wait "$job"
    python3 - "$out/truth.json" "$obs" >>"$out/observe.jsonl" <<'PY'
import json, sys
truth = json.load(open(sys.argv[1]))
obs = json.loads(sys.argv[2])
print(json.dumps({"truth": truth, "observed": obs}))
PY
    tail -1 "$out/observe.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); t=r["truth"]; o=r["observed"][0]; print("observe %-9s gpu %s ms cpu %s ms: truth %.3f observed %.3f (%d samples) diff %+.3f" % (t["schedule"], t["gpuMsPerChunk"], t["cpuMsPerChunk"], t["trueBusyFraction"], o["busyFraction"], o["samples"], o["busyFraction"] - t["trueBusyFraction"]))' | tee -a "$out/summary.txt"
  done
done
rm -f "$out/truth.json"
log "done"
