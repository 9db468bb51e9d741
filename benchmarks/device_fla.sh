#!/usr/bin/env bash
# The FLA rows of the Figure-4 run on the lent H200 (issue 13): chunk_gla (both modes; its
# first call autotunes for minutes per shape) and chunk_simple_gla (fwdbw with fla's #640
# guard narrowed to the miscompiled key block width, TFLABENCH_FLA_640_GUARD=narrow: d_qk 128
# runs width 128; the numerics gate checks every gradient).
#
#   run (device tool, kind nvidia-h200, carry [".peers"], or [".peers", "results"] to resume):
#     bash benchmarks/device_fla.sh                          # a new result set
#     RESUME=results/h100_7b/<ts> bash benchmarks/device_fla.sh   # finish it (carry results)
#     RESUME=results/reference/h200/h100_7b bash benchmarks/device_fla.sh   # add the rows to the reference set
# A call that ends mid-tuning still packs the autotune results finished so far: call again
# (carry [".peers", "results"]) and the next one starts from them.
#
# Autotune results are kept in a Triton cache and packed back (only *.autotune.json) into
# results/triton-autotune/, which a later call unpacks: chunk_gla's tuning is paid once per
# shape, and first_call_s shows what each call still paid. Merge the rows into the
# reference set with `tflabench merge` or by resuming the reference copy.
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache TRITON_CACHE_AUTOTUNING=1 TFLABENCH_FLA_640_GUARD=narrow
if [ -d results/triton-autotune ]; then
  python3 -m tflabench.triton_cache unpack results/triton-autotune "$TRITON_CACHE_DIR"
fi
resume=()
if [ -n "${RESUME:-}" ]; then resume=(--resume "$RESUME"); fi
timeout --signal=TERM "${LIMIT_S:-520}" python3 -m tflabench run suites/h100_7b.yaml --no-progress \
  --only 'GLA (FLA chunk),Simple GLA (FLA chunk)' --max-kernel-failures 0 "${resume[@]}" 2>&1 | tee "$OUT/run.log"
python3 -m tflabench.triton_cache pack "$TRITON_CACHE_DIR" results/triton-autotune
tar czf "$OUT/results.tgz" results
