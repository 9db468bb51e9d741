"""mLSTMsig backward recurrent kernel: the state gradients dC at the segment ends.

docs/tfla-kernels.md 3.2 (eqs. 63-64): dC_{k-1} = exp(g_k) dC_k + Q̄^(k)ᵀ dH̃^(k), run from
dC_last (or 0) backwards; Q̄ = exp(b) ⊙ Q·scale, dH̃ = dH (or dH/(n_out+eps) if normalised).
Stepped in tiles of BLR positions; the gradient is stored only at the end of each segment
(entry p = gradient w.r.t. the state after segment p), which is what the fused dK/dV
kernel starts from. Grid: (d_qk / BDQK_R, d_hv / BDHV_R, B*NH).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import logsigmoid


@triton.jit
def _sig_bwd_recurrent_kernel(
    Q, DH, F, NOUT, DCL, DCS,
    S, DQK, DHV, seg_len, n_seg, scale, eps,
    s_q_bh, s_q_s, s_h_bh, s_h_s,
    HAS_DCL: tl.constexpr, NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr,
    DOT_PREC: tl.constexpr, BLR: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dk = pk * BDQK + tl.arange(0, BDQK)
    dv = pv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    cmask = mk[:, None] & mv[None, :]
    if HAS_DCL:
        dC = tl.load(DCL + bh * DQK * DHV + dk[:, None] * DHV + dv[None, :], mask=cmask,
                     other=0.0).to(tl.float32)
    else:
        dC = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    for pp in range(0, n_seg):
        p = n_seg - 1 - pp
        tl.store(DCS + (bh * n_seg + p) * DQK * DHV + dk[:, None] * DHV + dv[None, :], dC,
                 mask=cmask)
        if p > 0:
            n_steps = seg_len // BLR
            for jj in range(0, n_steps):
                t0 = p * seg_len + (n_steps - 1 - jj) * BLR
                t = t0 + tl.arange(0, BLR)
                mt = t < S
                q = tl.load(Q + bh * s_q_bh + t[:, None] * s_q_s + dk[None, :],
                            mask=mt[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                dh = tl.load(DH + bh * s_h_bh + t[:, None] * s_h_s + dv[None, :],
                             mask=mt[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                if NORMALIZE:
                    nout = tl.load(NOUT + bh * S + t, mask=mt, other=1.0)
                    dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
                lf = tl.where(mt, logsigmoid(tl.load(F + bh * S + t, mask=mt, other=0.0).to(tl.float32)), 0.0)
                b = tl.cumsum(lf, axis=0)
                g = tl.sum(lf, axis=0)
                qbar = q.to(tl.float32) * (tl.exp(b) * scale)[:, None]
                dC = dC * tl.exp(g) + tl.dot(tl.trans(qbar.to(DOT_DT)), dh.to(DOT_DT),
                                             input_precision=DOT_PREC)


def sig_bwd_recurrent(q, dh, f, n_out, dC_last, cfg, *, normalize, eps, dot_dt, dot_prec):
    """dC at the end of each segment: (BH, n_seg, d_qk, d_hv) fp32.

    q (BH, S, d_qk), dh (BH, S, d_hv) contiguous; f (BH, S); n_out (BH, S) fp32 if normalised;
    dC_last (BH, d_qk, d_hv) or None.
    """
    BH, S, d_qk = q.shape
    d_hv = dh.shape[-1]
    DCS = torch.empty((BH, cfg.n_seg, d_qk, d_hv), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(d_qk, cfg.BDQK_R), triton.cdiv(d_hv, cfg.BDHV_R), BH)
    _sig_bwd_recurrent_kernel[grid](
        q, dh, f, n_out if n_out is not None else DCS, dC_last if dC_last is not None else DCS,
        DCS, S, d_qk, d_hv, cfg.chunks_per_seg * cfg.L, cfg.n_seg, d_qk ** -0.5, eps,
        q.stride(0), q.stride(1), dh.stride(0), dh.stride(1),
        HAS_DCL=dC_last is not None, NORMALIZE=normalize, DOT_DT=dot_dt, DOT_PREC=dot_prec,
        BLR=cfg.BLR, BDQK=cfg.BDQK_R, BDHV=cfg.BDHV_R, num_warps=cfg.num_warps_r, num_stages=1,
    )
    return DCS
