#!/usr/bin/env bash
# `offload-agent observe` twice over the same window: GPM activity counters (the default) and
# NVML's sampled utilization (--sampled). Prints one JSON list, GPM's GPUs first. Stands in for
# the agent where a script runs `AGENT observe ...` (hack/gpu/ds_step.py --observe).
#
# Usage: OFFLOAD_AGENT=path/to/offload-agent observe-both.sh observe --seconds S ...
set -uo pipefail
agent=${OFFLOAD_AGENT:?set OFFLOAD_AGENT to the agent binary}
t=$(mktemp -d)
"$agent" "$@" >"$t/gpm" 2>"$t/gpm.err" &
first=$!
"$agent" "$@" --sampled >"$t/sampled" 2>"$t/sampled.err" &
second=$!
wait "$first" "$second"
python3 - "$t" <<'PY'
import json, sys
out = []
for name in ("gpm", "sampled"):
    try:
        out += json.load(open(f"{sys.argv[1]}/{name}"))
    except ValueError:
        out.append({"error": open(f"{sys.argv[1]}/{name}.err").read().strip()})
print(json.dumps(out))
PY
rm -rf "$t"
