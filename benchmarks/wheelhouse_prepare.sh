#!/usr/bin/env bash
# Download the peers' wheels into a wheelhouse, on a machine with internet, for a GPU node
# without it (docs/offline-peers.md). The node then needs only the folder and
# benchmarks/wheelhouse_install.sh.
#
#   bash benchmarks/wheelhouse_prepare.sh DIR [--python 3.12] [--cuda 13|12] [--split-mb N] [--xz] [--tool-deps]
#
#   DIR          the wheelhouse to fill (created; wheels already there are kept)
#   --python     the node's CPython version (default 3.12); wheels for Linux x86-64
#   --cuda       the CUDA major version of the node's torch, for FlashAttention 4's
#                nvidia-cutlass-dsl libraries (default 13)
#   --split-mb N replace every file larger than N MB by parts FILE.part-aa, -ab, ... of at
#                most N MB and FILE.sha256 (the whole file's), for transfers with a size limit
#   --xz         before splitting, repack each wheel larger than N MB as FILE.tar.xz (its files
#                in an xz tar: about 30 % smaller than the wheel's zip; install rebuilds the wheel)
#   --tool-deps  also tflabench's own dependencies other than torch and triton (pydantic, typer,
#                rich, pyyaml, pandas, scipy, matplotlib and theirs)
#
# The peers and the versions the reference result sets measured: mlstm_kernels 2.0.6,
# fla-core 0.6.0, lightning-attn 0.0.5, flash-attn-4 4.0.0b36 with nvidia-cutlass-dsl 4.8.1,
# fa3_fwd 0.0.3 (FlashAttention 3's forward), einops, and mamba_ssm 2.3.2.post1, which the
# package index has as source only: it is built here into a wheel without its CUDA extension
# (MAMBA_SKIP_CUDA_BUILD=TRUE: Mamba 2's Triton kernels, no Mamba v1), which needs torch in
# this Python; without torch that wheel is skipped with a note. Writes DIR/SHA256SUMS.
set -euo pipefail

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
dir=""; py=3.12; cuda=13; split_mb=""; xz=0; tool=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py="$2"; shift 2 ;;
    --cuda) cuda="$2"; shift 2 ;;
    --split-mb) split_mb="$2"; shift 2 ;;
    --xz) xz=1; shift ;;
    --tool-deps) tool=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "wheelhouse_prepare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "wheelhouse_prepare.sh: one DIR only, got $dir and $1" >&2; exit 2; }; dir="$1"; shift ;;
  esac
done
[ -n "$dir" ] || { echo "wheelhouse_prepare.sh: give the wheelhouse DIR (see --help)" >&2; exit 2; }
case "$cuda" in 12|13) ;; *) echo "wheelhouse_prepare.sh: --cuda takes 12 or 13, got $cuda" >&2; exit 2 ;; esac
if [ "$xz" = 1 ] && [ -z "$split_mb" ]; then echo "wheelhouse_prepare.sh: --xz needs --split-mb N" >&2; exit 2; fi
PYTHON="${PYTHON:-python3}"
mkdir -p "$dir"

peers=(
  mlstm_kernels==2.0.6 fla-core==0.6.0 lightning-attn==0.0.5 einops fa3_fwd==0.0.3
  flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
  nvidia-cutlass-dsl-libs-core==4.8.1 "nvidia-cutlass-dsl-libs-cu${cuda}==4.8.1"
  "apache-tvm-ffi>=0.1.11,<0.2" torch-c-dlpack-ext "quack-kernels>=0.5.3"
  "cuda-bindings>=${cuda},<$((cuda + 1))" cuda-pathfinder "protobuf>=4.21.12" typing-extensions
)
tool_deps=(
  pydantic pydantic-core annotated-types typing-inspection typer click rich markdown-it-py mdurl
  pygments shellingham pyyaml pandas numpy python-dateutil pytz tzdata six scipy matplotlib
  contourpy cycler fonttools kiwisolver packaging pillow pyparsing
)
names=("${peers[@]}")
if [ "$tool" = 1 ]; then names+=("${tool_deps[@]}"); fi
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for name in "${names[@]}"; do
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    "${platforms[@]}" -d "$dir" "$name"
done

# mamba_ssm: source only on the index; a wheel without its CUDA extension
if "$PYTHON" -c "import torch" 2>/dev/null; then
  # its setup.py imports torch, so no build isolation; the CUDA extension is skipped
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation \
    --no-binary=:all: -w "$dir" mamba_ssm==2.3.2.post1 \
    || echo "note: the mamba_ssm wheel did not build (see above); Mamba 2 will be missing"
else
  echo "note: no torch in $PYTHON: mamba_ssm (source only on the index) not built; Mamba 2 will be missing"
fi

if [ -n "$split_mb" ]; then
  limit=$((split_mb * 1000 * 1000))
  for f in "$dir"/*.whl; do
    [ "$(stat -c %s "$f")" -gt "$limit" ] || continue
    if [ "$xz" = 1 ]; then
      tmp=$(mktemp -d)
      "$PYTHON" -m zipfile -e "$f" "$tmp"
      tar -C "$tmp" -cf - . | xz -9e -T0 > "$f.tar.xz"
      rm -rf "$tmp" "$f"
      f="$f.tar.xz"
    fi
    sha256sum "$f" | cut -d' ' -f1 > "$f.sha256"
    split -b "$limit" "$f" "$f.part-"
    rm "$f"
    echo "split $(basename "$f") into $(ls "$f".part-* | wc -l) parts of at most $split_mb MB"
  done
fi
(cd "$dir" && sha256sum -- * | grep -v ' SHA256SUMS$' > SHA256SUMS)
du -sh "$dir"
