#!/usr/bin/env bash
# The CPU a pod really gets, on the GPU node (docs/benchmarks/cpu-h200.md): per CPU limit, the
# operator's decision for a DeepSpeed job whose training container has that limit
# (`offload-operator explain`: the offload share, overlap, and the OMP_NUM_THREADS it renders),
# that configuration trained (hack/gpu/hf_step.py) with the training process held to that many
# cores — a CFS quota in a cgroup of its own where this machine lets one be made, and a cpuset
# (taskset) of that many cores unless CPUSET=0 (the quota alone, as a pod without the static CPU
# manager gets it) — once with the threads as rendered and once with
# DeepSpeed's default (no OMP_NUM_THREADS: a thread per visible core); and the decision of the
# unlimited job run under the same limit, so the step times say whether each limit's decision is
# the faster one there.
# Usage: hack/gpu/cpu-bench.sh OPERATOR AGENT OUT DEADLINE_S MODEL PHASES CORES...
#   MODEL a file of hack/gpu/models (without .json); PHASES micro-batch x sequence; CORES the
#   limits to try (e.g. 16 8 4 2).
# Leaves OUT/cpu.jsonl (one object a run), OUT/log.txt and the decisions.
set -uo pipefail
ops=$1 agent=$2 out=$3 deadline=$4 model=$5 phases=$6
shift 6
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
start=$SECONDS
# shellcheck source=hack/gpu/common.sh
source "$here/common.sh"
gpu_python || exit 1
log "cores: $(nproc); $(lscpu 2>/dev/null | grep -E '^(Model name|NUMA node\(s\))' | tr -s ' ' | paste -sd';')"

node=$(node_report "$agent")
hostmem=$(host_memory)
IFS=x read -r micro seq <<<"${phases%%,*}"

# A cgroup with a CFS quota of N cores for the run, where this machine lets one be made: cgroup
# v2 (`cpu.max`) or v1's cpu controller (`cpu.cfs_quota_us`). Prints the cgroup's procs file, or
# nothing.
quota_cgroup() { # N
  local v2=/sys/fs/cgroup v1=/sys/fs/cgroup/cpu cg
  if [[ $(stat -fc %T $v2 2>/dev/null) == cgroup2fs ]]; then
    cg=$v2/offload-cpu-bench-$1
    mkdir -p "$cg" 2>/dev/null && echo "$(($1 * 100000)) 100000" >"$cg/cpu.max" 2>/dev/null &&
      echo "$cg/cgroup.procs"
  elif [[ $(stat -fc %T $v1 2>/dev/null) == cgroupfs ]]; then
    cg=$v1/offload-cpu-bench-$1
    mkdir -p "$cg" 2>/dev/null && echo 100000 >"$cg/cpu.cfs_period_us" 2>/dev/null &&
      echo "$(($1 * 100000))" >"$cg/cpu.cfs_quota_us" 2>/dev/null && echo "$cg/cgroup.procs"
  fi
}

# The decision for the job with a CPU limit of N cores ("" for none): writes OUT/decision-N.json
# and the DeepSpeed JSON, prints "RATIO OVERLAP THREADS".
decide() { # N
  local tag=${1:-none} job=$out/job-${1:-none}.yaml
  python3 - "$here/loop/job-cfg.yaml" "$job" "$((micro * seq))" "${1:-}" <<'EOF'
import sys
text = open(sys.argv[1]).read().replace("tokensPerStep: 4096", "tokensPerStep: " + sys.argv[3])
if sys.argv[4]:
    n = sys.argv[4]
    text = text.replace("              nvidia.com/gpu: 1",
                        "              nvidia.com/gpu: 1\n              cpu: \"%s\"\n"
                        "            requests:\n              cpu: \"%s\"" % (n, n))
open(sys.argv[2], "w").write(text)
EOF
  "$ops" explain -f "$job" --node-report "h200=$node" --node-memory "h200=$hostmem" \
    --node-cpus "h200=$(nproc)" --profile "$here/loop/profile-learn.yaml" \
    --deepspeed-config "loop-ds=$here/loop/ds.json" \
    --model-config "loop-model=$here/models/$model.json" -o json >"$out/decision-$tag.json" \
    2>>"$out/explain.log"
  "$ops" explain -f "$job" --node-report "h200=$node" --node-memory "h200=$hostmem" \
    --node-cpus "h200=$(nproc)" --profile "$here/loop/profile-learn.yaml" \
    --deepspeed-config "loop-ds=$here/loop/ds.json" \
    --model-config "loop-model=$here/models/$model.json" >"$out/decision-$tag.txt" 2>&1
  python3 - "$out/decision-$tag.json" "$out/ds-$tag.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
if not e.get("resolved") or "deepspeedConfig" not in e:
    print("- - -", file=sys.stdout)
    print("not decided: " + e.get("message", "")[:300], file=sys.stderr)
    sys.exit(0)
json.dump(e["deepspeedConfig"], open(sys.argv[2], "w"))
c = e["object"]["spec"]["template"]["spec"]["containers"][0]
env = {x["name"]: x.get("value", "") for x in e.get("env", []) + c.get("env", [])}
d = e["decision"]
print(d["ratio"], str(d["overlap"]).lower(), env.get("OMP_NUM_THREADS", "-"))
EOF
}

run() { # LABEL CORES DS THREADS(- for DeepSpeed's default)
  local label=$1 n=$2 ds=$3 threads=$4 cg
  if ((SECONDS - start > deadline)); then
    log "$label: deadline reached"
    echo "{\"label\": \"$label\", \"skipped\": true}" >>"$out/cpu.jsonl"
    return
  fi
  cg=$(quota_cgroup "$n")
  local env=(env -u OMP_NUM_THREADS)
  [[ $threads != - ]] && env=(env OMP_NUM_THREADS="$threads")
  # CPUSET=0: the quota alone, every core visible (a pod without the static CPU manager).
  local pin=(taskset -c "0-$((n - 1))")
  [[ ${CPUSET:-1} == 0 ]] && pin=()
  local result
  result=$(bash -c '[[ -n $1 ]] && echo $$ >"$1"; shift; exec "$@"' _ "$cg" \
    "${env[@]}" "${pin[@]}" python3 "$here/hf_step.py" --config "$ds" \
    --model "$here/models/$model.json" --phases "$phases" --steps "${STEPS:-6}" \
    --label "$label" 2>"$out/$label.log" | grep '^{' | tail -1)
  [[ -z $result ]] && result='{"ended": "no output"}'
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
r.update({"label": sys.argv[2], "cores": int(sys.argv[3]), "quota": bool(sys.argv[4]),
          "omp_num_threads": sys.argv[5], "config": sys.argv[6]})
r["cpuset"] = sys.argv[7] != "0"
print(json.dumps(r))' "$result" "$label" "$n" "$cg" "$threads" "$(basename "$ds")" "${CPUSET:-1}" >>"$out/cpu.jsonl"
  log "$label: $(tail -1 "$out/cpu.jsonl" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print(("quota" if r["quota"] else "no quota") + (" + cpuset" if r["cpuset"] else ", every core visible"), "median", r.get("medianMs"), "ms", r.get("error", "")[:160])')"
}

read -r r0 o0 t0 <<<"$(decide "")"
log "no CPU limit: ratio $r0, overlap $o0, threads $t0"
for n in "$@"; do
  read -r r o t <<<"$(decide "$n")"
  log "limit $n cores: ratio $r, overlap $o, OMP_NUM_THREADS $t"
  [[ $r == - ]] && continue
  run "limit-$n-rendered" "$n" "$out/ds-$n.json" "$t"
  run "limit-$n-default-threads" "$n" "$out/ds-$n.json" -
  [[ $r != "$r0" || $o != "$o0" ]] && run "limit-$n-unlimited-decision" "$n" "$out/ds-none.json" "$t"
done
rmdir /sys/fs/cgroup/offload-cpu-bench-* /sys/fs/cgroup/cpu/offload-cpu-bench-* 2>/dev/null
tar czf "$out/ext.tgz" -C /tmp/torch-ext . 2>/dev/null
# One archive beside the folder: the device returns a limited number of files.
tar czf "$out.tgz" --exclude ext.tgz -C "$out" .
exit 0
