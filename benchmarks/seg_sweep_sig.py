"""Forward time of tfla.mlstm_sig at the Fig. 4 setting (16 heads, d_qk 128, d_hv 256,
bf16, 65,536 tokens) for several sequence-segment settings (OVERRIDES["chunks_per_seg"]),
beside mlstm_kernels' mLSTMsig xl_chunk. Device script: median of 30 after 10 warm-ups."""

import sys

import torch

import tfla
from tfla.triton import common


def inputs(S, seed=0):
    B = 65536 // S
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 16, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, 16, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, 16, S, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    i = torch.randn(B, 16, S, device="cuda", generator=g)
    f = torch.randn(B, 16, S, device="cuda", generator=g) + 3.0
    return q, k, v, i, f


def _median(fn, warmup=10, iters=30):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


for S in [int(s) for s in sys.argv[1:]] or [32768]:
    q, k, v, i, f = inputs(S)
    ref = tfla.mlstm_sig(q, k, v, i, f, chunk_size=128)
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
        peer = get_mlstm_kernel("chunkwise--triton_xl_chunk_siging")
        print(f"S={S} peer {_median(lambda: peer(q, k, v, i, f, chunk_size=128, normalize=False)):.3f} ms")
    except Exception as exc:  # noqa: BLE001
        print("peer unavailable:", exc)
    for cps in [None, 256, 128, 64, 32, 16]:
        common.OVERRIDES.clear()
        if cps is not None:
            common.OVERRIDES["chunks_per_seg"] = cps
        out = tfla.mlstm_sig(q, k, v, i, f, chunk_size=128)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t = _median(lambda: tfla.mlstm_sig(q, k, v, i, f, chunk_size=128))
        print(f"S={S} chunks_per_seg={cps} {t:.3f} ms  rel diff vs default {err:.1e}", flush=True)
