"""dk, dv and k·dk of the Gluon dK/dV kernel at L 256
(``chunkwise_parallel_bw_gluon_once.parallel_bw_dkv_once_gluon``) against the Triton
``_dkv_once_kernel`` (rule B10), bit for bit, and both launchers' times. Needs an sm_90 GPU.

The inputs are what ``parallel_bw_dkv`` receives in the real backward of
``tfla.mlstm_sig(..., chunk_size=256)`` (d_qk 256, d_hv 512, no normaliser): one backward
per case with ``parallel_bw_dkv`` wrapped to keep its arguments. Cases: b·heads 2 and 64,
S 8192, 1000 and 300 (a partial chunk; shorter than one), three gate regimes: random
(f ~ N(3, 1), i ~ N(0, 1)), closed forget and huge input gates (``f_closed``: f = -30,
i = +20), open forget and tiny input gates (``f_open``: f = +30, i = -30); without and with a
gradient on the last state (has_dc_last), bfloat16; float16 at b·heads 2. Then the median of 50 calls of each launcher (CUDA events, after 10 warm-ups)
at b·heads 64, S 8192.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/check_dkv_once_gluon.py

Exit status 1 if any case differs (dk, dv or k·dk not equal: ``torch.equal``, or the same
bits where both hold NaN), 2 without an sm_90 GPU.
"""

from __future__ import annotations

import sys

import torch

import tfla
from tfla.triton import chunkwise_parallel_bw as pbw
from tfla.triton import chunkwise_parallel_bw_gluon_once as gonce
from tfla.triton.tuning import Tuning

L, D_QK, D_HV = 256, 256, 512
TRITON = Tuning(bw={"GLUON": False})
GATES = ("random", "f_closed", "f_open")


def captured_inputs(bnh: int, S: int, gates: str, has_dc_last: bool, dtype, seed: int):
    """(args, kwargs) of ``parallel_bw_dkv`` in one backward of ``tfla.mlstm_sig``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *shape, dt=dtype: torch.randn(*shape, generator=g, device="cuda",  # noqa: E731
                                               dtype=torch.float32).to(dt)
    q, k = rnd(1, bnh, S, D_QK), rnd(1, bnh, S, D_QK)
    v, dh = rnd(1, bnh, S, D_HV), rnd(1, bnh, S, D_HV)
    if gates == "random":
        f = rnd(1, bnh, S, dt=torch.float32) + 3.0
        i = rnd(1, bnh, S, dt=torch.float32)
    else:
        f_pre, i_pre = {"f_closed": (-30.0, 20.0), "f_open": (30.0, -30.0)}[gates]
        f = torch.full((1, bnh, S), f_pre, device="cuda")
        i = torch.full((1, bnh, S), i_pre, device="cuda")
    for t in (q, k, v, i, f):
        t.requires_grad_(True)
    seen = {}
    orig = pbw.parallel_bw_dkv

    def hook(*args, **kwargs):
        seen["call"] = (args, kwargs)
        return orig(*args, **kwargs)

    pbw.parallel_bw_dkv = hook
    try:
        out = tfla.mlstm_sig(q, k, v, i, f, chunk_size=L, return_last_state=has_dc_last)
        if has_dc_last:
            h, (C_S, _) = out
            torch.autograd.backward([h, C_S], [dh, rnd(*C_S.shape, dt=C_S.dtype)])
        else:
            out.backward(dh)
    finally:
        pbw.parallel_bw_dkv = orig
    assert "call" in seen, "the backward did not call parallel_bw_dkv"
    return seen["call"]


def run_triton(args, kwargs):
    return pbw.parallel_bw_dkv(*args, **dict(kwargs, tuning=TRITON))


def run_gluon(args, kwargs):
    q, k, v, gates, _, _, dC_st, dh = args
    b_vec, a_vec, i_vec, _ = gates
    return gonce.parallel_bw_dkv_once_gluon(q, k, v, b_vec, i_vec, a_vec, dC_st, dh,
                                            L=kwargs["L"], has_dc_last=kwargs["has_dc_last"])


def same(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, bool]:
    """(torch.equal, the same bits)."""
    ints = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
    return torch.equal(a, b), torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


def check_case(bnh, S, gates, has_dc_last, dtype, seed) -> bool:
    args, kwargs = captured_inputs(bnh, S, gates, has_dc_last, dtype, seed)
    q, k, v, _, _, _, dC_st, dh = args
    assert kwargs["L"] == L and not kwargs["is_exp"] and not kwargs["normalize"]
    assert kwargs["has_dc_last"] == has_dc_last
    cfg = pbw.bw_config(L, D_QK, D_HV, q.dtype, TRITON)
    assert cfg["ONCE_DKV"] and not cfg["FUSED_DKV"], cfg   # the Triton side: _dkv_once_kernel
    assert gonce.applies_dkv_once(pbw.bw_config(L, D_QK, D_HV, q.dtype), q, k, v, dC_st, dh,
                                  L=L, is_exp=False, normalize=False)
    ref = run_triton(args, kwargs)
    got = run_gluon(args, kwargs)
    torch.cuda.synchronize()
    ok, parts = True, []
    for name, r, x in zip(("dk", "dv", "kdk"), ref, got):
        eq, bits = same(r, x)
        diff = (r.float() - x.float()).abs().nan_to_num(nan=float("inf")).max().item()
        both_nan = bool((r.isnan() & x.isnan()).any())
        ok &= eq or bits
        parts.append(f"{name} equal={eq} bits={bits} max|diff|={diff:.3g}"
                     + (" (NaN in both)" if both_nan else ""))
    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
    print(f"{'ok  ' if ok else 'FAIL'} {dt} bh={bnh:2d} S={S:5d} gates={gates:9s} "
          f"has_dc_last={has_dc_last!s:5s} | " + "; ".join(parts), flush=True)
    return ok


def median_ms(fn, warmup: int = 10, reps: int = 50) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name(), "| bw_config(256, 256, 512, bf16):",
          {k: v for k, v in pbw.bw_config(L, D_QK, D_HV, torch.bfloat16).items()
           if k.startswith("DKV_") or k in ("ONCE_DKV", "GLUON")})
    all_ok, seed = True, 0
    cases = [(bnh, S, gates, dcl, torch.bfloat16) for bnh in (2, 64) for S in (8192, 1000, 300)
             for gates in GATES for dcl in (False, True)]
    cases += [(2, S, gates, dcl, torch.float16) for S in (8192, 1000, 300)
              for gates in GATES for dcl in (False, True)]
    for bnh, S, gates, dcl, dtype in cases:
        seed += 1
        all_ok &= check_case(bnh, S, gates, dcl, dtype, seed)
        torch.cuda.empty_cache()

    args, kwargs = captured_inputs(64, 8192, "random", False, torch.bfloat16, 1234)
    t_tri = median_ms(lambda: run_triton(args, kwargs))
    t_glu = median_ms(lambda: run_gluon(args, kwargs))
    print(f"time b·heads 64, S 8192, bf16: _dkv_once_kernel {t_tri:.3f} ms, "
          f"Gluon {t_glu:.3f} ms ({t_tri / t_glu:.2f}x)")
    print("ALL BIT-FOR-BIT EQUAL" if all_ok else "SOME CASES DIFFER")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
