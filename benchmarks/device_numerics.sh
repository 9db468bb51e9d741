#!/usr/bin/env bash
# Numerics on the lent GPU machine (kind nvidia-h200): issues 12 and 15, one device call.
#
#   bash benchmarks/device_numerics.sh            # through the device tool, carry .peers
#
# 1. The per-tensor numerics gate of `run` on the Figure-4 suite (suites/h100_7b.yaml) at
#    S = 512 only (the gate's shape: B 1, NH 2, S 512, as the reference runs), every kernel
#    but FLA chunk_gla (its first-call autotune takes minutes per shape, as in
#    results/reference/h200/h100_7b/) and Mamba v1 (no compiled extension): each row's
#    numerics_detail holds every tensor's max-normalised error, relF and budget
#    (ours and the peers, same run). Suite name h100_7b_gate; timing 2 warm-ups, 5 calls.
# 2. `tflabench verify suites/h100_7b.yaml` for the mLSTM kernels (ours and mlstm_kernels),
#    FLA simple GLA and Mamba 2, bf16, the default grid (every regime that applies,
#    lengths L/2+1, 2L, 2L+L/2+1, with and without initial state, fwdbw; fwd for FLA whose
#    backward is refused on Hopper with triton 3.6): the result set
#    results/h100_7b-verify/<ts>/ with plots/verify_heatmap.png (~310 cases).
#
# Each step stops itself before its share of the call (GATE_LIMIT_S 140 s, VERIFY_LIMIT_S
# 220 s: with the wheels' install and the report, at most ~6.5 min), keeping every row written; the heat map is redrawn by `tflabench report` after
# step 2 either way. Everything under results/ comes back as $OUT/results.tgz, the logs and
# the heat map as $OUT/*.log and $OUT/verify_heatmap.png. Like device_run.sh: the peers'
# wheels travel in .peers/ (name it in `carry`); TFLABENCH_GIT_REVISION names the commit.
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:${PYTHONPATH:-}" PYTHONUNBUFFERED=1

# 1. the gate at S 512 (a copy of the Figure-4 suite with one length and short timing)
python3 - <<'PY'
import yaml
suite = yaml.safe_load(open("suites/h100_7b.yaml"))
suite["name"] = "h100_7b_gate"
suite["description"] = "Figure-4 suite at S 512 only: the per-tensor numerics gate of every kernel"
suite["sweep"]["seq_len"] = [512]
suite["timing"].update(warmup=2, iterations=5)
open("/tmp/h100_7b_gate.yaml", "w").write(yaml.safe_dump(suite, sort_keys=False))
PY
timeout --signal=TERM "${GATE_LIMIT_S:-140}" python3 -m tflabench run /tmp/h100_7b_gate.yaml --no-progress \
  --no-plots --only 'mLSTM*,FlashAttention 3,*SDPA*,Simple GLA*,Mamba 2*' \
  2>&1 | tee "$OUT/gate.log"
python3 - <<'PY' 2>&1 | tee "$OUT/gate_tensors.log"
# every tensor's error beside its budget, per kernel and mode (issue 15's closing note)
import glob, json
from tflabench.results import load_results
rows = load_results(sorted(glob.glob("results/h100_7b_gate/*"))[-1]).rows
for r in rows.to_dict("records"):
    detail = json.loads(r["numerics_detail"]) if r.get("numerics_detail") else {}
    cells = "  ".join(f"{k} {v[0]:.2e}/{v[2]:.1e} relF {v[1]:.1e}" for k, v in sorted(detail.items()) if v[0] is not None)
    print(f"{r['kernel']:42s} {r['mode']:6s} {r['status']:11s} {cells}  {r['reason'] or ''}")
PY

# 2. verify: mLSTM (ours and the peer), FLA simple GLA, Mamba 2 at bf16
timeout --signal=TERM "${VERIFY_LIMIT_S:-220}" python3 -m tflabench verify suites/h100_7b.yaml --no-progress \
  --only 'mLSTM*,Simple GLA*,Mamba 2*' --dtype bfloat16 2>&1 | tee "$OUT/verify.log"
dir=$(ls -d results/h100_7b-verify/* 2>/dev/null | tail -1)
if [ -n "$dir" ]; then
  python3 -m tflabench report "$dir" 2>&1 | tee "$OUT/verify_report.log"
  cp "$dir/plots/verify_heatmap.png" "$OUT/" 2>/dev/null
fi
tar czf "$OUT/results.tgz" results
