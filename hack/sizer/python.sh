#!/usr/bin/env bash
# A Python with the sizer's libraries (sizer/requirements.txt: torch, transformers), in a virtual
# environment cached outside the clone and keyed by those versions; made on first use (about a
# minute: the packages come from PyPI). Prints its interpreter's path last.
#   hack/sizer/python.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cache_root=${OFFLOAD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offload-operator}
key=$(grep -E '^[a-z]' sizer/requirements.txt | tr '\n=' '-_' | sed 's/-$//')
venv=$cache_root/sizer-python-$key
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
  echo "[sizer-python $(date +%H:%M:%S)] installing $(grep -E '^[a-z]' sizer/requirements.txt | tr '\n' ' ')into $venv (first use: about a minute)" >&2
  rm -rf "$venv.tmp"
  python3 -m venv "$venv.tmp"
  "$venv.tmp/bin/python" -m pip install -q --disable-pip-version-check -r sizer/requirements.txt >&2
  rm -rf "$venv" && mv "$venv.tmp" "$venv"
  # A venv records its own path: re-point it after the move.
  sed -i "s#$venv.tmp#$venv#g" "$venv"/bin/* 2>/dev/null || true
  echo "[sizer-python $(date +%H:%M:%S)] ready" >&2
fi
echo "$venv/bin/python"
