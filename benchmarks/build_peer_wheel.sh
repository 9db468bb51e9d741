#!/usr/bin/env bash
# Build a peer's CUDA extension from source into a wheel, for one GPU architecture, and record
# how it was built (docs/offline-peers.md "Peers built from source"). Run it on the GPU node (or
# any machine with nvcc, the CUDA build of torch the node uses, gcc and ninja); the wheel then
# installs with benchmarks/wheelhouse_install.sh like any other in the wheelhouse.
#
#   bash benchmarks/build_peer_wheel.sh fa3   --src FLASH_ATTENTION_DIR [--cutlass CUTLASS_DIR] --out DIR [options]
#   bash benchmarks/build_peer_wheel.sh mamba --sdist mamba_ssm-X.tar.gz --out DIR [options]
#
#   fa3          FlashAttention 3 (flash-attention's hopper/ folder; imports as flash_attn_interface
#                and flash_attn_3._C), forward and backward, bf16, sm_90a. Every instantiation the
#                harness does not measure is switched off (FLASH_ATTENTION_DISABLE_*: fp16, fp8,
#                split, paged KV, append KV, local, softcap, pack-GQA, varlen, cluster, SM80, the
#                head dimensions not in --hdim, the mixed head dimensions), so that the build is a
#                handful of files; FLASH_ATTENTION_OFFLINE_BUILD=1 (no downloads).
#   mamba        mamba_ssm from its source distribution with selective_scan_cuda (Mamba v1), its
#                -gencode targets replaced by --arch alone (the sdist compiles for eight).
#   --src        a flash-attention checkout or unpacked snapshot (holds hopper/ and README.md)
#   --cutlass    CUTLASS at the commit flash-attention pins as csrc/cutlass (a snapshot does not
#                carry the submodule); default: SRC/csrc/cutlass
#   --revision   the source revision to record when SRC is not a git checkout (e.g. the commit of
#                the snapshot); CUTLASS_REVISION likewise for --cutlass
#   --sdist      the package registry's source distribution of mamba_ssm
#   --out        the wheelhouse the wheel goes into (created)
#   --hdim       fa3 head dimensions to build, comma-separated, from 64,96,128,192,256 (default 128)
#   --arch       mamba's compute capability, digits only (default 90)
#   --jobs       parallel compile jobs (MAX_JOBS; default: the number of cores)
#   --split-mb N also replace the wheel by parts WHEEL.part-aa, -ab, ... of at most N MB and
#                WHEEL.sha256, for transfers with a size limit (wheelhouse_install.sh joins them)
#
# Writes DIR/<wheel> and DIR/<wheel>.build.txt: the source revisions, the switches and flags,
# nvcc's, torch's and Python's versions, the build's wall time. Exit 2 on bad arguments, 1 when
# the build fails (its log is DIR/<peer>-build.log).
set -euo pipefail

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
err() { echo "build_peer_wheel.sh: $*" >&2; exit 2; }

peer="${1:-}"; [ -n "$peer" ] || { usage; exit 2; }
case "$peer" in -h|--help) usage; exit 0 ;; fa3|mamba) shift ;; *) err "the first argument is the peer, fa3 or mamba, got '$peer'" ;; esac
src=""; cutlass=""; revision=""; sdist=""; out=""; hdims="128"; arch="90"
jobs="$(nproc)"; split_mb=""
while [ $# -gt 0 ]; do
  case "$1" in
    --src) src="$2"; shift 2 ;;
    --cutlass) cutlass="$2"; shift 2 ;;
    --revision) revision="$2"; shift 2 ;;
    --sdist) sdist="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --hdim) hdims="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --split-mb) split_mb="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) err "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$out" ] || err "give the wheelhouse with --out DIR"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || err "--jobs takes a positive integer, got '$jobs'"
[[ "$arch" =~ ^[0-9]{2,3}$ ]] || err "--arch takes a compute capability such as 90, got '$arch'"
[ -z "$split_mb" ] || [[ "$split_mb" =~ ^[1-9][0-9]*$ ]] || err "--split-mb takes a positive integer, got '$split_mb'"
PYTHON="${PYTHON:-python3}"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || err "nvcc not found: put CUDA's bin folder on PATH"
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
log="$out/$peer-build.log"
start=$(date +%s)

rev_of() {  # rev_of DIR FALLBACK: the git commit of DIR, else FALLBACK, else "unknown"
  git -C "$1" rev-parse HEAD 2>/dev/null || echo "${2:-unknown}"
}

build_wheel() {  # build_wheel WHAT DIR: pip wheel of DIR with "${envs[@]}" into $work/dist; exit 1 on failure
  echo "building $1 with $jobs jobs; log: $log"
  if ! (cd "$2" && env "${envs[@]}" "$PYTHON" -m pip wheel --no-deps --no-build-isolation \
          -w "$work/dist" . >"$log" 2>&1); then
    echo "build_peer_wheel.sh: the $1 build failed; the end of $log:" >&2; tail -30 "$log" >&2; exit 1
  fi
}

if [ "$peer" = fa3 ]; then
  [ -n "$src" ] && [ -d "$src/hopper" ] || err "--src must be a flash-attention tree holding hopper/, got '$src'"
  cutlass="${cutlass:-$src/csrc/cutlass}"
  [ -f "$cutlass/include/cutlass/cutlass.h" ] || err "CUTLASS not found at '$cutlass' (give --cutlass: the commit flash-attention pins as csrc/cutlass)"
  src_rev="$(rev_of "$src" "$revision")"; cutlass_rev="$(rev_of "$cutlass" "${CUTLASS_REVISION:-}")"
  # a private copy: setup.py writes into its tree and reads ../README.md and ../csrc/cutlass
  mkdir -p "$work/fa/csrc"
  cp -r "$src/hopper" "$work/fa/hopper"
  cp "$src/README.md" "$work/fa/README.md" 2>/dev/null || echo "FlashAttention 3" > "$work/fa/README.md"
  mkdir -p "$work/fa/csrc/cutlass"; cp -r "$cutlass/include" "$work/fa/csrc/cutlass/include"
  # nvcc --split-compile (hopper/setup.py carries it commented out, "split-compile is faster"):
  # a build of four files otherwise leaves most cores idle while the backward compiles
  sed -i 's|# f"--split-compile=|f"--split-compile=|' "$work/fa/hopper/setup.py"
  grep -q '^ *f"--split-compile=' "$work/fa/hopper/setup.py" || echo "build_peer_wheel.sh: hopper/setup.py has no split-compile line; building without it" >&2
  switches=(BACKWARD=FALSE FP16=TRUE FP8=TRUE SPLIT=TRUE PAGEDKV=TRUE APPENDKV=TRUE LOCAL=TRUE SOFTCAP=TRUE
            PACKGQA=TRUE VARLEN=TRUE CLUSTER=TRUE SM80=TRUE HDIMDIFF64=TRUE HDIMDIFF192=TRUE)
  for d in 64 96 128 192 256; do
    case ",$hdims," in *",$d,"*) switches+=("HDIM$d=FALSE") ;; *) switches+=("HDIM$d=TRUE") ;; esac
  done
  for d in ${hdims//,/ }; do case "$d" in 64|96|128|192|256) ;; *) err "--hdim takes 64, 96, 128, 192, 256, got '$d'" ;; esac; done
  envs=(FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_OFFLINE_BUILD=1 MAX_JOBS="$jobs" NVCC_THREADS="$(( jobs / 4 > 1 ? jobs / 4 : 1 ))")
  for s in "${switches[@]}"; do envs+=("FLASH_ATTENTION_DISABLE_${s}"); done
  build_wheel "FlashAttention 3 (hdim $hdims, bf16, sm_90a, fwd+bwd)" "$work/fa/hopper"
  sources="flash-attention $src_rev (hopper/), CUTLASS $cutlass_rev"
  flags="${envs[*]}"
else
  [ -f "$sdist" ] || err "--sdist must be mamba_ssm's source distribution (.tar.gz), got '$sdist'"
  tar -C "$work" -xzf "$sdist"
  pkg="$(find "$work" -maxdepth 1 -mindepth 1 -type d | head -1)"
  [ -f "$pkg/setup.py" ] || err "$sdist holds no setup.py"
  # one architecture instead of the sdist's eight: the -gencode list is replaced after it is made
  "$PYTHON" - "$pkg/setup.py" "$arch" <<'PY'
import re, sys
path, arch = sys.argv[1], sys.argv[2]
text = open(path).read()
anchor = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
if text.count(anchor) != 1 or not re.search(r'cc_flag\.append\("arch=compute_\d+,code=sm_\d+"\)', text):
    sys.exit(f"build_peer_wheel.sh: {path} is not the setup.py this script knows (no single -gencode block)")
line = f'    cc_flag[:] = ["-gencode", "arch=compute_{arch},code=sm_{arch}"]  # build_peer_wheel.sh --arch\n'
open(path, "w").write(text.replace(anchor, line + anchor))
PY
  src_rev="$(basename "$sdist") sha256 $(sha256sum "$sdist" | cut -d' ' -f1)"
  envs=(MAMBA_FORCE_BUILD=TRUE MAX_JOBS="$jobs" NVCC_THREADS=1)
  build_wheel "mamba_ssm (selective_scan_cuda, sm_$arch)" "$pkg"
  sources="$src_rev"
  flags="${envs[*]} -gencode arch=compute_$arch,code=sm_$arch"
fi

wheel="$(ls "$work/dist"/*.whl | head -1)"; name="$(basename "$wheel")"
cp "$wheel" "$out/$name"
secs=$(( $(date +%s) - start ))
{
  echo "wheel: $name"
  echo "sha256: $(sha256sum "$out/$name" | cut -d' ' -f1)"
  echo "peer: $peer"
  echo "sources: $sources"
  echo "flags: $flags"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
  echo "python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
  echo "jobs: $jobs"
  echo "build_seconds: $secs"
} > "$out/$name.build.txt"
cat "$out/$name.build.txt"
if [ -n "$split_mb" ] && [ "$(stat -c %s "$out/$name")" -gt $((split_mb * 1024 * 1024)) ]; then
  sha256sum "$out/$name" | sed "s#  .*#  $name#" > "$out/$name.sha256"
  split -b "${split_mb}M" "$out/$name" "$out/$name.part-"
  rm "$out/$name"
  echo "split into $(ls "$out/$name".part-* | wc -l) parts of at most $split_mb MB"
fi
