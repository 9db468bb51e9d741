#!/usr/bin/env bash
# Run a tflabench suite on the lent GPU machine (the device tool), resumably.
#
#   bash benchmarks/device_run.sh SUITE [tflabench run options...]
#
# The machine has torch, triton, typer, rich, pandas, pyarrow, matplotlib and pyyaml but no
# pydantic and no peers: the wheels travel in .peers/ (git-ignored; name it in `carry`).
# The run stops itself before the device call's limit (LIMIT_S, default 540 s), keeping
# every measured row; finish it in a later call with `--resume results/<suite>/<ts>`
# (carry `results`). Everything under results/ comes back as $OUT/results.tgz.
# CALIBRATE=1 measures the GPU's ceilings first (`tflabench calibrate`, for --ceilings
# measured); TFLABENCH_GIT_REVISION names the commit (the copied tree has no .git).
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
suite="$1"; shift
if [ -n "${CALIBRATE:-}" ]; then python3 -m tflabench calibrate 2>&1 | tee "$OUT/calibrate.log"; fi
timeout --signal=TERM "${LIMIT_S:-540}" python3 -m tflabench run "$suite" --no-progress "$@" 2>&1 | tee "$OUT/run.log"
tar czf "$OUT/results.tgz" results
