# Shared by the GPU benches (sourced, with `root`, the repository, and `out`, the bench's output
# folder, set): the carried wheels installed, the environment every run's Python sees, the
# JIT-built DeepSpeed ops an earlier call left restored, a log line, this node's report.

# Installs .whl (hack/gpu/wheels.sh) into /tmp/site and exports the runs' environment.
gpu_python() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$root"/.whl/*.whl || return 1
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 \
    TORCH_EXTENSIONS_DIR=/tmp/torch-ext NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  mkdir -p /tmp/torch-ext "$out"
  # A device image without DeepSpeed: a pure-Python wheel from the carried sdist (its ops
  # JIT-compile on first use; .gpucache holds them once built).
  if ! python3 -c 'import deepspeed' 2>/dev/null; then
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation --no-index \
      -w /tmp/ds-wheel "$root"/.whl/deepspeed-*.tar.gz >"$out/ds-wheel.log" 2>&1 &&
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        /tmp/ds-wheel/deepspeed-*.whl >>"$out/ds-wheel.log" 2>&1 ||
      { tail -n 20 "$out/ds-wheel.log"; return 1; }
  fi
  if [[ -f $root/.gpucache/ext.tgz ]]; then
    tar xzf "$root/.gpucache/ext.tgz" -C /tmp/torch-ext
  fi
}

# A timestamped line, on stdout and in OUT/log.txt.
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/log.txt"; }

# This node's report from the agent's own NVML code (`AGENT probe`), made once per output
# folder: prints its path.
node_report() { # AGENT
  local node=$out/node-report.json
  [[ -s $node ]] || "$1" probe >"$node" 2>>"$out/agent.log"
  echo "$node"
}

# The host's memory as a quantity (`125Gi`), what `explain --node-memory` takes.
host_memory() { awk '/MemTotal/ {printf "%dGi", $2 / 1048576}' /proc/meminfo; }
