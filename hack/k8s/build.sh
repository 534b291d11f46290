#!/usr/bin/env bash
# Builds the upstream control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, helm, kwok) from their Go modules and caches them outside the
# clone, keyed by version, so that later runs and CI on the same machine reuse them.
#
# Usage: hack/k8s/build.sh                  # builds what is missing, prints the bin directory last
#        hack/k8s/build.sh --print-dir        # prints the bin directory without building
#        hack/k8s/build.sh node               # the real node's binaries (kubelet, kube-proxy,
#                                             # containerd, its shim, ctr, CNI plugins, and the
#                                             # stand-in for NVIDIA's DRA kubelet plugin)
#        hack/k8s/build.sh node --print-dir
#        hack/k8s/build.sh jobkinds           # upstream CRDs and examples of JobSet, Kubeflow
#                                             # Trainer and the Training Operator (no build)
#        hack/k8s/build.sh kueue              # Kueue: its controller, an OCI image of it
#                                             # (buildah) and its Helm chart
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/versions.env"

cache_root=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}
what=control-plane
if [[ "${1:-}" == "node" || "${1:-}" == "jobkinds" || "${1:-}" == "kueue" ]]; then
  what=$1
  shift
fi
if [[ $what == kueue ]]; then
  bin_dir="$cache_root/kueue-v${KUEUE_VERSION}"
elif [[ $what == jobkinds ]]; then
  bin_dir="$cache_root/jobkinds-jobset-v${JOBSET_VERSION}-trainer-v${TRAINER_VERSION}-v${TRAINER_OLD_VERSION}-training-operator-v${TRAINING_OPERATOR_VERSION}"
elif [[ $what == node ]]; then
  bin_dir="$cache_root/node-k8s-v${KUBE_VERSION}-containerd-v${CONTAINERD_VERSION}-cni-v${CNI_PLUGINS_VERSION}/bin"
else
  bin_dir="$cache_root/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}-helm-v${HELM_VERSION}-kwok-v${KWOK_VERSION}/bin"
fi

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
  local start=$SECONDS tmp="$bin_dir/$name.tmp"
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

if [[ $what == jobkinds ]]; then
  if [[ -f "$bin_dir/.complete" ]]; then
    log "job kinds: cached"
    echo "$bin_dir"
    exit 0
  fi
  # The manifests ship in the projects' Go modules; `go mod download` fetches each pinned
  # version through the module proxy and checks it against the checksum database.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && go mod init offload.dev/jobkinds >/dev/null 2>&1)
  moddir() {
    (cd "$work" && GOFLAGS= go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  }
  log "job kinds: downloading JobSet v$JOBSET_VERSION, Trainer v$TRAINER_VERSION and v$TRAINER_OLD_VERSION, Training Operator v$TRAINING_OPERATOR_VERSION"
  jobset=$(moddir "sigs.k8s.io/jobset@v$JOBSET_VERSION")
  trainer=$(moddir "github.com/kubeflow/trainer/v2@v$TRAINER_VERSION")
  trainer_old=$(moddir "github.com/kubeflow/trainer/v2@v$TRAINER_OLD_VERSION")
  to=$(moddir "github.com/kubeflow/training-operator@v$TRAINING_OPERATOR_VERSION")
  for d in "$jobset" "$trainer" "$trainer_old" "$to"; do
    [[ -n "$d" && -d "$d" ]] || { echo "error: a job-kind module did not download" >&2; exit 1; }
  done
  # Test binaries that run at once may each fetch them: each writes its own copy, and the
  # first to finish keeps its own.
  out="$bin_dir.tmp.$$"
  rm -rf "$out"
  mkdir -p "$out"/{jobset,trainer,trainer-old,training-operator}
  cp "$jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$out/jobset/"
  cp "$trainer"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$out/trainer/"
  cp "$trainer/manifests/base/runtimes/torch_distributed.yaml" "$out/trainer/"
  cp "$trainer"/examples/yaml/0[12]-*.yaml "$out/trainer/"
  cp "$trainer_old"/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml "$out/trainer-old/"
  cp "$to/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$out/training-operator/"
  cp "$to/examples/pytorch/simple.yaml" "$out/training-operator/"
  chmod -R u+w "$out"
  touch "$out/.complete"
  if [[ -f "$bin_dir/.complete" ]]; then
    rm -rf "$out"
  else
    rm -rf "$bin_dir"
    mv "$out" "$bin_dir" 2>/dev/null || { rm -rf "$out"; [[ -f "$bin_dir/.complete" ]]; }
  fi
  log "job kinds: $(cd "$bin_dir" && find . -name '*.yaml' | sort | tr '\n' ' ')"
  echo "$bin_dir"
  exit 0
fi

if [[ $what == kueue ]]; then
  build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=v${KUEUE_VERSION}"
  # The chart (its CRDs inside) as the release ships it.
  if [[ ! -f "$bin_dir/chart/Chart.yaml" ]]; then
    moddir=$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
    rm -rf "$bin_dir/chart.tmp"
    cp -r "$moddir/charts/kueue" "$bin_dir/chart.tmp"
    chmod -R u+w "$bin_dir/chart.tmp"
    mv "$bin_dir/chart.tmp" "$bin_dir/chart"
    log "kueue chart: $bin_dir/chart"
  fi
  # The image: the static controller alone, as the release image (distroless static) runs it.
  if [[ ! -f "$bin_dir/kueue.tar" ]]; then
    command -v buildah >/dev/null 2>&1 || {
      [[ $(id -u) -eq 0 ]] || { echo "error: the Kueue image needs buildah (apt-get install buildah)" >&2; exit 1; }
      log "installing buildah (Debian)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah >/dev/null
    }
    ctx=$(mktemp -d)
    install -m 0755 "$bin_dir/kueue" "$ctx/manager"
    printf 'FROM scratch\nCOPY manager /manager\nUSER 65532:65532\nENTRYPOINT ["/manager"]\n' >"$ctx/Dockerfile"
    find "$ctx" -exec touch -h -d @0 {} +
    storage=(--root "$bin_dir/storage" --runroot "$bin_dir/run" --storage-driver vfs)
    ref=localhost/kueue:v${KUEUE_VERSION}
    buildah "${storage[@]}" bud -q --timestamp 0 --layers=false -t "$ref" "$ctx" >/dev/null
    buildah "${storage[@]}" push -q "$ref" "oci-archive:$bin_dir/kueue.tar.tmp:$ref"
    rm -rf "$ctx" "$bin_dir/storage" "$bin_dir/run"
    mv "$bin_dir/kueue.tar.tmp" "$bin_dir/kueue.tar"
    log "kueue image: $ref in $bin_dir/kueue.tar"
  fi
  echo "$bin_dir"
  exit 0
fi

if [[ $what == node ]]; then
  # The node's runtime pieces from Debian: runc (containerd's OCI runtime), iptables and
  # conntrack (kube-proxy, CNI portmap), iproute2 (the node's interfaces).
  missing=()
  for pkg in runc iptables conntrack iproute2; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
      echo "error: the real node needs Debian packages ${missing[*]} (apt-get install ${missing[*]}) and root" >&2
      exit 1
    fi
    log "installing ${missing[*]} (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  fi
  build kubelet kube k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
  build kube-proxy kube k8s.io/kubernetes/cmd/kube-proxy "$kube_ldflags"
  ctr_ldflags="-X github.com/containerd/containerd/v2/version.Version=v${CONTAINERD_VERSION}"
  build containerd containerd github.com/containerd/containerd/v2/cmd/containerd "$ctr_ldflags"
  build containerd-shim-runc-v2 containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$ctr_ldflags"
  build ctr containerd github.com/containerd/containerd/v2/cmd/ctr "$ctr_ldflags"
  # The stand-in for NVIDIA's DRA kubelet plugin (our source, on the pinned
  # k8s.io/dynamic-resource-allocation): rebuilt whenever its source changes.
  standin_src="$here/kube/gpu-dra-standin/main.go"
  standin_sum=$(cat "$standin_src" "$here/kube/go.mod" | sha256sum | cut -c1-16)
  if [[ "$(cat "$bin_dir/gpu-dra-standin.source" 2>/dev/null)" != "$standin_sum" ]]; then
    rm -f "$bin_dir/gpu-dra-standin"
  fi
  build gpu-dra-standin kube ./gpu-dra-standin
  echo "$standin_sum" >"$bin_dir/gpu-dra-standin.source"
  mkdir -p "$bin_dir/cni"
  for plugin in ipam/host-local main/bridge main/loopback meta/portmap; do
    build "cni/$(basename "$plugin")" cni "github.com/containernetworking/plugins/plugins/$plugin"
  done
  echo "$bin_dir"
  exit 0
fi

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
