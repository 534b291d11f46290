#!/usr/bin/env bash
# Records NVML device-utilization traces of the synthetic offload step (overlap_truth.py) on a
# GPU machine, serial and pipelined, with each run's ground truth and its CPU use: the recorded
# trace the local real node's agent replays (crates/testenv/fixtures/utilization-trace-h200.json)
# and figures for docs/benchmarks/observe-h200.md.
#
# With OFFLOAD_AGENT set, the agent observes each run too (hack/gpu/observe-both.sh: GPM
# counters and sampled utilization).
#
# Usage (on the GPU machine, from the repository root): [OFFLOAD_AGENT=…] hack/gpu/record-trace.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: record-trace.sh OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for shape in "4 4" "8 2" "2 8"; do
  set -- $shape
  for schedule in serial pipelined; do
    name="$schedule-$1-$2"
    python3 "$here/overlap_truth.py" --schedule "$schedule" --gpu-ms "$1" --cpu-ms "$2" \
      --seconds 14 --warmup 3 >"$out/$name.truth.json" 2>"$out/$name.truth.err" &
    pid=$!
    sleep 4   # torch import, calibration, warm-up
    if [[ -n ${OFFLOAD_AGENT:-} ]]; then
      # The agent itself, GPM counters and sampling side by side.
      "$here/observe-both.sh" observe --seconds 8 --interval-ms 100 >"$out/$name.agent.json" &
      both=$!
    fi
    python3 "$here/nvml_sampler.py" observe --seconds 8 --interval-ms 100 --samples --pid "$pid" \
      >"$out/$name.observed.json"
    [[ -n ${OFFLOAD_AGENT:-} ]] && wait "$both"
    wait "$pid"
    python3 - "$out/$name.truth.json" "$out/$name.observed.json" "$out/$name.agent.json" <<'PY'
import json, os, sys
t = json.load(open(sys.argv[1])); o = json.load(open(sys.argv[2]))[0]
agent = ""
if os.path.exists(sys.argv[3]):
    a = json.load(open(sys.argv[3]))
    agent = " | agent " + " ".join(f"{g.get('method', 'error')} {g.get('busyFraction', g.get('error'))}" for g in a)
print(f"{t['schedule']:9} gpu {t['gpuMsPerChunk']:.0f} cpu {t['cpuMsPerChunk']:.0f}: truth {t['trueBusyFraction']:.3f} nvml {o['busyFraction']:.3f} samples {o['samples']} process cpu {o['processCpuCores']:.2f} cores{agent}")
PY
  done
done | tee "$out/summary.txt"
