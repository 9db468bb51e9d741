"""mLSTMsig "walk" forward: H for every chunk, with the chunk recurrence fused in (on chip).

Algorithm: docs/tfla-kernels.md 2.4 (chunkwise form, mLSTMsig: no max state) and 4.4/4.8
(the H kernel with the paper's loop fusion for mLSTMsig: the inter term Q̄ C_{k-1} needs no
rescaling, so it is accumulated together with the intra tiles; no online max).

One program = (d_hv block jv, sequence segment, b*NH). It holds its block of the running
state C (d_qk x BDHV, fp32) in registers and walks the chunks of its segment in order:

    for each chunk k:            (L positions, BL-tiles i_q, i_kv; causal tiles only)
        H_iq = Q̄_iq C_{k-1} + Σ_{i_kv <= i_q} (Q_iq K_ikvᵀ·scale ⊙ D) V_ikv
        C_k  = exp(g_k) C_{k-1} + Σ_ikv (exp(a) ⊙ K_ikv)ᵀ V_ikv

so the chunk states never travel through HBM (only the segment-start states, written by
sig_walk_segments.py when there is more than one segment). With ``normalize`` it also
carries n and divides by max(|den|, 1) + eps. Forward only: calls that need gradients run
the tiled kernels (tfla.triton.common.choose_sig_impl).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import can_use_tma, descriptor, exp_nonpos, launch, load_tile, store_tile


@triton.jit
def _h_tile(q, bq, mq, C, n, K, V, GB, GI, bh, t0, iq, S, DQK, DHV, dk, mk, dv, mv,
            s_k_bh, s_k_s, s_v_bh, s_v_s, scale,
            NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
            BL: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr):
    """num (BL x BDHV) and den (BL) of one query tile of a chunk (inter + intra)."""
    qbar = q.to(tl.float32) * (exp_nonpos(bq) * scale)[:, None]
    acc = tl.dot(qbar.to(DOT_DT), C.to(DOT_DT), input_precision=DOT_PREC)
    den = tl.zeros([BL], dtype=tl.float32)
    if NORMALIZE:
        den = tl.sum(qbar * n[None, :], axis=1)
    rows = tl.arange(0, BL)
    for jk in range(0, iq + 1):
        tk = t0 + jk * BL + tl.arange(0, BL)
        mkv = tk < S
        k = tl.load(K + bh * s_k_bh + tk[:, None] * s_k_s + dk[None, :],
                    mask=mkv[:, None] & mk[None, :], other=0.0).to(DOT_DT)
        v = tl.load(V + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                    mask=mkv[:, None] & mv[None, :], other=0.0).to(DOT_DT)
        bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
        ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale
        dt = bq[:, None] - bk[None, :] + ik[None, :]
        if jk == iq:
            dt = tl.where(rows[:, None] >= rows[None, :], dt, float("-inf"))
        sbar = s * exp_nonpos(dt)
        acc += tl.dot(sbar.to(DOT_DT), v, input_precision=DOT_PREC)
        if NORMALIZE:
            den += tl.sum(sbar, axis=1)
    return acc, den


@triton.jit
def _walk_kernel(
    Q, K, V, GB, GI, H, NOUT, CS, NS, CL, NL,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_q_bh, s_q_s, s_k_bh, s_k_s, s_v_bh, s_v_s, s_h_bh, s_h_s,
    NORMALIZE: tl.constexpr, WITH_N: tl.constexpr, HAS_CS: tl.constexpr, HAS_NS: tl.constexpr,
    WRITE_LAST: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
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
        if HAS_NS:
            n = tl.load(NS + (bh * n_seg + seg) * DQK + dk, mask=mk, other=0.0)
        else:
            n = tl.zeros([BDQK], dtype=tl.float32)
    else:
        C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
        n = tl.zeros([BDQK], dtype=tl.float32)
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    last_seg = seg == n_seg - 1
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
                    q = tl.load(Q + bh * s_q_bh + tq[:, None] * s_q_s + dk[None, :],
                                mask=mq[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                    bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                    acc, den = _h_tile(q, bq, mq, C, n, K, V, GB, GI, bh, t0, iq, S, DQK, DHV,
                                       dk, mk, dv, mv, s_k_bh, s_k_s, s_v_bh, s_v_s, scale,
                                       NORMALIZE, DOT_DT, DOT_PREC, BL, BDQK, BDHV)
                    if NORMALIZE:
                        n_out = tl.maximum(tl.abs(den), 1.0)
                        acc = acc / (n_out + eps)[:, None]
                        if jv == 0:
                            tl.store(NOUT + bh * S + tq, n_out, mask=mq)
                    tl.store(H + bh * s_h_bh + tq[:, None] * s_h_s + dv[None, :],
                             acc.to(H.dtype.element_ty), mask=mq[:, None] & mv[None, :])
            # state update C_k = exp(g) C_{k-1} + Σ (exp(a) ⊙ K)ᵀ V   (skipped when unused)
            if (c < c_end - 1) or (WRITE_LAST and last_seg):
                C = C * exp_nonpos(g)
                if WITH_N:
                    n = n * exp_nonpos(g)
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
                        if WITH_N:
                            n += tl.sum(kbar, axis=0)
    if WRITE_LAST:
        if last_seg:
            tl.store(CL + bh * DQK * DHV + dk[:, None] * DHV + dv[None, :], C, mask=cmask)
            if WITH_N:
                if jv == 0:
                    tl.store(NL + bh * DQK + dk, n, mask=mk)


@triton.jit
def _walk_flat_kernel(
    QD, KD, VD, HD, Q, K, V, H, GB, GI, NOUT, CS, NS, CL, NL,
    S, DQK, DHV, n_chunks, chunks_per_seg, n_seg, scale, eps,
    s_q_bh, s_q_s, s_v_bh, s_v_s,
    NORMALIZE: tl.constexpr, WITH_N: tl.constexpr, HAS_CS: tl.constexpr, HAS_NS: tl.constexpr,
    WRITE_LAST: tl.constexpr, USE_TMA: tl.constexpr, DOT_DT: tl.constexpr,
    DOT_PREC: tl.constexpr, L: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
):
    """The H kernel when a chunk is one tile (L = BL): one flat loop over the chunks of a
    segment, tiles through TMA descriptors (USE_TMA) so that Triton can prefetch the next
    chunk while this one computes (num_stages). q, k, v, h are (BH, S, d) contiguous."""
    jv = tl.program_id(0)
    seg = tl.program_id(1)
    bh = tl.program_id(2)
    bh64 = bh.to(tl.int64)
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < DQK
    mv = dv < DHV
    cmask = mk[:, None] & mv[None, :]
    if HAS_CS:
        C = tl.load(CS + (bh64 * n_seg + seg) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                    mask=cmask, other=0.0)
    else:
        C = tl.zeros([BDQK, BDHV], dtype=tl.float32)
    if HAS_NS:
        n = tl.load(NS + (bh64 * n_seg + seg) * DQK + dk, mask=mk, other=0.0)
    else:
        n = tl.zeros([BDQK], dtype=tl.float32)
    rows = tl.arange(0, L)
    causal = rows[:, None] >= rows[None, :]
    c_begin = seg * chunks_per_seg
    c_end = tl.minimum(c_begin + chunks_per_seg, n_chunks)
    for c in range(c_begin, c_end):
        t0 = c * L
        t = t0 + rows
        mt = t < S
        q = load_tile(QD, Q, bh, t0, 0, s_q_bh, s_q_s, S, DQK, L, BDQK, USE_TMA).to(DOT_DT)
        k = load_tile(KD, K, bh, t0, 0, s_q_bh, s_q_s, S, DQK, L, BDQK, USE_TMA).to(DOT_DT)
        v = load_tile(VD, V, bh, t0, jv * BDHV, s_v_bh, s_v_s, S, DHV, L, BDHV, USE_TMA).to(DOT_DT)
        b = tl.load(GB + bh64 * S + t, mask=mt, other=0.0)
        ii = tl.load(GI + bh64 * S + t, mask=mt, other=float("-inf"))
        g = tl.load(GB + bh64 * S + tl.minimum(t0 + L, S) - 1)
        # inter term Q̄ C = diag(exp(b)·scale) (Q C): the row scaling is applied in fp32
        wq = exp_nonpos(b) * scale
        acc = tl.dot(q, C.to(DOT_DT), input_precision=DOT_PREC) * wq[:, None]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        dmat = exp_nonpos(tl.where(causal, b[:, None] - b[None, :] + ii[None, :], float("-inf")))
        sbar = s * (dmat * scale)
        acc = tl.dot(sbar.to(DOT_DT), v, acc=acc, input_precision=DOT_PREC)
        if NORMALIZE:
            den = wq * tl.sum(q.to(tl.float32) * n[None, :], axis=1) + tl.sum(sbar, axis=1)
            n_out = tl.maximum(tl.abs(den), 1.0)
            acc = acc / (n_out + eps)[:, None]
            if jv == 0:
                tl.store(NOUT + bh64 * S + t, n_out, mask=mt)
        store_tile(HD, H, acc.to(H.dtype.element_ty), bh, t0, jv * BDHV, s_v_bh, s_v_s,
                   S, DHV, L, BDHV, USE_TMA)
        abar = exp_nonpos(g - b + ii)
        kbar = (k.to(tl.float32) * abar[:, None]).to(DOT_DT)
        C = tl.dot(tl.trans(kbar), v, acc=C * exp_nonpos(g), input_precision=DOT_PREC)
        if WITH_N:
            n = n * exp_nonpos(g) + tl.sum(kbar.to(tl.float32), axis=0)
    if WRITE_LAST:
        if seg == n_seg - 1:
            tl.store(CL + bh64 * DQK * DHV + dk[:, None] * DHV + dv[None, :], C, mask=cmask)
            if WITH_N:
                if jv == 0:
                    tl.store(NL + bh64 * DQK + dk, n, mask=mk)


def walk_forward(q, k, v, gb, gi, CS, NS, cfg, *, normalize, eps, write_last, track_n,
                     dot_dt, dot_prec, h_dtype):
    """h (BH, S, d_hv) in h_dtype, n_out (BH, S) fp32 or None, last (C, n) or (None, None).

    q, k (BH, S, d_qk), v (BH, S, d_hv) contiguous; gb, gi (BH, S) fp32 (common.sig_gate_prep);
    CS (BH, n_seg, d_qk, d_hv) fp32 segment-start states or None (zero start, one segment);
    NS likewise for n or None (zeros); track_n: carry n (normalize, or for the last state).
    """
    BH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    h = torch.empty((BH, S, d_hv), dtype=h_dtype, device=q.device)
    n_out = torch.empty((BH, S), dtype=torch.float32, device=q.device) if normalize else None
    CL = torch.empty((BH, d_qk, d_hv), dtype=torch.float32, device=q.device) if write_last else None
    NL = torch.zeros((BH, d_qk), dtype=torch.float32, device=q.device) if write_last else None
    dummy = h
    grid = (cfg.n_jv, cfg.n_seg, BH)
    if cfg.BL == cfg.L:
        use_tma = cfg.use_tma and can_use_tma(q, k, v, h, blocks=(cfg.BDQK, cfg.BDHV, cfg.L))
        QD = descriptor(q, (1, cfg.L, cfg.BDQK), use_tma)
        KD = descriptor(k, (1, cfg.L, cfg.BDQK), use_tma)
        VD = descriptor(v, (1, cfg.L, cfg.BDHV), use_tma)
        HD = descriptor(h, (1, cfg.L, cfg.BDHV), use_tma)
        launch(_walk_flat_kernel, grid, cfg,
            QD, KD, VD, HD, q, k, v, h, gb, gi, n_out if normalize else dummy,
            CS if CS is not None else dummy, NS if NS is not None else dummy,
            CL if write_last else dummy, NL if write_last else dummy,
            S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
            q.stride(0), q.stride(1), v.stride(0), v.stride(1),
            NORMALIZE=normalize, WITH_N=track_n, HAS_CS=CS is not None, HAS_NS=NS is not None,
            WRITE_LAST=write_last, USE_TMA=use_tma, DOT_DT=dot_dt, DOT_PREC=dot_prec, L=cfg.L,
            BDQK=cfg.BDQK, BDHV=cfg.BDHV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
               )
        return h, n_out, (CL, NL)
    launch(_walk_kernel, grid, cfg,
        q, k, v, gb, gi, h, n_out if normalize else dummy,
        CS if CS is not None else dummy, NS if NS is not None else dummy,
        CL if write_last else dummy, NL if write_last else dummy,
        S, d_qk, d_hv, cfg.n_chunks, cfg.chunks_per_seg, cfg.n_seg, d_qk ** -0.5, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        h.stride(0), h.stride(1),
        NORMALIZE=normalize, WITH_N=track_n, HAS_CS=CS is not None, HAS_NS=NS is not None,
        WRITE_LAST=write_last,
        DOT_DT=dot_dt, DOT_PREC=dot_prec, L=cfg.L, BL=cfg.BL, BDQK=cfg.BDQK, BDHV=cfg.BDHV,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return h, n_out, (CL, NL)
