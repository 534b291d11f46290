#!/usr/bin/env bash
# Runs the fuzz targets of tests/fuzz.rs (admission decoding, node-report parsing, the decision
# engine, GPU quantity sums, observation summaries) for SECONDS each, in a release build, and prints what each ran. The test command runs
# the same targets for a bounded number of inputs.
# Usage: hack/fuzz.sh [SECONDS]   (default 60)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
echo "fuzzing each target for ${seconds} s (release build)"
OFFLOAD_FUZZ_SECONDS=$seconds cargo test --release --test fuzz -- --nocapture --test-threads 1
