#!/usr/bin/env bash
# mdBook and its link checker (mdbook-linkcheck2), installed from crates.io into a folder cached
# outside the clone and keyed by their versions; built on first use (a few minutes on 2 cores,
# cargo's progress shown). Prints the folder holding both binaries last.
#   hack/book/tools.sh
set -euo pipefail
MDBOOK_VERSION=0.5.4
LINKCHECK_VERSION=0.13.0
cache_root=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}
root=$cache_root/book-mdbook-$MDBOOK_VERSION-linkcheck2-$LINKCHECK_VERSION
if [[ ! -x $root/bin/mdbook || ! -x $root/bin/mdbook-linkcheck2 ]]; then
  echo "[book $(date +%H:%M:%S)] building mdbook $MDBOOK_VERSION and mdbook-linkcheck2 $LINKCHECK_VERSION into $root (first use: a few minutes)" >&2
  rm -rf "$root.tmp"
  # The link checker never goes to the network here (follow-web-links is off in book.toml).
  cargo install --locked --root "$root.tmp" --no-default-features --features search \
    mdbook@"$MDBOOK_VERSION" >&2
  cargo install --locked --root "$root.tmp" mdbook-linkcheck2@"$LINKCHECK_VERSION" >&2
  rm -rf "$root" && mv "$root.tmp" "$root"
  echo "[book $(date +%H:%M:%S)] ready" >&2
fi
echo "$root/bin"
