#!/usr/bin/env bash
# The model meets the measurement on the lent H200 (issue 13): `optimal-chunk --measure` for
# our mLSTMsig and the authors' (mlstm_kernels), forward and forward+backward, chunk size
# 64..1024, at two shapes:
#   dhv512: 8 heads, d_qk 256, d_hv 512, S 8192, batch 8   (paper Figs. 5, 17)
#   fig4:   16 heads, d_qk 128, d_hv 256, S 8192, batch 8  (the Figure-4 layout at S 8192)
#
#   run (device tool, kind nvidia-h200, carry [".peers"]):
#     bash benchmarks/device_model.sh                # both shapes, about 5-6 min
#     SHAPES=fig4 bash benchmarks/device_model.sh    # one shape (e.g. to finish a cut run)
#
# The machine has torch, triton, typer, rich, pandas, pyarrow, matplotlib and pyyaml but no
# pydantic and no peers: the wheels travel in .peers/ (git-ignored; name it in `carry`).
# CALIBRATE=1 (default) measures this GPU's ceilings first, so the model curve uses them
# (`--ceilings auto`: measured where recorded). Every autotuner's results go to a Triton
# cache whose *.autotune.json files come back in results/triton-autotune/ (carry `results`
# next time and they are reused). Each sweep stops at the call's limit (LIMIT_S, default
# 540 s, shared by all steps). Back in $OUT: one log and one figure per shape
# (optimal_chunk_<shape>.png), results.tgz (the result sets with their plots:
# optimal_chunk.png, roofline_measured.png, memory_vs_runtime.png), calibrate.log.
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
start=$SECONDS
limit=${LIMIT_S:-540}
left() { echo $(( limit - (SECONDS - start) )); }
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache TRITON_CACHE_AUTOTUNING=1
if [ -d results/triton-autotune ]; then
  python3 -m tflabench.triton_cache unpack results/triton-autotune "$TRITON_CACHE_DIR"
fi
if [ "${CALIBRATE:-1}" = 1 ]; then
  timeout "$(left)" python3 -m tflabench calibrate 2>&1 | tee "$OUT/calibrate.log"
fi
python3 -m tflabench doctor > "$OUT/doctor.log" 2>&1
for shape in ${SHAPES:-dhv512 fig4}; do
  case "$shape" in
    dhv512) args=(--dhv 512 --dqk 256 --heads 8 --batch 8 -T 8192) ;;
    fig4)   args=(--dhv 256 --dqk 128 --heads 16 --batch 8 -T 8192) ;;
    *) echo "unknown shape $shape (dhv512 | fig4)" >&2; exit 2 ;;
  esac
  if [ "$(left)" -lt 30 ]; then echo "skipped $shape: out of time (rerun with SHAPES=$shape)" | tee -a "$OUT/skipped.log"; continue; fi
  timeout --signal=TERM "$(left)" python3 -m tflabench optimal-chunk --measure \
    --kernel ours,mlstm_kernels "${args[@]}" -L 64,128,256,512,1024 --mode fwd,fwdbw \
    --no-progress --out results 2>&1 | tee "$OUT/$shape.log"
done
python3 -m tflabench.triton_cache pack "$TRITON_CACHE_DIR" results/triton-autotune
cp -r ~/.config/tflabench "$OUT/tflabench-config" 2>/dev/null
tar czf "$OUT/results.tgz" results
