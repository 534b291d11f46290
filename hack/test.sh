#!/usr/bin/env bash
# Runs every test: the README's first command from this clone as a newcomer meets it, then
# formatting, lints, doc links, the book, unit and property tests, CRD and reference-page drift,
# and the integration tests against a real control plane (built from upstream Go modules on
# first use).
#
# Every test binary `cargo test --workspace` builds runs, each exactly as cargo runs it (from its
# package's directory). The three that need the machine's one real node (containerd, kubelet)
# take it in turn; every other binary runs beside them, one after another: both lines mostly
# wait on control planes, not on the CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }
start=$SECONDS

step "hack/demo.sh: the README's first command, before anything else has built"
bash hack/demo.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc --document-private-items, warnings denied: every doc link resolves"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items

step "shipped source files of at most 650 lines (functions: clippy's too_many_lines, clippy.toml)"
long=$(git ls-files '*.rs' | grep -Ev '(^|/)tests(/|\.rs$)|^crates/testenv/|^vendor/' |
  xargs wc -l | awk '$2 != "total" && $1 > 650 {print $2 " (" $1 " lines)"}')
if [ -n "$long" ]; then
  echo "error: shipped files over 650 lines, split by what they hold: $long" >&2
  exit 1
fi

step "the book (mdBook): built, every internal link checked (mdbook-linkcheck2)"
book_tools=$(bash hack/book/tools.sh)
PATH="$book_tools:$PATH" mdbook build docs

step "the chart's alerts: promtool check rules and promtool test rules (Debian's prometheus package)"
prometheus_bin=$(bash hack/monitoring/prometheus.sh)
# The deploy test runs Prometheus itself against the chart's pods on the real node.
export OFFLOAD_PROMETHEUS_BIN=$prometheus_bin
"$prometheus_bin/promtool" check rules charts/offload-operator/files/alerts.yaml
"$prometheus_bin/promtool" test rules tests/monitoring/alerts_test.yaml

step "the sizer's Python (torch and transformers, cached outside the clone): the sizer's own tests run it"
OFFLOAD_SIZER_PYTHON=$(bash hack/sizer/python.sh)
export OFFLOAD_SIZER_PYTHON OFFLOAD_SIZER_REQUIRED=1
echo "$OFFLOAD_SIZER_PYTHON"

step "cargo test --workspace --no-run: every test binary (unit, property, CRD drift, integration)"
binaries=target/test-binaries.txt
cargo test --workspace --no-run --message-format=json-render-diagnostics |
  python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], os.path.dirname(m["manifest_path"]), m["executable"])
' | sort >"$binaries"
echo "$(wc -l <"$binaries") test binaries"

step "the reference pages against the code, and the longest reason sentence the examples' decisions give"
cargo run -q -p offload-tools --bin offload-reference -- --check

logs=target/test-logs
rm -rf "$logs" && mkdir -p "$logs"
# Runs the binaries named by the lines on stdin, one after another; a failure is recorded and the
# rest still run.
run_line() {
  local line=$1
  local failed=0
  while read -r name dir exe; do
    local t0=$SECONDS
    local status=ok
    if ! (cd "$dir" && "$exe") >"$logs/$name.log" 2>&1; then
      status=FAILED
      echo "$name" >>"$logs/failed"
      failed=1
    fi
    # One write per binary (the two lines print side by side): its line, then the test harness's
    # own count and result lines, as `cargo test` prints them.
    local where=""
    [[ $status == ok ]] || where=" ($logs/$name.log)"
    printf '[%s] %-22s %-7s %4d s%s\n%s\n' "$line" "$name" "$status" $((SECONDS - t0)) "$where" \
      "$(grep -E '^(running [0-9]+ tests?|test result: )' "$logs/$name.log")"
  done
  return $failed
}
real_node='^(kueue|deploy|dra_node) '
step "the real-node tests (one node at a time) beside every other test binary"
grep -E "$real_node" "$binaries" | run_line node &
node_pid=$!
grep -vE "$real_node" "$binaries" | run_line rest || true
wait "$node_pid" || true

step "cargo test --workspace --doc"
cargo test --workspace --doc

if [[ -s $logs/failed ]]; then
  for name in $(cat "$logs/failed"); do
    step "$name failed:"
    tail -n 80 "$logs/$name.log"
  done
  echo "error: $(wc -l <"$logs/failed") test binaries failed: $(tr '\n' ' ' <"$logs/failed")" >&2
  exit 1
fi
grep -h '^test result:' "$logs"/*.log | awk '{p += $4; f += $6; i += $8} END {printf "\nall tests passed: %d passed, %d ignored (%d failed)\n", p, i, f}'
printf '==> hack/test.sh took %d s\n' $((SECONDS - start))
