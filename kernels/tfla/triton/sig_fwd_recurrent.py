"""mLSTMsig forward recurrent kernel: the states C (and n) at the segment starts.

docs/tfla-kernels.md 2.4 (inter-chunk recurrence, eqs. 39-43 without max state):
C_k = exp(g_k) C_{k-1} + (exp(a_k) ⊙ K^(k))ᵀ V^(k), n_k likewise with V -> 1. The
recurrence is stepped in tiles of BLR positions (any step gives the same states), and the
state is stored only at every segment start (every ``seg_len`` positions), which is all
that the fused parallel kernel needs. Grid: (d_qk / BDQK_R, d_hv / BDHV_R, B*NH).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import logsigmoid


@triton.jit
def _sig_fwd_recurrent_kernel(
    K, V, I, F, C0, N0, CS, NS,
    S, DQK, DHV, seg_len, n_seg,
    s_k_bh, s_k_s, s_v_bh, s_v_s,
    HAS_C0: tl.constexpr, HAS_N0: tl.constexpr, WITH_N: tl.constexpr, DOT_DT: tl.constexpr,
    DOT_PREC: tl.constexpr, BLR: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dk = pk * BDQK + tl.arange(0, BDQK)
    dv = pv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    c_off = bh * DQK * DHV + dk[:, None] * DHV + dv[None, :]
    cmask = mk[:, None] & mv[None, :]
    if HAS_C0:
        C = tl.load(C0 + c_off, mask=cmask, other=0.0).to(tl.float32)
    else:
        C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    if HAS_N0:
        n = tl.load(N0 + bh * DQK + dk, mask=mk, other=0.0).to(tl.float32)
    else:
        n = tl.zeros([BDQK], dtype=tl.float32)
    for p in range(0, n_seg):
        tl.store(CS + (bh * n_seg + p) * DQK * DHV + dk[:, None] * DHV + dv[None, :], C, mask=cmask)
        if WITH_N:
            if pv == 0:
                tl.store(NS + (bh * n_seg + p) * DQK + dk, n, mask=mk)
        if p < n_seg - 1:
            for t0 in range(p * seg_len, (p + 1) * seg_len, BLR):
                t = t0 + tl.arange(0, BLR)
                mt = t < S
                k = tl.load(K + bh * s_k_bh + t[:, None] * s_k_s + dk[None, :],
                            mask=mt[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                v = tl.load(V + bh * s_v_bh + t[:, None] * s_v_s + dv[None, :],
                            mask=mt[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                lf = tl.where(mt, logsigmoid(tl.load(F + bh * S + t, mask=mt, other=0.0).to(tl.float32)), 0.0)
                li = logsigmoid(tl.load(I + bh * S + t, mask=mt, other=0.0).to(tl.float32))
                # a_r = sum_{s > r} lf_s + li_r  (exclusive reverse cumsum), g = sum lf
                a = tl.cumsum(lf, axis=0, reverse=True) - lf + li
                a = tl.where(mt, a, float("-inf"))
                g = tl.sum(lf, axis=0)
                kbar = k.to(tl.float32) * tl.exp(a)[:, None]
                C = C * tl.exp(g) + tl.dot(tl.trans(kbar.to(DOT_DT)), v.to(DOT_DT),
                                           input_precision=DOT_PREC)
                if WITH_N:
                    n = n * tl.exp(g) + tl.sum(kbar, axis=0)


def sig_fwd_recurrent(k, v, i, f, C0, n0, cfg, *, with_n: bool, dot_dt, dot_prec):
    """States at the start of each of ``cfg.n_seg`` segments.

    k (BH, S, d_qk), v (BH, S, d_hv) contiguous; i, f (BH, S); C0 (BH, d_qk, d_hv) or None,
    n0 (BH, d_qk) or None. Returns CS (BH, n_seg, d_qk, d_hv) fp32 and NS (BH, n_seg, d_qk)
    fp32 or None.
    """
    BH, S, d_qk = k.shape
    d_hv = v.shape[-1]
    n_seg = cfg.n_seg
    CS = torch.empty((BH, n_seg, d_qk, d_hv), dtype=torch.float32, device=k.device)
    NS = torch.zeros((BH, n_seg, d_qk), dtype=torch.float32, device=k.device) if with_n else CS
    grid = (triton.cdiv(d_qk, cfg.BDQK_R), triton.cdiv(d_hv, cfg.BDHV_R), BH)
    _sig_fwd_recurrent_kernel[grid](
        k, v, i, f, C0 if C0 is not None else CS, n0 if n0 is not None else CS, CS, NS,
        S, d_qk, d_hv, cfg.chunks_per_seg * cfg.L, n_seg,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HAS_C0=C0 is not None, HAS_N0=n0 is not None, WITH_N=with_n, DOT_DT=dot_dt,
        DOT_PREC=dot_prec, BLR=cfg.BLR, BDQK=cfg.BDQK_R, BDHV=cfg.BDHV_R,
        num_warps=cfg.num_warps_r, num_stages=1,
    )
    return CS, (NS if with_n else None)
