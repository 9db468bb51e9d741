#!/usr/bin/env bash
# An A/A pair: one suite run twice back to back on the same GPU, then `tflabench compare`
# of the two, which should say "unchanged" for every case. Use it to check that a machine
# measures steadily before its run becomes a comparison base (docs/ci.md, "Refreshing the
# reference"), and to see the noise that compare's thresholds must clear.
#
#   bash benchmarks/aa_pair.sh SUITE OUTDIR [tflabench run options...]
#
# OUTDIR receives a/<suite>/<timestamp>/, b/<suite>/<timestamp>/ (the two result sets),
# compare.md (the report) and aa.log. The exit status is compare's: 0 unchanged, 1 a
# difference flagged as a regression, 2 bad input.
set -uo pipefail
if [ $# -lt 2 ]; then echo "aa_pair.sh: give SUITE and OUTDIR (see the header)" >&2; exit 2; fi
suite="$1"; out="$2"; shift 2
[ -f "$suite" ] || { echo "aa_pair.sh: suite $suite not found" >&2; exit 2; }
mkdir -p "$out"
PYTHON="${PYTHON:-python3}"
for run in a b; do
  start=$SECONDS
  "$PYTHON" -m tflabench run "$suite" --no-progress --no-plots --out "$out/$run" "$@" 2>&1 | tee -a "$out/aa.log" | tail -n 3
  echo "run $run: $((SECONDS - start)) s" | tee -a "$out/aa.log"
done
first=$(ls -d "$out"/a/*/* | tail -n 1); second=$(ls -d "$out"/b/*/* | tail -n 1)
"$PYTHON" -m tflabench compare "$first" "$second" --markdown "$out/compare.md" 2>&1 | tee -a "$out/aa.log"
exit "${PIPESTATUS[0]}"
