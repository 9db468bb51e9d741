#!/usr/bin/env bash
# Issue 11 on the lent H200 (device tool, carry [".peers"] and, to resume, "results"):
#  1. bench_sig_tfla.py forward tables (3 head shapes x L, ours beside our mLSTMexp,
#     mlstm_kernels and FLA, one process)
#  2. suites/chunk_tradeoff.yaml (Figure 5) through the harness
#  3. suites/h100_7b.yaml for the kernels these changes touch, beside the authors' mLSTMsig
#     and FLA simple_gla (Figure 4)
# Each step stops itself (timeouts below); results/ comes back as $OUT/results.tgz.
#   STEPS="bench fig5 fig4" bash benchmarks/device_issue11.sh
# (BENCH_ARGS, FIG5_ARGS, FIG4_ARGS add options; FIG4_ONLY replaces the --only patterns, ';'-separated;
#  BENCH_S, FIG5_S, FIG4_S are the steps' time limits in seconds)
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export TFLABENCH_GIT_REVISION="${TFLABENCH_GIT_REVISION:-unknown}"
for step in ${STEPS:-bench fig5 fig4}; do
  case "$step" in
    bench) python3 benchmarks/bench_sig_tfla.py --out "$OUT/bench" --modes fwd \
             --budget-s "${BENCH_S:-190}" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 ;;
    fig5) timeout --signal=TERM "${FIG5_S:-160}" python3 -m tflabench run suites/chunk_tradeoff.yaml \
             --no-progress ${FIG5_ARGS:-} > "$OUT/fig5.log" 2>&1 ;;
    fig4) only=()
          IFS=';' read -ra pats <<< "${FIG4_ONLY:-mLSTMsig*;mLSTMexp TFLA xl_chunk (ours);mLSTMexp limit_chunk (ours);Simple GLA (FLA chunk)}"
          for p in "${pats[@]}"; do only+=(--only "$p"); done
          timeout --signal=TERM "${FIG4_S:-170}" python3 -m tflabench run suites/h100_7b.yaml --no-progress \
             "${only[@]}" ${FIG4_ARGS:-} > "$OUT/fig4.log" 2>&1 ;;
  esac
done
tar czf "$OUT/results.tgz" results
grep -v "^shape=" "$OUT/bench.log" 2>/dev/null | grep -v "^\s*$" | tail -40
tail -5 "$OUT"/fig5.log "$OUT"/fig4.log 2>/dev/null
