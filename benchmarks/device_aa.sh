#!/usr/bin/env bash
# On a two-GPU device machine: an A/A pair of one suite on one GPU (for `tflabench
# compare`), then the same suite with one worker per GPU (--gpus 0,1), each timed.
# Results come back as $OUT/results.tgz, logs as $OUT/aa.log.
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
suite="${1:-suites/tfla_ci.yaml}"
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv
  for run in aa1 aa2; do
    start=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m tflabench run "$suite" --no-progress --no-plots --out "results/$run" 2>&1 | tail -n 3
    echo "WALL $run one GPU: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
  done
  start=$(date +%s.%N)
  timeout 170 python3 -m tflabench run "$suite" --no-progress --no-plots --gpus 0,1 --out results/gpus01 2>&1 | tail -n 3
  echo "WALL gpus01 two GPUs: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
} 2>&1 | tee "$OUT/aa.log"
tar czf "$OUT/results.tgz" results
