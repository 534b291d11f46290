#!/usr/bin/env bash
# The main job on an embedded default: a local cluster with a real node, the operator and the
# agent installed with the Helm chart from images built here, the examples applied, and the
# decisions shown.
#   hack/demo.sh --keep             leaves it running (prints its KUBECONFIG)
#   hack/demo.sh --out-of-cluster   runs the operator in the demo process (no real node, no images)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
in_cluster=true
for arg in "$@"; do
  [[ $arg == --out-of-cluster ]] && in_cluster=false
done
printf '==> building the control plane (cached after the first run)\n'
bash hack/k8s/build.sh >/dev/null
if $in_cluster; then
  printf '==> building the real node: kubelet, kube-proxy, containerd, CNI plugins (cached after the first run)\n'
  bash hack/k8s/build.sh node >/dev/null
  printf '==> building the images (release binaries, then buildah)\n'
  bash hack/images.sh >/dev/null
fi
printf '==> building offload-operator, offload-agent and offload-demo (every binary of the workspace)\n'
cargo build --workspace --bins
exec target/debug/offload-demo "$@"
