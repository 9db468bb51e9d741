#!/usr/bin/env bash
# FlashAttention 4 (CuTe DSL, forward + backward on Hopper) on the lent H200, in three calls
# on one warm machine (prepare with benchmarks/fa4_prepare.sh first):
#   carry [".fa4/a"]                bash benchmarks/device_fa4.sh a     # first half of the 88 MiB wheel
#   carry [".fa4/b"]                bash benchmarks/device_fa4.sh b     # second half
#   carry [".peers", ".fa4/small"]  bash benchmarks/device_fa4.sh run   # install, smoke test, Figure-4 rows
# Each part is also kept in /tmp/fa4-parts (outside the checkout) in case the ignored paths
# of an earlier call are not there any more. The install adds
# /tmp/peers/nvidia_cutlass_dsl/dsl_packages to PYTHONPATH: nvidia-cutlass-dsl puts its
# `cutlass` package on sys.path through a .pth file, which a --target install never runs
# (why `cutlass.cute` was "not found" on 2026-11-22). `run` appends the FA4 rows of
# suites/h100_7b.yaml (RESUME=results/h100_7b/<ts> with carry "results" to add them to a set).
set -uo pipefail
: "${OUT:?run this through the device tool (OUT unset)}"
step="${1:?give a step: a, b or run}"
mkdir -p /tmp/fa4-parts
case "$step" in
  a|b)
    cp .fa4/"$step"/part-* /tmp/fa4-parts/ && ls -la /tmp/fa4-parts | tee "$OUT/fa4_$step.log"
    exit 0 ;;
  run) ;;
  *) echo "unknown step $step (a, b or run)" >&2; exit 2 ;;
esac
for part in a b; do [ -d ".fa4/$part" ] && cp -n .fa4/"$part"/part-* /tmp/fa4-parts/ 2>/dev/null; done
big="/tmp/fa4-wheels/$(cat .fa4/small/BIG_WHEEL)"
mkdir -p /tmp/fa4-wheels && cat /tmp/fa4-parts/part-aa /tmp/fa4-parts/part-ab > "$big"
if [ "$(sha256sum "$big" | cut -d' ' -f1)" != "$(cat .fa4/small/BIG_WHEEL.sha256)" ]; then
  echo "the reassembled $big does not match its sha256 (a part is missing?)" | tee "$OUT/fa4_run.log"; exit 1
fi
python3 -m pip install -q --no-deps --no-compile --target /tmp/peers .peers/*.whl .fa4/small/*.whl "$big" 2>&1 | grep -v WARNING
export PYTHONPATH="$PWD:$PWD/kernels:/tmp/peers:/tmp/peers/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$OUT/fa4_smoke.log"
import time, torch
import torch.nn.functional as F
from flash_attn.cute import flash_attn_func
q, k, v = (torch.randn(2, 2048, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
t = time.time(); out = flash_attn_func(q, k, v, causal=True); out = out[0] if isinstance(out, tuple) else out
out.backward(torch.ones_like(out)); torch.cuda.synchronize(); print(f"first fwd+bwd call {time.time() - t:.1f} s")
ref = F.scaled_dot_product_attention(*(x.detach().float().transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
print("max |out - sdpa fp32|:", (out.float() - ref).abs().max().item(), "; dq finite:", bool(q.grad.isfinite().all()))
PY
resume=()
if [ -n "${RESUME:-}" ]; then resume=(--resume "$RESUME"); fi
python3 -m tflabench backends 2>&1 | grep -i fa4 | tee -a "$OUT/fa4_run.log"
timeout --signal=TERM "${LIMIT_S:-480}" python3 -m tflabench run suites/h100_7b.yaml --no-progress \
  --only 'FlashAttention 4*' "${resume[@]}" 2>&1 | tee -a "$OUT/fa4_run.log"
tar czf "$OUT/results.tgz" results
