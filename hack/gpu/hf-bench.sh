#!/usr/bin/env bash
# The memory model against Hugging Face models trained with DeepSpeed, on the GPU node
# (docs/benchmarks/memory-h200.md): installs the carried wheels (.whl: DeepSpeed 0.19.8 and
# its pure-Python needs), restores the JIT-built DeepSpeed ops from .gpucache/ext.tgz when an
# earlier call left them, trains each RUN in its own process (hack/gpu/hf_sweep.py) and leaves
# in OUT: memory.jsonl, log.txt, nvidia-smi.csv and ext.tgz (the built ops, for the next call).
#   hack/gpu/hf-bench.sh OUT DEADLINE_S RUN...
set -uo pipefail
out=$1 deadline=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=hack/gpu/common.sh
source "$here/common.sh"
gpu_python || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/nvidia-smi.csv" 2>&1
python3 -c 'import torch, transformers, deepspeed; print("torch", torch.__version__, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__, "cuda total", torch.cuda.mem_get_info())' 2>&1 | grep -v Warn | tee "$out/log.txt"
python3 "$here/hf_sweep.py" --out "$out" --deadline-s "$deadline" "$@" 2>&1 | tee -a "$out/log.txt"
tar czf "$out/ext.tgz" -C /tmp/torch-ext . 2>/dev/null
exit 0
