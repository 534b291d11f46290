#!/usr/bin/env bash
# The main job on an embedded default: a local control plane, the operator and the agent against
# it, the examples applied, and the decisions shown. `hack/demo.sh --keep` leaves it running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
printf '==> building the control plane (cached after the first run)\n'
bash hack/k8s/build.sh >/dev/null
printf '==> building offload-operator, offload-agent and offload-demo (every binary of the workspace)\n'
cargo build --workspace --bins
exec target/debug/offload-demo "$@"
