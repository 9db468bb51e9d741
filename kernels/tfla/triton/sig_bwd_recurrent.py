"""mLSTMsig backward recurrent kernel: the state gradients dC at the segment ends.

docs/tfla-kernels.md 3.2 (eqs. 63-64): dC_{k-1} = exp(g_k) dC_k + Q̄^(k)ᵀ dH̃^(k), from
dC_last (or 0) backwards; Q̄ = exp(b) ⊙ Q·scale, dH̃ = dH (or dH/(n_out+eps) if normalised).
As in the forward, (1) this kernel computes in parallel, for every segment but the first,
the segment's own contribution to the gradient at its start (stepping backwards from zero
in tiles of BLR positions) and its total log forget gate G; (2) ``common.state_combine``
scans dC_end[p-1] = exp(G_p) dC_end[p] + local_p backwards from dC_last.
Entry p of the result is the gradient w.r.t. the state after segment p.
Grid of (1): (d_qk / BDQK_R, d_hv / BDHV_R, B*NH*(n_seg-1)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import exp_nonpos, launch, logsigmoid, state_combine


@triton.jit
def _sig_bwd_local_state_kernel(
    Q, DH, F, NOUT, LOC, G,
    S, DQK, DHV, seg_len, n_seg, scale, eps,
    s_q_bh, s_q_s, s_h_bh, s_h_s,
    NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr,
    DOT_PREC: tl.constexpr, BLR: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    pid = tl.program_id(2)
    bh = (pid // (n_seg - 1)).to(tl.int64)
    p = pid % (n_seg - 1) + 1                      # segments 1 .. n_seg-1
    dk = pk * BDQK + tl.arange(0, BDQK)
    dv = pv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    dC = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    gsum = tl.zeros([1], dtype=tl.float32)
    n_steps = seg_len // BLR
    for jj in range(0, n_steps):
        t0 = p * seg_len + (n_steps - 1 - jj) * BLR
        t = t0 + tl.arange(0, BLR)
        mt = t < S
        q = tl.load(Q + bh * s_q_bh + t[:, None] * s_q_s + dk[None, :],
                    mask=mt[:, None] & mk[None, :], other=0.0)
        dh = tl.load(DH + bh * s_h_bh + t[:, None] * s_h_s + dv[None, :],
                     mask=mt[:, None] & mv[None, :], other=0.0)
        if NORMALIZE:
            nout = tl.load(NOUT + bh * S + t, mask=mt, other=1.0)
            dh = dh.to(tl.float32) / (nout + eps)[:, None]
        lf = tl.where(mt, logsigmoid(tl.load(F + bh * S + t, mask=mt, other=0.0).to(tl.float32)), 0.0)
        b = tl.cumsum(lf, axis=0)
        g = tl.sum(lf, axis=0)
        qbar = q.to(tl.float32) * (exp_nonpos(b) * scale)[:, None]
        dC = tl.dot(tl.trans(qbar.to(DOT_DT)), dh.to(DOT_DT), acc=dC * exp_nonpos(g),
                    input_precision=DOT_PREC)
        gsum += g
    r = bh * (n_seg - 1) + p - 1
    tl.store(LOC + r * DQK * DHV + dk[:, None] * DHV + dv[None, :], dC,
             mask=mk[:, None] & mv[None, :])
    if pk == 0:
        if pv == 0:
            tl.store(G + bh * n_seg + p + tl.arange(0, 1), gsum)


def sig_bwd_recurrent(q, dh, f, n_out, dC_last, cfg, *, normalize, eps, dot_dt, dot_prec):
    """dC at the end of each segment: (BH, n_seg, d_qk, d_hv) fp32 (n_seg >= 2).

    q (BH, S, d_qk), dh (BH, S, d_hv) contiguous; f (BH, S); n_out (BH, S) fp32 if normalised;
    dC_last (BH, d_qk, d_hv) fp32 or None.
    """
    BH, S, d_qk = q.shape
    d_hv = dh.shape[-1]
    n_seg = cfg.n_seg
    loc = torch.empty((BH, n_seg - 1, d_qk, d_hv), dtype=torch.float32, device=q.device)
    G = torch.zeros((BH, n_seg), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(d_qk, cfg.BDQK_R), triton.cdiv(d_hv, cfg.BDHV_R), BH * (n_seg - 1))
    launch(_sig_bwd_local_state_kernel, grid, cfg,
        q, dh, f, n_out if n_out is not None else loc, loc, G,
        S, d_qk, d_hv, cfg.chunks_per_seg * cfg.L, n_seg, d_qk ** -0.5, eps,
        q.stride(0), q.stride(1), dh.stride(0), dh.stride(1),
        NORMALIZE=normalize, DOT_DT=dot_dt, DOT_PREC=dot_prec,
        BLR=cfg.BLR, BDQK=cfg.BDQK_R, BDHV=cfg.BDHV_R, num_warps=cfg.num_warps_r,
        num_stages=cfg.num_stages_r,
    )
    return state_combine(loc.view(BH, n_seg - 1, -1), G,
                         dC_last.reshape(BH, -1) if dC_last is not None else None, n_seg,
                         d_qk * d_hv, reverse=True).view(BH, n_seg, d_qk, d_hv)
