"""mLSTMsig backward parallel kernels: dQ, dK, dV and the gate gradients.

docs/tfla-kernels.md 3.3 (per-chunk gradients, eqs. 57-62, 71-78) and 3.4 (gate gradients
by the identity route), with the recurrences fused in as in the forward:

* ``_sig_bwd_dq_kernel`` (program: d_hv block jv, segment, b*NH) walks its chunks forwards,
  carrying C (d_qk x BDHV), and adds its d_hv block's share of
      dQ^(k) = scale·[ (dH̃ Vᵀ ⊙ D) K + exp(b) ⊙ (dH̃ C_{k-1}ᵀ) ]
  into an fp32 buffer (atomic add when there are several d_hv blocks).
* ``_sig_bwd_dkdv_kernel`` (same grid) walks its chunks backwards, carrying dC, and writes
      dV^(k) = (S·scale ⊙ D)ᵀ dH̃ + (exp(a) ⊙ K) dC_k            (complete for its block)
      dK^(k) = scale·(dH̃ Vᵀ ⊙ D)ᵀ Q + exp(a) ⊙ (V dC_kᵀ)         (its block's share, fp32)
      dC_{k-1} = exp(g) dC_k + Q̄ᵀ dH̃
* ``_sig_bwd_epilogue_kernel`` casts dq, dk to the input dtype and emits the fp32 row sums
  q·dq and k·dk from the fp32 accumulators (docs 4.5: before any rounding); the host then
  forms dī = k·dk, df̄ = revcumsum(q·dq − k·dk) + ⟨dC_last, C_S⟩ and the sigmoid factors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import (add_tile, can_use_tma, descriptor, exp_nonpos, interpret_mode,
                                launch, load_tile, store_tile)


@triton.jit
def _sig_bwd_dq_kernel(
    K, V, DH, GB, GI, NOUT, CS, DQ32,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_k_bh, s_k_s, s_v_bh, s_v_s, s_h_bh, s_h_s,
    NORMALIZE: tl.constexpr, HAS_CS: tl.constexpr, ATOMIC: tl.constexpr,
    DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BL: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    jv = tl.program_id(0)
    seg = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    cmask = mk[:, None] & mv[None, :]
    if HAS_CS:
        C = tl.load(CS + (bh * n_seg + seg) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                    mask=cmask, other=0.0)
    else:
        C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    rows = tl.arange(0, BL)
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    for cc in range(0, chunks_per_seg):
        c = c_begin + cc
        if c < c_end:
            t0 = c * L
            t_last = tl.minimum(t0 + L, S) - 1
            g = tl.load(GB + bh * S + t_last)
            for iq in range(0, L // BL):
                if t0 + iq * BL < S:
                    tq = t0 + iq * BL + tl.arange(0, BL)
                    mq = tq < S
                    dh = tl.load(DH + bh * s_h_bh + tq[:, None] * s_h_s + dv[None, :],
                                 mask=mq[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                    if NORMALIZE:
                        nout = tl.load(NOUT + bh * S + tq, mask=mq, other=1.0)
                        dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
                    else:
                        dh = dh.to(DOT_DT)
                    bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                    acc = tl.dot(dh, tl.trans(C.to(DOT_DT)), input_precision=DOT_PREC)
                    acc = acc * exp_nonpos(bq)[:, None]
                    for jk in range(0, iq + 1):
                        tk = t0 + jk * BL + tl.arange(0, BL)
                        mkv = tk < S
                        k = tl.load(K + bh * s_k_bh + tk[:, None] * s_k_s + dk[None, :],
                                    mask=mkv[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                        v = tl.load(V + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                                    mask=mkv[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                        bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
                        ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
                        dt = bq[:, None] - bk[None, :] + ik[None, :]
                        if jk == iq:
                            dt = tl.where(rows[:, None] >= rows[None, :], dt, float("-inf"))
                        ds = tl.dot(dh, tl.trans(v.to(DOT_DT)), input_precision=DOT_PREC) * exp_nonpos(dt)
                        acc = tl.dot(ds.to(DOT_DT), k.to(DOT_DT), acc=acc, input_precision=DOT_PREC)
                    acc = acc * scale
                    ptrs = DQ32 + bh * S * DQK + tq[:, None] * DQK + dk[None, :]
                    if ATOMIC:
                        tl.atomic_add(ptrs, acc, mask=mq[:, None] & mk[None, :], sem="relaxed")
                    else:
                        tl.store(ptrs, acc, mask=mq[:, None] & mk[None, :])
            if c < c_end - 1:
                C = C * exp_nonpos(g)
                for jk in range(0, L // BL):
                    if t0 + jk * BL < S:
                        tk = t0 + jk * BL + tl.arange(0, BL)
                        mkv = tk < S
                        k = tl.load(K + bh * s_k_bh + tk[:, None] * s_k_s + dk[None, :],
                                    mask=mkv[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                        v = tl.load(V + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                                    mask=mkv[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                        bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
                        ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
                        kbar = k.to(tl.float32) * exp_nonpos(g - bk + ik)[:, None]
                        C = tl.dot(tl.trans(kbar.to(DOT_DT)), v.to(DOT_DT), acc=C,
                                   input_precision=DOT_PREC)


@triton.jit
def _sig_bwd_dkdv_kernel(
    Q, K, V, DH, GB, GI, NOUT, DCS, DK32, DVO, DC0,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_q_bh, s_q_s, s_k_bh, s_k_s, s_v_bh, s_v_s, s_h_bh, s_h_s, s_dv_bh, s_dv_s,
    NORMALIZE: tl.constexpr, HAS_DCS: tl.constexpr, ATOMIC: tl.constexpr,
    WRITE_DC0: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BL: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    jv = tl.program_id(0)
    seg = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    cmask = mk[:, None] & mv[None, :]
    if HAS_DCS:
        dC = tl.load(DCS + (bh * n_seg + seg) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                     mask=cmask, other=0.0)
    else:
        dC = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    rows = tl.arange(0, BL)
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    NT: tl.constexpr = L // BL
    for cc in range(0, chunks_per_seg):
        c = c_end - 1 - cc
        if c >= c_begin:
            t0 = c * L
            t_last = tl.minimum(t0 + L, S) - 1
            g = tl.load(GB + bh * S + t_last)
            for jk in range(0, NT):
                if t0 + jk * BL < S:
                    tk = t0 + jk * BL + tl.arange(0, BL)
                    mkv = tk < S
                    k = tl.load(K + bh * s_k_bh + tk[:, None] * s_k_s + dk[None, :],
                                mask=mkv[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                    v = tl.load(V + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                                mask=mkv[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                    bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
                    ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
                    abar = exp_nonpos(g - bk + ik)
                    dCd = dC.to(DOT_DT)
                    kbar = (k.to(tl.float32) * abar[:, None]).to(DOT_DT)
                    acc_v = tl.dot(kbar, dCd, input_precision=DOT_PREC)
                    acc_k = tl.dot(v, tl.trans(dCd), input_precision=DOT_PREC) * abar[:, None]
                    for iq in range(jk, NT):
                        if t0 + iq * BL < S:
                            tq = t0 + iq * BL + tl.arange(0, BL)
                            mq = tq < S
                            q = tl.load(Q + bh * s_q_bh + tq[:, None] * s_q_s + dk[None, :],
                                        mask=mq[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                            dh = tl.load(DH + bh * s_h_bh + tq[:, None] * s_h_s + dv[None, :],
                                         mask=mq[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                            if NORMALIZE:
                                nout = tl.load(NOUT + bh * S + tq, mask=mq, other=1.0)
                                dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
                            else:
                                dh = dh.to(DOT_DT)
                            bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                            # transposed decay: dT[s, r] = b_r - b_s + ī_s  (kv row s, q column r)
                            dT = bq[None, :] - bk[:, None] + ik[:, None]
                            if iq == jk:
                                dT = tl.where(rows[None, :] >= rows[:, None], dT, float("-inf"))
                            DT = exp_nonpos(dT)
                            sT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * (scale * DT)
                            acc_v = tl.dot(sT.to(DOT_DT), dh, acc=acc_v, input_precision=DOT_PREC)
                            dsT = tl.dot(v, tl.trans(dh), input_precision=DOT_PREC) * (scale * DT)
                            acc_k = tl.dot(dsT.to(DOT_DT), q, acc=acc_k, input_precision=DOT_PREC)
                    tl.store(DVO + bh * s_dv_bh + tk[:, None] * s_dv_s + dv[None, :],
                             acc_v.to(DVO.dtype.element_ty), mask=mkv[:, None] & mv[None, :])
                    ptrs = DK32 + bh * S * DQK + tk[:, None] * DQK + dk[None, :]
                    if ATOMIC:
                        tl.atomic_add(ptrs, acc_k, mask=mkv[:, None] & mk[None, :], sem="relaxed")
                    else:
                        tl.store(ptrs, acc_k, mask=mkv[:, None] & mk[None, :])
            # dC_{k-1} = exp(g) dC_k + Q̄ᵀ dH̃
            dC = dC * exp_nonpos(g)
            for iq in range(0, NT):
                if t0 + iq * BL < S:
                    tq = t0 + iq * BL + tl.arange(0, BL)
                    mq = tq < S
                    q = tl.load(Q + bh * s_q_bh + tq[:, None] * s_q_s + dk[None, :],
                                mask=mq[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                    dh = tl.load(DH + bh * s_h_bh + tq[:, None] * s_h_s + dv[None, :],
                                 mask=mq[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                    if NORMALIZE:
                        nout = tl.load(NOUT + bh * S + tq, mask=mq, other=1.0)
                        dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
                    else:
                        dh = dh.to(DOT_DT)
                    bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                    qbar = q.to(tl.float32) * (exp_nonpos(bq) * scale)[:, None]
                    dC = tl.dot(tl.trans(qbar.to(DOT_DT)), dh, acc=dC, input_precision=DOT_PREC)
    if WRITE_DC0:
        if seg == 0:
            tl.store(DC0 + bh * DQK * DHV + dk[:, None] * DHV + dv[None, :], dC, mask=cmask)


@triton.jit
def _sig_bwd_dq_flat_kernel(
    KD, VD, DHD, DQD, K, V, DH, DQ32, GB, GI, NOUT, CS,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_k_bh, s_k_s, s_v_bh, s_v_s,
    NORMALIZE: tl.constexpr, HAS_CS: tl.constexpr, ADD_MODE: tl.constexpr,
    USE_TMA: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    """dQ when a chunk is one tile: flat forward loop carrying C (see the module doc)."""
    jv = tl.program_id(0)
    seg = tl.program_id(1)
    bh = tl.program_id(2)
    bh64 = bh.to(tl.int64)
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    if HAS_CS:
        C = tl.load(CS + (bh64 * n_seg + seg) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                    mask=mk[:, None] & mv[None, :], other=0.0)
    else:
        C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    rows = tl.arange(0, L)
    causal = rows[:, None] >= rows[None, :]
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    for c in range(c_begin, c_end):
        t0 = c * L
        t = t0 + rows
        mt = t < S
        k = load_tile(KD, K, bh, t0, 0, s_k_bh, s_k_s, S, DQK, L, BDQK, USE_TMA).to(DOT_DT)
        v = load_tile(VD, V, bh, t0, jv * BDHV, s_v_bh, s_v_s, S, DHV, L, BDHV, USE_TMA).to(DOT_DT)
        dh = load_tile(DHD, DH, bh, t0, jv * BDHV, s_v_bh, s_v_s, S, DHV, L, BDHV, USE_TMA)
        b = tl.load(GB + bh64 * S + t, mask=mt, other=0.0)
        ii = tl.load(GI + bh64 * S + t, mask=mt, other=float("-inf"))
        g = tl.load(GB + bh64 * S + tl.minimum(t0 + L, S) - 1)
        if NORMALIZE:
            nout = tl.load(NOUT + bh64 * S + t, mask=mt, other=1.0)
            dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
        else:
            dh = dh.to(DOT_DT)
        acc = tl.dot(dh, tl.trans(C.to(DOT_DT)), input_precision=DOT_PREC) * exp_nonpos(b)[:, None]
        dmat = exp_nonpos(tl.where(causal, b[:, None] - b[None, :] + ii[None, :], float("-inf")))
        ds = tl.dot(dh, tl.trans(v), input_precision=DOT_PREC) * dmat
        acc = tl.dot(ds.to(DOT_DT), k, acc=acc, input_precision=DOT_PREC) * scale
        add_tile(DQD, DQ32, acc, bh, t0, 0, S * DQK, DQK, S, DQK, L, BDQK, ADD_MODE)
        kbar = (k.to(tl.float32) * exp_nonpos(g - b + ii)[:, None]).to(DOT_DT)
        C = tl.dot(tl.trans(kbar), v, acc=C * exp_nonpos(g), input_precision=DOT_PREC)


@triton.jit
def _sig_bwd_dkdv_flat_kernel(
    QD, KD, VD, DHD, DVD, DKD, Q, K, V, DH, DVO, DK32, GB, GI, NOUT, DCS, DC0,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_q_bh, s_q_s, s_v_bh, s_v_s,
    NORMALIZE: tl.constexpr, HAS_DCS: tl.constexpr, ADD_MODE: tl.constexpr,
    WRITE_DC0: tl.constexpr, USE_TMA: tl.constexpr, DOT_DT: tl.constexpr,
    DOT_PREC: tl.constexpr, L: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    """dK, dV when a chunk is one tile: flat backward loop carrying dC."""
    jv = tl.program_id(0)
    seg = tl.program_id(1)
    bh = tl.program_id(2)
    bh64 = bh.to(tl.int64)
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    cmask = mk[:, None] & mv[None, :]
    if HAS_DCS:
        dC = tl.load(DCS + (bh64 * n_seg + seg) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                     mask=cmask, other=0.0)
    else:
        dC = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    rows = tl.arange(0, L)
    # transposed decay DT[s, r] = exp(b_r - b_s + ī_s) for r >= s (kv row s, q column r)
    causal_t = rows[None, :] >= rows[:, None]
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    for cc in range(0, c_end - c_begin):
        c = c_end - 1 - cc
        t0 = c * L
        t = t0 + rows
        mt = t < S
        q = load_tile(QD, Q, bh, t0, 0, s_q_bh, s_q_s, S, DQK, L, BDQK, USE_TMA).to(DOT_DT)
        k = load_tile(KD, K, bh, t0, 0, s_q_bh, s_q_s, S, DQK, L, BDQK, USE_TMA).to(DOT_DT)
        v = load_tile(VD, V, bh, t0, jv * BDHV, s_v_bh, s_v_s, S, DHV, L, BDHV, USE_TMA).to(DOT_DT)
        dh = load_tile(DHD, DH, bh, t0, jv * BDHV, s_v_bh, s_v_s, S, DHV, L, BDHV, USE_TMA)
        b = tl.load(GB + bh64 * S + t, mask=mt, other=0.0)
        ii = tl.load(GI + bh64 * S + t, mask=mt, other=float("-inf"))
        g = tl.load(GB + bh64 * S + tl.minimum(t0 + L, S) - 1)
        if NORMALIZE:
            nout = tl.load(NOUT + bh64 * S + t, mask=mt, other=1.0)
            dh = (dh.to(tl.float32) / (nout + eps)[:, None]).to(DOT_DT)
        else:
            dh = dh.to(DOT_DT)
        abar = exp_nonpos(g - b + ii)
        dCd = dC.to(DOT_DT)
        acc_v = tl.dot((k.to(tl.float32) * abar[:, None]).to(DOT_DT), dCd, input_precision=DOT_PREC)
        acc_k = tl.dot(v, tl.trans(dCd), input_precision=DOT_PREC) * abar[:, None]
        DT = exp_nonpos(tl.where(causal_t, b[None, :] - b[:, None] + ii[:, None], float("-inf"))) * scale
        sT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * DT
        acc_v = tl.dot(sT.to(DOT_DT), dh, acc=acc_v, input_precision=DOT_PREC)
        dsT = tl.dot(v, tl.trans(dh), input_precision=DOT_PREC) * DT
        acc_k = tl.dot(dsT.to(DOT_DT), q, acc=acc_k, input_precision=DOT_PREC)
        store_tile(DVD, DVO, acc_v.to(DVO.dtype.element_ty), bh, t0, jv * BDHV, s_v_bh, s_v_s,
                   S, DHV, L, BDHV, USE_TMA)
        add_tile(DKD, DK32, acc_k, bh, t0, 0, S * DQK, DQK, S, DQK, L, BDQK, ADD_MODE)
        qbar = (q.to(tl.float32) * (exp_nonpos(b) * scale)[:, None]).to(DOT_DT)
        dC = tl.dot(tl.trans(qbar), dh, acc=dC * exp_nonpos(g), input_precision=DOT_PREC)
    if WRITE_DC0:
        if seg == 0:
            tl.store(DC0 + bh64 * DQK * DHV + dk[:, None] * DHV + dv[None, :], dC, mask=cmask)


@triton.jit
def _sig_bwd_epilogue_kernel(Q, K, DQ32, DK32, DQ, DK, QDQ, KDK, S, DQK,
                             s_q_bh, s_q_s, BT: tl.constexpr, BDQK: tl.constexpr):
    pt = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    t = pt * BT + tl.arange(0, BT)
    d = tl.arange(0, BDQK)
    mt = t < S
    m2 = mt[:, None] & (d < DQK)[None, :]
    off_in = bh * s_q_bh + t[:, None] * s_q_s + d[None, :]
    off32 = bh * S * DQK + t[:, None] * DQK + d[None, :]
    q = tl.load(Q + off_in, mask=m2, other=0.0).to(tl.float32)
    k = tl.load(K + off_in, mask=m2, other=0.0).to(tl.float32)
    dq = tl.load(DQ32 + off32, mask=m2, other=0.0)
    dkk = tl.load(DK32 + off32, mask=m2, other=0.0)
    tl.store(DQ + off32, dq.to(DQ.dtype.element_ty), mask=m2)
    tl.store(DK + off32, dkk.to(DK.dtype.element_ty), mask=m2)
    tl.store(QDQ + bh * S + t, tl.sum(q * dq, axis=1), mask=mt)
    tl.store(KDK + bh * S + t, tl.sum(k * dkk, axis=1), mask=mt)


def sig_bwd_parallel(q, k, v, dh, gb, gi, n_out, CS, DCS, cfg, *, normalize, eps,
                     want_dC0, dot_dt, dot_prec):
    """dq, dk, dv (BH, S, d) in q's dtype, row sums q·dq and k·dk (BH, S) fp32, dC0 or None.

    q, k (BH, S, d_qk), v, dh (BH, S, d_hv) contiguous; gb, gi, n_out (BH, S) fp32;
    CS: forward segment-start states (BH, n_seg, d_qk, d_hv) or None (zero start, one
    segment); DCS: state gradients at the segment ends or None (zero, one segment).
    """
    BH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    atomic = cfg.n_jv_b > 1
    alloc = torch.zeros if atomic else torch.empty
    dq32 = alloc((BH, S, d_qk), dtype=torch.float32, device=q.device)
    dk32 = alloc((BH, S, d_qk), dtype=torch.float32, device=q.device)
    dv = torch.empty((BH, S, d_hv), dtype=q.dtype, device=q.device)
    dC0 = torch.empty((BH, d_qk, d_hv), dtype=torch.float32, device=q.device) if want_dC0 else None
    dummy = dq32
    grid = (cfg.n_jv_b, cfg.n_seg, BH)
    if cfg.BL == cfg.L:
        L = cfg.L
        use_tma = cfg.use_tma_b and can_use_tma(q, k, v, dh, dv, dq32,
                                             blocks=(cfg.BDQK, cfg.BDHV_B, L))
        add_mode = (2 if (use_tma and not interpret_mode()) else 1) if atomic else 0
        D = lambda t, bd: descriptor(t, (1, L, bd), use_tma)
        flat = dict(NORMALIZE=normalize, DOT_DT=dot_dt, DOT_PREC=dot_prec, L=L, BDQK=cfg.BDQK,
                    BDHV=cfg.BDHV_B, USE_TMA=use_tma, ADD_MODE=add_mode,
                    num_warps=cfg.num_warps_b, num_stages=cfg.num_stages_b)
        launch(_sig_bwd_dq_flat_kernel, grid, cfg,
            D(k, cfg.BDQK), D(v, cfg.BDHV_B), D(dh, cfg.BDHV_B), D(dq32, cfg.BDQK),
            k, v, dh, dq32, gb, gi, n_out if normalize else dummy, CS if CS is not None else dummy,
            S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            HAS_CS=CS is not None, **flat)
        launch(_sig_bwd_dkdv_flat_kernel, grid, cfg,
            D(q, cfg.BDQK), D(k, cfg.BDQK), D(v, cfg.BDHV_B), D(dh, cfg.BDHV_B), D(dv, cfg.BDHV_B),
            D(dk32, cfg.BDQK), q, k, v, dh, dv, dk32, gb, gi, n_out if normalize else dummy,
            DCS if DCS is not None else dummy, dC0 if want_dC0 else dummy,
            S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
            q.stride(0), q.stride(1), v.stride(0), v.stride(1),
            HAS_DCS=DCS is not None, WRITE_DC0=want_dC0, **flat)
    else:
        common = dict(NORMALIZE=normalize, DOT_DT=dot_dt, DOT_PREC=dot_prec, L=cfg.L, BL=cfg.BL,
                      BDQK=cfg.BDQK, BDHV=cfg.BDHV_B, num_warps=cfg.num_warps_b,
                      num_stages=cfg.num_stages_b)
        launch(_sig_bwd_dq_kernel, grid, cfg,
            k, v, dh, gb, gi, n_out if normalize else dummy, CS if CS is not None else dummy, dq32,
            S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), dh.stride(0), dh.stride(1),
            HAS_CS=CS is not None, ATOMIC=atomic, **common)
        launch(_sig_bwd_dkdv_kernel, grid, cfg,
            q, k, v, dh, gb, gi, n_out if normalize else dummy, DCS if DCS is not None else dummy,
            dk32, dv, dC0 if want_dC0 else dummy,
            S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dh.stride(0), dh.stride(1), dv.stride(0), dv.stride(1),
            HAS_DCS=DCS is not None, ATOMIC=atomic, WRITE_DC0=want_dC0, **common)
    dq = torch.empty((BH, S, d_qk), dtype=q.dtype, device=q.device)
    dk = torch.empty_like(dq)
    qdq = torch.empty((BH, S), dtype=torch.float32, device=q.device)
    kdk = torch.empty_like(qdq)
    BT = 64 if cfg.BDQK <= 256 else 16
    _sig_bwd_epilogue_kernel[(triton.cdiv(S, BT), BH)](
        q, k, dq32, dk32, dq, dk, qdq, kdk, S, d_qk, q.stride(0), q.stride(1),
        BT=BT, BDQK=cfg.BDQK, num_warps=4)
    return dq, dk, dv, qdq, kdk, dC0
