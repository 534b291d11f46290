#!/usr/bin/env bash
# The main job on an embedded default: a local cluster with a real node, the operator and the
# agent installed with the Helm chart from images built here, the examples applied, and the
# decisions shown.
#   hack/demo.sh --keep             leaves it running (prints its KUBECONFIG)
#   hack/demo.sh --out-of-cluster   runs the operator in the demo process (no real node, no images)
#   hack/demo.sh --kueue            installs Kueue first (built from its Go module) and shows a
#                                   queued job waiting for quota, then admitted
#
# One build of the workspace (the dev profile, which the test command reuses) while the upstream
# Go binaries build beside it; the local images are made from that same build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
in_cluster=true
kueue=false
for arg in "$@"; do
  [[ $arg == --out-of-cluster ]] && in_cluster=false
  [[ $arg == --kueue ]] && kueue=true
done
total=3
$in_cluster || total=2
start=$SECONDS
step_start=$SECONDS
step() {
  printf '\n==> [%s/%s] %s\n' "$1" "$total" "$2"
  step_start=$SECONDS
}
took() {
  printf '==> %s took %d s (%d s since the start)\n' "$1" $((SECONDS - step_start)) $((SECONDS - start))
}

cache=$(bash hack/k8s/build.sh --print-dir)
if [[ -x $cache/kube-apiserver ]]; then
  upstream="(cached), and the workspace (a first build: about 10 minutes on 2 cores)"
else
  upstream="and the workspace beside them (first run: about 15 minutes on 2 cores for both)"
fi
step 1 "building the upstream control plane$($in_cluster && echo ' and real node')$($kueue && echo ' and Kueue') from their Go modules $upstream"
# The Go builds print their own progress, a line every 30 s; cargo prints each crate.
(
  bash hack/k8s/build.sh >/dev/null
  if $in_cluster; then
    bash hack/k8s/build.sh node >/dev/null
  fi
  if $kueue; then
    bash hack/k8s/build.sh kueue >/dev/null
  fi
) &
upstream_pid=$!
trap 'kill "$upstream_pid" 2>/dev/null || true' EXIT
cargo build --workspace --bins
if ! wait "$upstream_pid"; then
  echo "error: building the upstream binaries failed (see the [build-tools] lines above)" >&2
  exit 1
fi
trap - EXIT
took "building"

if $in_cluster; then
  step 2 "building the local images from that build (buildah; about 1 minute)"
  bash hack/images.sh --local >/dev/null
  took "the images"
fi

step "$total" "running the demo: a local cluster with a real node, the chart, the examples"
exec target/debug/offload-demo "$@"
