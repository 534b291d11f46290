#!/usr/bin/env bash
# Builds the upstream control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, helm, kwok) from their Go modules and caches them outside the
# clone, keyed by version, so that later runs and CI on the same machine reuse them.
#
# Usage: hack/k8s/build.sh            # builds what is missing, prints the bin directory last
#        hack/k8s/build.sh --print-dir  # prints the bin directory without building
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/versions.env"

cache_root=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}
bin_dir="$cache_root/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}-helm-v${HELM_VERSION}-kwok-v${KWOK_VERSION}/bin"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$bin_dir"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is not installed. The local control plane is built from upstream Go modules;" >&2
  echo "       install Go 1.26 or newer (https://go.dev/doc/install) and run this again." >&2
  exit 1
fi

mkdir -p "$bin_dir"
export CGO_ENABLED=0
# Building on a 2-core machine: bound memory and parallelism so the build never runs out.
export GOFLAGS="${GOFLAGS:-} -trimpath -mod=mod"

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# build NAME MODULE_DIR PACKAGE [LDFLAGS]
build() {
  local name=$1 dir=$2 pkg=$3 ldflags=${4:-}
  if [[ -x "$bin_dir/$name" ]]; then
    log "$name: cached"
    return
  fi
  log "$name: building $pkg (first build takes several minutes on 2 cores)..."
  local start=$SECONDS tmp="$bin_dir/.$name.tmp"
  (cd "$here/$dir" && go build -ldflags "-s -w $ldflags" -o "$tmp" "$pkg") &
  local pid=$!
  # Print a heartbeat so a long first build never waits silently.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( (SECONDS - start) % 30 == 0 )) && kill -0 "$pid" 2>/dev/null; then
      log "$name: still building ($((SECONDS - start)) s)"
    fi
  done
  wait "$pid"
  mv "$tmp" "$bin_dir/$name"
  log "$name: built in $((SECONDS - start)) s"
}

kube_ldflags="-X k8s.io/component-base/version.gitVersion=v${KUBE_VERSION}
 -X k8s.io/component-base/version.gitMajor=${KUBE_VERSION%%.*}
 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)
 -X k8s.io/component-base/version.gitTreeState=clean
 -X k8s.io/client-go/pkg/version.gitVersion=v${KUBE_VERSION}
 -X k8s.io/client-go/pkg/version.gitMajor=${KUBE_VERSION%%.*}
 -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
kube_ldflags=$(echo $kube_ldflags)

build etcd etcd go.etcd.io/etcd/server/v3
build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kubectl kube k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
build kube-controller-manager kube k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
build kube-scheduler kube k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
build helm helm helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=v${HELM_VERSION}"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=v${KWOK_VERSION}"

# kwok needs its Stage configs (node heartbeat, pod lifecycle); copy the stock ones from the module.
stages="$bin_dir/../kwok-stages"
if [[ ! -d "$stages" ]]; then
  moddir=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  mkdir -p "$stages.tmp"
  for d in node/fast node/heartbeat-with-lease pod/fast; do
    for f in "$moddir/kustomize/stage/$d"/*.yaml; do
      [[ "$(basename "$f")" == kustomization.yaml ]] || cp "$f" "$stages.tmp/"
    done
  done
  chmod -R u+w "$stages.tmp"
  mv "$stages.tmp" "$stages"
  log "kwok stages: $(ls "$stages" | tr '\n' ' ')"
fi

echo "$bin_dir"
