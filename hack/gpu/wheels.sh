#!/usr/bin/env bash
# Fills .whl/ with what the GPU benches install on the device (which reaches no package index):
# the cp312 wheels DeepSpeed 0.19.8 needs that the device's image lacks, Megatron-core 0.14.0,
# and DeepSpeed's sdist (the benches print the DeepSpeed they import; on a device without it,
# `DS_BUILD_OPS=0 pip wheel --no-deps` on the sdist gives a pure-Python wheel whose ops
# JIT-compile there: ../shared/FACTS.md). torch, numpy, einops, packaging, msgpack, ninja,
# psutil, py-cpuinfo and tqdm are on the device already. Run once on a fresh clone before a
# device call that carries .whl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .whl
binary() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$@"
}
binary pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 hjson==3.1.0 megatron-core==0.14.0
[[ -f .whl/deepspeed-0.19.8.tar.gz ]] ||
  python3 -m pip download -q --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8
ls -1 .whl
