#!/bin/bash
# Run one suite as a SLURM job array, one shard per array task, then merge the shards.
#
#   mkdir -p logs
#   N=$(( ($(tflabench run suites/h100_7b.yaml --count) + 7) / 8 ))   # about 8 cases a task
#   JOB=$(sbatch --parsable --array=1-$N benchmarks/slurm_array.sh suites/h100_7b.yaml)
#   sbatch --dependency=afterok:$JOB --kill-on-invalid-dep=yes benchmarks/slurm_array.sh --merge "$JOB"
#
# Array task K of N runs `tflabench run SUITE --shard K/N` into
# $TFLABENCH_RESULTS/shards/<job>/<K>/<suite>/<timestamp>/; options after SUITE go to
# `tflabench run` (e.g. --gpus all for a node of several GPUs per task). The merge job
# joins them into $TFLABENCH_RESULTS/merged-<job>/ and refuses a partial set, naming the
# missing shard (with afterany instead of afterok it runs even when a task failed). The
# array must be one contiguous range (1-N or 0-(N-1)); every task needs the same
# checkout, software and GPU model (merge refuses otherwise: add
# `#SBATCH --constraint=...` where the cluster mixes GPUs).
#
# A cancelled or failed task K of job JOB (array FIRST-LAST) is submitted again alone; it
# finishes the shard it left (`run --resume`) in the same folder, and the merge follows:
#
#   sbatch --array=K --export=ALL,TFLABENCH_ARRAY_OF=JOB:FIRST-LAST benchmarks/slurm_array.sh SUITE
#
# Environment: TFLABENCH_RESULTS (default results), TFLABENCH_VENV (a virtual
# environment to activate, default .venv when it exists), TFLABENCH (the command,
# default tflabench), TFLABENCH_ARRAY_OF (a resubmitted task: the job and array range
# it belongs to).
#SBATCH --job-name=tflabench
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%A_%a.out
set -euo pipefail
RESULTS=${TFLABENCH_RESULTS:-results}
VENV=${TFLABENCH_VENV:-.venv}
if [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
read -r -a TFLABENCH <<< "${TFLABENCH:-tflabench}"

if [ "${1:-}" = "--merge" ]; then
    JOB=${2:?usage: slurm_array.sh --merge JOB_ID}
    shopt -s nullglob
    SHARDS=("$RESULTS/shards/$JOB"/*/*/*/)
    if [ ${#SHARDS[@]} -eq 0 ]; then
        echo "slurm_array.sh: no shard results under $RESULTS/shards/$JOB/" >&2
        exit 2
    fi
    exec "${TFLABENCH[@]}" merge "${SHARDS[@]}" --out "$RESULTS/merged-$JOB"
fi

SUITE=${1:?usage: sbatch --array=1-N slurm_array.sh SUITE.yaml [tflabench run options]}
shift
TASK=${SLURM_ARRAY_TASK_ID:?not a SLURM array task: submit with sbatch --array=1-N}
if [ -n "${TFLABENCH_ARRAY_OF:-}" ]; then       # JOB:FIRST-LAST, a task submitted again
    if ! [[ "$TFLABENCH_ARRAY_OF" =~ ^([0-9]+):([0-9]+)-([0-9]+)$ ]]; then
        echo "slurm_array.sh: TFLABENCH_ARRAY_OF=$TFLABENCH_ARRAY_OF is not JOB:FIRST-LAST (e.g. 1234:1-8)" >&2
        exit 2
    fi
    JOB=${BASH_REMATCH[1]}
    FIRST=${BASH_REMATCH[2]}
    N=$(( BASH_REMATCH[3] - FIRST + 1 ))
else
    JOB=${SLURM_ARRAY_JOB_ID:?not a SLURM array task: submit with sbatch --array=1-N}
    FIRST=${SLURM_ARRAY_TASK_MIN:-1}
    N=${SLURM_ARRAY_TASK_COUNT:?not a SLURM array task: submit with sbatch --array=1-N}
fi
K=$(( TASK - FIRST + 1 ))
if [ "$K" -lt 1 ] || [ "$K" -gt "$N" ]; then
    echo "slurm_array.sh: array task $TASK is not in one contiguous range of $N tasks" >&2
    exit 2
fi
OUT="$RESULTS/shards/$JOB/$K"
shopt -s nullglob
LEFT=("$OUT"/*/*/metadata.json)                   # an earlier attempt of this shard
if [ ${#LEFT[@]} -gt 0 ]; then
    exec "${TFLABENCH[@]}" run "$SUITE" --shard "$K/$N" --no-progress --resume "$(dirname "${LEFT[0]}")" "$@"
fi
exec "${TFLABENCH[@]}" run "$SUITE" --shard "$K/$N" --no-progress --out "$OUT" "$@"
