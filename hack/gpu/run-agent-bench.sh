#!/usr/bin/env bash
# Runs the agent on a GPU machine and collects what docs/benchmarks/agent-h200.md reports.
# Usage: hack/gpu/run-agent-bench.sh AGENT_BINARY OUT_DIR
set -uo pipefail
agent=$1; out=$2
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$out/nvidia-smi.csv"
nproc | tee "$out/nproc.txt"
"$agent" probe > "$out/probe.json"; echo "probe exit $?"
for variant in default default2 k8 pageable serial; do
  case $variant in
    default|default2) flags=() ;;
    k8) flags=(--chunks 8 --chunk-mi 8) ;;
    pageable) flags=(--force-pageable) ;;
    serial) flags=(--force-serial) ;;
  esac
  start=$(date +%s%N)
  "$agent" selftest "${flags[@]}" > "$out/selftest-$variant.json"
  echo "selftest $variant exit $? wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
python3 hack/gpu/peer_copy.py > "$out/peer-copy.json"; echo "peer exit $?"
python3 - "$out" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
for v in ("default", "default2", "k8", "pageable", "serial"):
    s = json.loads((d / f"selftest-{v}.json").read_text())["selftest"]
    print(v, s["verdict"], "eff=%s" % s.get("efficiency"), "t_gpu=%.1f t_cpu=%.1f serial=%.1f pipe=%.1f" % (s.get("tGpuMs", 0), s.get("tCpuMs", 0), s.get("tSerialMs", 0), s.get("tPipelinedMs", 0)), "bw=%s" % s.get("bandwidth"), "dur=%.0f ms" % s.get("durationMs", 0), "err=%s" % s.get("error"))
p = json.loads((d / "probe.json").read_text())
print("probe", p["memoryModel"], [(g["name"], g["addressingMode"], g["c2c"]) for g in p["gpus"]], p["nvml"])
print("peer", (d / "peer-copy.json").read_text())
PY
