#!/usr/bin/env bash
# Prometheus and promtool from Debian's `prometheus` package, unpacked into a folder cached
# outside the clone and keyed by the package's version (no service is installed or started).
# Prints the folder holding both binaries last.
#   hack/monitoring/prometheus.sh
set -euo pipefail
cache_root=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}
version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [[ -z $version || $version == "(none)" ]]; then
  # The package lists may be empty on a fresh machine.
  echo "[prometheus $(date +%H:%M:%S)] apt-get update (the package lists are empty)" >&2
  apt-get update -qq >&2
  version=$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')
fi
root=$cache_root/prometheus-deb-${version//[^A-Za-z0-9.+-]/_}
if [[ ! -x $root/usr/bin/promtool || ! -x $root/usr/bin/prometheus ]]; then
  echo "[prometheus $(date +%H:%M:%S)] downloading Debian's prometheus $version into $root" >&2
  rm -rf "$root.tmp" && mkdir -p "$root.tmp"
  (cd "$root.tmp" && apt-get download -q "prometheus=$version" >&2)
  dpkg-deb -x "$root.tmp"/prometheus_*.deb "$root.tmp"
  rm -f "$root.tmp"/prometheus_*.deb
  rm -rf "$root" && mv "$root.tmp" "$root"
  echo "[prometheus $(date +%H:%M:%S)] ready" >&2
fi
echo "$root/usr/bin"
