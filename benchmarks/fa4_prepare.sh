#!/usr/bin/env bash
# Prepare FlashAttention 4 (flash-attn-4, CuTe DSL; fwd+bwd on Hopper) for the lent GPU machine,
# which reaches no package index: download the wheels for its Python 3.12 / x86-64 into .fa4/
# (git-ignored) and split the one wheel larger than a device call's carry (64 MiB in all),
# nvidia-cutlass-dsl-libs-cu13 (88 MiB), into two parts. Run here, once:
#
#   bash benchmarks/fa4_prepare.sh
#
# then on the device (kind nvidia-h200), three calls on the same warm machine:
#   carry [".fa4/a"]                bash benchmarks/device_fa4.sh a
#   carry [".fa4/b"]                bash benchmarks/device_fa4.sh b
#   carry [".peers", ".fa4/small"]  bash benchmarks/device_fa4.sh run
set -euo pipefail
rm -rf .fa4 && mkdir -p .fa4/dl .fa4/a .fa4/b .fa4/small
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  -d .fa4/dl flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 "apache-tvm-ffi>=0.1.11,<0.2" \
  torch-c-dlpack-ext "quack-kernels>=0.5.3" "cuda-bindings>=13,<14" cuda-pathfinder "protobuf>=4.21.12"
big=$(ls .fa4/dl/nvidia_cutlass_dsl_libs_cu13-*.whl)
basename "$big" > .fa4/small/BIG_WHEEL
sha256sum "$big" | cut -d' ' -f1 > .fa4/small/BIG_WHEEL.sha256
split -b 45M "$big" .fa4/part-
mv .fa4/part-aa .fa4/a/ && mv .fa4/part-ab .fa4/b/
find .fa4/dl -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec mv {} .fa4/small/ \;
rm -rf .fa4/dl
du -sh .fa4/a .fa4/b .fa4/small
