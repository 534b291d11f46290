#!/usr/bin/env bash
# Builds the project's container images without a Docker daemon, with buildah (Debian's), from
# images/*/Dockerfile and contexts staged here:
#   offload-operator  one static binary (static C runtime), non-root, no shell
#   offload-agent     the agent and the glibc runtime it loads NVML and CUDA with (from
#                     Debian's libc6 and libgcc-s1 packages), non-root, no shell
#   offload-pause     the pod sandbox image of the local real node (Kubernetes' pause.c), with
#                     a stand-in for a training process (images/pause/standin.c)
# Each is written as an OCI archive to target/images/<name>.tar. Builds are reproducible: every
# timestamp is 0 and nothing but the sources and the pinned packages goes in, so the same
# commit gives the same image IDs.
#
# Usage: hack/images.sh [--local] [--tag TAG] [--push REGISTRY] [--stage-only]
#   --local            the images of a local cluster (the demo's, the tests'): from the dev
#                      build of the workspace the demo and the tests already run (no second
#                      build; the operator then carries the glibc runtime as the agent does)
#   --tag TAG          image tag (default: the workspace version)
#   --push REGISTRY    also push to REGISTRY/<name>:<tag> (e.g. ghcr.io/you)
#   --stage-only       only stage the build contexts under target/images/context/<name>, for
#                      `docker build -f images/<name>/Dockerfile target/images/context/<name>`
# Without --local the binaries are built for publishing: the operator in the `image` profile
# (release with LTO, static C runtime: one file, no libc), the agent in release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag=$version
push=
stage_only=false
local_images=false
while [[ $# -gt 0 ]]; do
  case $1 in
    --local) local_images=true; shift ;;
    --tag) tag=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --stage-only) stage_only=true; shift ;;
    *) echo "usage: hack/images.sh [--local] [--tag TAG] [--push REGISTRY] [--stage-only]" >&2; exit 2 ;;
  esac
done
if $local_images && [[ -n $push ]]; then
  echo "error: --local images are for this machine's cluster; publish without --local" >&2
  exit 2
fi
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ -n $(git status --porcelain 2>/dev/null) ]]; then
  revision="$revision-dirty"
fi

out=$root/target/images
ctx=$out/context
mkdir -p "$out" "$ctx"

# Packages from Debian: buildah to build, and the C runtime for the agent's image.
ensure_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
      echo "error: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
      exit 1
    fi
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  fi
}
ensure_packages buildah gcc libc6-dev

# --- binaries ----------------------------------------------------------------------------------
if $local_images; then
  # Every binary of the workspace, as the demo and the tests build it: a no-op when they have.
  log "the dev build of the workspace (a no-op when the demo or the tests built it)"
  cargo build --workspace --bins
  operator_bin=$root/target/debug/offload-operator
  agent_bin=$root/target/debug/offload-agent
else
  log "building offload-agent (release; every binary, so features unify as in other release builds)"
  cargo build --release --workspace --bins
  log "building offload-operator (profile image: release with LTO, static C runtime; several minutes)"
  # The target triple keeps RUSTFLAGS off the build scripts and proc macros.
  RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --profile image -p offload-operator --bin offload-operator --target x86_64-unknown-linux-gnu
  operator_bin=$root/target/x86_64-unknown-linux-gnu/image/offload-operator
  agent_bin=$root/target/release/offload-agent
  if readelf -d "$operator_bin" | grep -q NEEDED; then
    echo "error: $operator_bin links shared libraries: $(readelf -d "$operator_bin" | grep NEEDED)" >&2
    exit 1
  fi
fi

# --- contexts ----------------------------------------------------------------------------------
stage() { rm -rf "${ctx:?}/$1"; mkdir -p "$ctx/$1"; }

stage offload-operator
install -m 0755 "$operator_bin" "$ctx/offload-operator/offload-operator"
strip "$ctx/offload-operator/offload-operator"

stage offload-agent
install -m 0755 "$agent_bin" "$ctx/offload-agent/offload-agent"
strip "$ctx/offload-agent/offload-agent"
debs=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}/debs
mkdir -p "$debs"
for pkg in libc6 libgcc-s1; do
  ver=$(apt-cache policy "$pkg" | sed -n 's/^  Candidate: //p')
  if ! ls "$debs/${pkg}_"*"$(echo "$ver" | sed 's/:/%3a/')"*.deb >/dev/null 2>&1; then
    log "downloading Debian package $pkg $ver"
    (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$ver" >/dev/null)
  fi
done
extract=$(mktemp -d)
trap 'rm -rf "$extract"' EXIT
for deb in "$debs"/libc6_*.deb "$debs"/libgcc-s1_*.deb; do
  dpkg-deb -x "$deb" "$extract"
done
rootfs=$ctx/offload-agent/rootfs
mkdir -p "$rootfs/lib/x86_64-linux-gnu" "$rootfs/lib64" "$rootfs/etc" "$rootfs/tmp"
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libgcc_s.so.1; do
  cp -L "$extract/lib/x86_64-linux-gnu/$lib" "$rootfs/lib/x86_64-linux-gnu/$lib"
done
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$rootfs/lib64/ld-linux-x86-64.so.2"
# Who the non-root user is, for tools that ask.
printf 'root:x:0:0:root:/:/nonexistent\nnonroot:x:65532:65532:nonroot:/:/nonexistent\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
chmod 1777 "$rootfs/tmp"
# Every file dated 0, so the layer is the same whenever it is built.
find "$rootfs" -exec touch -h -d @0 {} +
if $local_images; then
  # The dynamically linked operator needs the same runtime.
  cp -a "$rootfs" "$ctx/offload-operator/rootfs"
fi

stage offload-pause
pause_src=$(cd hack/k8s/kube && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
gcc -Os -Wall -Werror -static -DVERSION=v3.10-offload -o "$ctx/offload-pause/pause" "$pause_src"
strip "$ctx/offload-pause/pause"
# Beside it, a stand-in for a training process (the node has no GPU): the recovery tests' pods.
gcc -Os -Wall -Werror -static -o "$ctx/offload-pause/standin" images/pause/standin.c
strip "$ctx/offload-pause/standin"

for name in offload-operator offload-agent offload-pause; do
  dir=${name#offload-}
  dockerfile=images/$dir/Dockerfile
  if $local_images && [[ -f $dockerfile.local ]]; then
    dockerfile=$dockerfile.local
  fi
  cp "$dockerfile" "$ctx/$name/Dockerfile"
  find "$ctx/$name" -exec touch -h -d @0 {} +
done
if $stage_only; then
  log "contexts staged under $ctx"
  exit 0
fi

# --- images ------------------------------------------------------------------------------------
storage=(--root "$out/storage" --runroot "$out/run" --storage-driver vfs)
for name in offload-operator offload-agent offload-pause; do
  ref=localhost/$name:$tag
  log "building $ref"
  buildah "${storage[@]}" bud -q --timestamp 0 --layers=false \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    -f "$ctx/$name/Dockerfile" -t "$ref" "$ctx/$name" >/dev/null
  rm -f "$out/$name.tar"
  buildah "${storage[@]}" push -q "$ref" "oci-archive:$out/$name.tar:$ref"
  if [[ -n $push ]]; then
    log "pushing $push/$name:$tag"
    buildah "${storage[@]}" push -q "$ref" "docker://$push/$name:$tag"
  fi
done

# --- report ------------------------------------------------------------------------------------
printf '\n| image | image ID | archive (compressed) | uncompressed |\n|---|---|---|---|\n'
for name in offload-operator offload-agent offload-pause; do
  ref=localhost/$name:$tag
  id=$(buildah "${storage[@]}" images --noheading --no-trunc --format '{{.ID}}' "$ref" | head -1)
  archive=$(stat -c %s "$out/$name.tar")
  unpacked=$(du -sb --apparent-size "$ctx/$name" | cut -f1)
  awk -v ref="$ref" -v id="${id:0:19}" -v a="$archive" -v u="$unpacked" \
    'BEGIN { printf "| %s | %s | %.1f MiB | %.1f MiB |\n", ref, id, a / 1048576, u / 1048576 }'
done
echo "$out"
