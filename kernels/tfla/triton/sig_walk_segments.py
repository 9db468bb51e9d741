"""mLSTMsig "walk" forward, segment states: C (and n) at the start of each sequence segment.

docs/tfla-kernels.md 2.4 (inter-chunk recurrence, eqs. 39-43 without max state):
C_k = exp(g_k) C_{k-1} + (exp(a_k) ⊙ K^(k))ᵀ V^(k), n_k likewise with V -> 1.

The fused parallel kernel needs the state only at the start of each sequence segment.
Those come in two steps: (1) this kernel computes, for every segment but the last and in
parallel, the segment's own contribution starting from zero (stepping in tiles of BLR
positions; any step gives the same state) and its total log forget gate G; (2)
``common.state_combine`` scans C_{p+1} = exp(G_p) C_p + local_p over the segments.
Grid of (1): (d_qk / BDQK_R, d_hv / BDHV_R, B*NH*(n_seg-1)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import exp_nonpos, launch, logsigmoid, state_combine


@triton.jit
def _segment_local_state_kernel(
    K, V, I, F, LOC, LOCN, G,
    S, DQK, DHV, seg_len, n_seg,
    s_k_bh, s_k_s, s_v_bh, s_v_s,
    WITH_N: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    BLR: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    pid = tl.program_id(2)
    bh = (pid // (n_seg - 1)).to(tl.int64)
    p = pid % (n_seg - 1)
    dk = pk * BDQK + tl.arange(0, BDQK)
    dv = pv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    n = tl.zeros([BDQK], dtype=tl.float32)
    gsum = tl.zeros([1], dtype=tl.float32)
    for t0 in range(p * seg_len, (p + 1) * seg_len, BLR):
        t = t0 + tl.arange(0, BLR)
        mt = t < S
        k = tl.load(K + bh * s_k_bh + t[:, None] * s_k_s + dk[None, :],
                    mask=mt[:, None] & mk[None, :], other=0.0)
        v = tl.load(V + bh * s_v_bh + t[:, None] * s_v_s + dv[None, :],
                    mask=mt[:, None] & mv[None, :], other=0.0).to(DOT_DT)
        lf = tl.where(mt, logsigmoid(tl.load(F + bh * S + t, mask=mt, other=0.0).to(tl.float32)), 0.0)
        li = logsigmoid(tl.load(I + bh * S + t, mask=mt, other=0.0).to(tl.float32))
        # a_r = sum_{s > r} lf_s + li_r (exclusive reverse cumsum), g = sum lf
        a = tl.where(mt, tl.cumsum(lf, axis=0, reverse=True) - lf + li, float("-inf"))
        g = tl.sum(lf, axis=0)
        kbar = k.to(tl.float32) * exp_nonpos(a)[:, None]
        C = tl.dot(tl.trans(kbar.to(DOT_DT)), v, acc=C * exp_nonpos(g), input_precision=DOT_PREC)
        if WITH_N:
            n = n * exp_nonpos(g) + tl.sum(kbar, axis=0)
        gsum += g
    q = bh * (n_seg - 1) + p
    tl.store(LOC + q * DQK * DHV + dk[:, None] * DHV + dv[None, :], C,
             mask=mk[:, None] & mv[None, :])
    if WITH_N:
        if pv == 0:
            tl.store(LOCN + q * DQK + dk, n, mask=mk)
    if pk == 0:
        if pv == 0:
            tl.store(G + bh * n_seg + p + tl.arange(0, 1), gsum)


def walk_segment_states(k, v, i, f, C0, n0, cfg, *, with_n: bool, dot_dt, dot_prec):
    """States at the start of each of ``cfg.n_seg`` segments (n_seg >= 2).

    k (BH, S, d_qk), v (BH, S, d_hv) contiguous; i, f (BH, S); C0 (BH, d_qk, d_hv) fp32 or
    None, n0 (BH, d_qk) fp32 or None. Returns CS (BH, n_seg, d_qk, d_hv) fp32 and
    NS (BH, n_seg, d_qk) fp32 (None unless with_n).
    """
    BH, S, d_qk = k.shape
    d_hv = v.shape[-1]
    n_seg = cfg.n_seg
    loc = torch.empty((BH, n_seg - 1, d_qk, d_hv), dtype=torch.float32, device=k.device)
    locn = torch.empty((BH, n_seg - 1, d_qk), dtype=torch.float32, device=k.device) if with_n else loc
    G = torch.zeros((BH, n_seg), dtype=torch.float32, device=k.device)
    grid = (triton.cdiv(d_qk, cfg.BDQK_R), triton.cdiv(d_hv, cfg.BDHV_R), BH * (n_seg - 1))
    launch(_segment_local_state_kernel, grid, cfg,
        k, v, i, f, loc, locn, G, S, d_qk, d_hv, cfg.chunks_per_seg * cfg.L, n_seg,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        WITH_N=with_n, DOT_DT=dot_dt, DOT_PREC=dot_prec, BLR=cfg.BLR, BDQK=cfg.BDQK_R,
        BDHV=cfg.BDHV_R, num_warps=cfg.num_warps_r, num_stages=cfg.num_stages_r,
    )
    CS = state_combine(loc.view(BH, n_seg - 1, -1), G,
                       C0.reshape(BH, -1) if C0 is not None else None, n_seg, d_qk * d_hv,
                       reverse=False).view(BH, n_seg, d_qk, d_hv)
    NS = None
    if with_n:
        NS = state_combine(locn, G, n0, n_seg, d_qk, reverse=False)
    return CS, NS
