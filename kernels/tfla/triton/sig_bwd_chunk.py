"""mLSTMsig backward, chunk-parallel form: materialised chunk states, then one program per tile.

docs/tfla-kernels.md 3.2-3.4 and 4.5 (the paper's TFLA backward), chosen with
``common.choose_config`` (``cfg.bwd == "chunk"``; the older fused walks of
``sig_bwd_parallel`` stay selectable as ``"walk"``):

1. ``_sig_state_walk_kernel`` forwards (REVERSE False): C_{k-1}, the state *before* chunk k,
   for every chunk, C_k = exp(g_k) C_{k-1} + (exp(g_k - b + ī) ⊙ K)ᵀ V, stored in the input
   dtype (the kernels cast states to it before every tl.dot anyway, so nothing is lost and
   the traffic halves against fp32).
2. The same kernel backwards (REVERSE True): dC_k, the gradient w.r.t. the state *after*
   chunk k, dC_{k-1} = exp(g_k) dC_k + (exp(b)·scale ⊙ Q)ᵀ dH̃ (eqs. 63-64), from dC_last;
   its final value is dC_0 (the initial-state gradient).
   Grid of both: (d_qk / BDA, d_hv / BDB, B*NH); each program walks all chunks of its head.
3. ``_sig_bwd_dqdk_chunk_kernel``, grid (2 * L/BL, n_chunks, B*NH): a program is one row
   tile of one chunk and computes either its dQ rows (inter term dH̃ C_{k-1}ᵀ, intra over the
   causal kv tiles) or its dK rows (inter V dC_kᵀ, intra over the later q tiles), looping
   over d_hv blocks for dH̃Vᵀ; it owns all d_qk columns, so it writes dq / dk directly in the
   input dtype together with the fp32 row sums q·dq, k·dk (docs 4.5) — no fp32 buffers, no
   atomics.
4. ``_sig_bwd_dv_chunk_kernel``, grid (d_hv/BDV · L/BL, n_chunks, B*NH):
   dV = (exp(a) ⊙ K) dC_k + (K Qᵀ·scale ⊙ Dᵀ) dH̃ for one kv tile and d_hv block.

Every program of 3 and 4 is independent (thousands per launch), so the tensor-core work
is no longer a serial chain per SM; only the two walks in 1-2 are sequential over chunks,
and each step there is one small product. Memory: two state tensors of
n_chunks·d_qk·d_hv elements per (b, head) in the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import exp_nonpos, launch


@triton.jit
def _sig_state_walk_kernel(
    A, B, GB, GI, NOUT, INIT, OUT, FINAL,
    S, DA, DB, n_chunks, scale, eps, s_a_bh, s_a_s, s_b_bh, s_b_s,
    REVERSE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_INIT: tl.constexpr,
    WRITE_FINAL: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BL: tl.constexpr, BDA: tl.constexpr, BDB: tl.constexpr,
):
    """X (DA x DB block) over all chunks: OUT[bh, c] = X before chunk c's update, then
    X ← exp(g_c) X + Σ_tiles (coef ⊙ A_tile)ᵀ B_tile. Forward: A = K, B = V,
    coef = exp(g − b + ī). Reverse (chunks from last to first): A = Q, B = dH̃,
    coef = exp(b)·scale."""
    pa = tl.program_id(0)
    pb = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    da = pa * BDA + tl.arange(0, BDA)
    db = pb * BDB + tl.arange(0, BDB)
    ma = da < DA
    mb = db < DB
    xmask = ma[:, None] & mb[None, :]
    xoff = da[:, None] * DB + db[None, :]
    if HAS_INIT:
        X = tl.load(INIT + bh * DA * DB + xoff, mask=xmask, other=0.0).to(tl.float32)
    else:
        X = tl.zeros([BDA, BDB], dtype=tl.float32)
    NT: tl.constexpr = L // BL
    rows = tl.arange(0, BL)
    for it in range(0, n_chunks * NT):
        j = it % NT
        if REVERSE:
            c = n_chunks - 1 - it // NT
        else:
            c = it // NT
        t0 = c * L
        t = t0 + j * BL + rows
        mt = t < S
        a = tl.load(A + bh * s_a_bh + t[:, None] * s_a_s + da[None, :],
                    mask=mt[:, None] & ma[None, :], other=0.0)
        bm = tl.load(B + bh * s_b_bh + t[:, None] * s_b_s + db[None, :],
                     mask=mt[:, None] & mb[None, :], other=0.0)
        b = tl.load(GB + bh * S + t, mask=mt, other=0.0)
        g = tl.load(GB + bh * S + tl.minimum(t0 + L, S) - 1)
        if j == 0:
            tl.store(OUT + (bh * n_chunks + c) * DA * DB + xoff, X.to(OUT.dtype.element_ty),
                     mask=xmask)
            X = X * exp_nonpos(g)
        if REVERSE:
            coef = exp_nonpos(b) * scale
            if NORMALIZE:
                nout = tl.load(NOUT + bh * S + t, mask=mt, other=1.0)
                bm = (bm.to(tl.float32) / (nout + eps)[:, None])
        else:
            ii = tl.load(GI + bh * S + t, mask=mt, other=float("-inf"))
            coef = exp_nonpos(g - b + ii)
        abar = (a.to(tl.float32) * coef[:, None]).to(DOT_DT)
        X = tl.dot(tl.trans(abar), bm.to(DOT_DT), acc=X, input_precision=DOT_PREC)
    if WRITE_FINAL:
        tl.store(FINAL + bh * DA * DB + xoff, X, mask=xmask)


@triton.jit
def _load_dh(DH, NOUT, bh, t, mt, dv, mv, S, s_h_bh, s_h_s, eps,
             NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr):
    dh = tl.load(DH + bh * s_h_bh + t[:, None] * s_h_s + dv[None, :],
                 mask=mt[:, None] & mv[None, :], other=0.0)
    if NORMALIZE:
        nout = tl.load(NOUT + bh * S + t, mask=mt, other=1.0)
        dh = dh.to(tl.float32) / (nout + eps)[:, None]
    return dh.to(DOT_DT)


@triton.jit
def _sig_bwd_dqdk_chunk_kernel(
    Q, K, V, DH, GB, GI, NOUT, CST, DCST, DQ, DK, QDQ, KDK,
    S, DQK, DHV, n_chunks, scale, eps,
    s_q_bh, s_q_s, s_v_bh, s_v_s,
    NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BL: tl.constexpr, BDQK: tl.constexpr, BDV: tl.constexpr,
):
    pid = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    which = pid % 2                                   # 0: dQ rows, 1: dK rows
    i = pid // 2                                      # row tile inside the chunk
    NT: tl.constexpr = L // BL
    t0 = c * L
    rows = tl.arange(0, BL)
    dk = tl.arange(0, BDQK)
    mk = dk < DQK
    tr = t0 + i * BL + rows                           # this program's rows
    mr = tr < S
    if t0 + i * BL < S:
        br = tl.load(GB + bh * S + tr, mask=mr, other=0.0)
        st_base = (bh * n_chunks + c) * DQK * DHV
        acc = tl.zeros([BL, BDQK], dtype=tl.float32)
        if which == 0:
            # dQ = scale·[ exp(b) ⊙ (dH̃ C_{k-1}ᵀ) + (dH̃ Vᵀ ⊙ D) K ]
            for v0 in range(0, DHV, BDV):
                dv = v0 + tl.arange(0, BDV)
                mv = dv < DHV
                dh = _load_dh(DH, NOUT, bh, tr, mr, dv, mv, S, s_v_bh, s_v_s, eps,
                              NORMALIZE, DOT_DT)
                cst = tl.load(CST + st_base + dk[:, None] * DHV + dv[None, :],
                              mask=mk[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                acc = tl.dot(dh, tl.trans(cst), acc=acc, input_precision=DOT_PREC)
            acc = acc * (exp_nonpos(br) * scale)[:, None]
            for j in range(0, i + 1):
                tk = t0 + j * BL + rows
                mkv = tk < S
                bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
                ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
                ds = tl.zeros([BL, BL], dtype=tl.float32)
                for v0 in range(0, DHV, BDV):
                    dv = v0 + tl.arange(0, BDV)
                    mv = dv < DHV
                    dh = _load_dh(DH, NOUT, bh, tr, mr, dv, mv, S, s_v_bh, s_v_s, eps,
                                  NORMALIZE, DOT_DT)
                    vv = tl.load(V + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                                 mask=mkv[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                    ds = tl.dot(dh, tl.trans(vv), acc=ds, input_precision=DOT_PREC)
                keep = (rows[:, None] >= rows[None, :]) | (j < i)
                dmat = exp_nonpos(tl.where(keep, br[:, None] - bk[None, :] + ik[None, :],
                                       float("-inf"))) * scale
                kk = tl.load(K + bh * s_q_bh + tk[:, None] * s_q_s + dk[None, :],
                             mask=mkv[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                acc = tl.dot((ds * dmat).to(DOT_DT), kk, acc=acc, input_precision=DOT_PREC)
            x = tl.load(Q + bh * s_q_bh + tr[:, None] * s_q_s + dk[None, :],
                        mask=mr[:, None] & mk[None, :], other=0.0).to(tl.float32)
            tl.store(DQ + bh * s_q_bh + tr[:, None] * s_q_s + dk[None, :],
                     acc.to(DQ.dtype.element_ty), mask=mr[:, None] & mk[None, :])
            tl.store(QDQ + bh * S + tr, tl.sum(x * acc, axis=1), mask=mr)
        else:
            # dK = exp(a) ⊙ (V dC_kᵀ) + scale·(dH̃ Vᵀ ⊙ D)ᵀ Q
            ir = tl.load(GI + bh * S + tr, mask=mr, other=float("-inf"))
            g = tl.load(GB + bh * S + tl.minimum(t0 + L, S) - 1)
            for v0 in range(0, DHV, BDV):
                dv = v0 + tl.arange(0, BDV)
                mv = dv < DHV
                vv = tl.load(V + bh * s_v_bh + tr[:, None] * s_v_s + dv[None, :],
                             mask=mr[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                dcs = tl.load(DCST + st_base + dk[:, None] * DHV + dv[None, :],
                              mask=mk[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                acc = tl.dot(vv, tl.trans(dcs), acc=acc, input_precision=DOT_PREC)
            acc = acc * exp_nonpos(g - br + ir)[:, None]
            for r in range(i, NT):
                if t0 + r * BL < S:
                    tq = t0 + r * BL + rows
                    mq = tq < S
                    bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                    dsT = tl.zeros([BL, BL], dtype=tl.float32)       # [kv row s, q row r]
                    for v0 in range(0, DHV, BDV):
                        dv = v0 + tl.arange(0, BDV)
                        mv = dv < DHV
                        vv = tl.load(V + bh * s_v_bh + tr[:, None] * s_v_s + dv[None, :],
                                     mask=mr[:, None] & mv[None, :], other=0.0).to(DOT_DT)
                        dh = _load_dh(DH, NOUT, bh, tq, mq, dv, mv, S, s_v_bh, s_v_s, eps,
                                      NORMALIZE, DOT_DT)
                        dsT = tl.dot(vv, tl.trans(dh), acc=dsT, input_precision=DOT_PREC)
                    keep = (rows[None, :] >= rows[:, None]) | (r > i)
                    dT = exp_nonpos(tl.where(keep, bq[None, :] - br[:, None] + ir[:, None],
                                         float("-inf"))) * scale
                    qq = tl.load(Q + bh * s_q_bh + tq[:, None] * s_q_s + dk[None, :],
                                 mask=mq[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                    acc = tl.dot((dsT * dT).to(DOT_DT), qq, acc=acc, input_precision=DOT_PREC)
            x = tl.load(K + bh * s_q_bh + tr[:, None] * s_q_s + dk[None, :],
                        mask=mr[:, None] & mk[None, :], other=0.0).to(tl.float32)
            tl.store(DK + bh * s_q_bh + tr[:, None] * s_q_s + dk[None, :],
                     acc.to(DK.dtype.element_ty), mask=mr[:, None] & mk[None, :])
            tl.store(KDK + bh * S + tr, tl.sum(x * acc, axis=1), mask=mr)


@triton.jit
def _sig_bwd_dv_chunk_kernel(
    Q, K, DH, GB, GI, NOUT, DCST, DVO,
    S, DQK, DHV, n_chunks, scale, eps,
    s_q_bh, s_q_s, s_v_bh, s_v_s,
    NORMALIZE: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
    L: tl.constexpr, BL: tl.constexpr, BDQK: tl.constexpr, BDV: tl.constexpr,
):
    pid = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    NT: tl.constexpr = L // BL
    j = pid % NT                                      # kv tile inside the chunk
    jv = pid // NT                                    # d_hv block
    t0 = c * L
    rows = tl.arange(0, BL)
    dk = tl.arange(0, BDQK)
    mk = dk < DQK
    dv = jv * BDV + tl.arange(0, BDV)
    mv = dv < DHV
    tk = t0 + j * BL + rows
    mkv = tk < S
    if t0 + j * BL < S:
        bk = tl.load(GB + bh * S + tk, mask=mkv, other=0.0)
        ik = tl.load(GI + bh * S + tk, mask=mkv, other=float("-inf"))
        g = tl.load(GB + bh * S + tl.minimum(t0 + L, S) - 1)
        kk = tl.load(K + bh * s_q_bh + tk[:, None] * s_q_s + dk[None, :],
                     mask=mkv[:, None] & mk[None, :], other=0.0)
        dcs = tl.load(DCST + (bh * n_chunks + c) * DQK * DHV + dk[:, None] * DHV + dv[None, :],
                      mask=mk[:, None] & mv[None, :], other=0.0).to(DOT_DT)
        kbar = (kk.to(tl.float32) * exp_nonpos(g - bk + ik)[:, None]).to(DOT_DT)
        acc = tl.dot(kbar, dcs, input_precision=DOT_PREC)
        kk = kk.to(DOT_DT)
        for r in range(j, NT):
            if t0 + r * BL < S:
                tq = t0 + r * BL + rows
                mq = tq < S
                bq = tl.load(GB + bh * S + tq, mask=mq, other=0.0)
                qq = tl.load(Q + bh * s_q_bh + tq[:, None] * s_q_s + dk[None, :],
                             mask=mq[:, None] & mk[None, :], other=0.0).to(DOT_DT)
                dh = _load_dh(DH, NOUT, bh, tq, mq, dv, mv, S, s_v_bh, s_v_s, eps,
                              NORMALIZE, DOT_DT)
                sT = tl.dot(kk, tl.trans(qq), input_precision=DOT_PREC)
                keep = (rows[None, :] >= rows[:, None]) | (r > j)
                dT = exp_nonpos(tl.where(keep, bq[None, :] - bk[:, None] + ik[:, None],
                                     float("-inf"))) * scale
                acc = tl.dot((sT * dT).to(DOT_DT), dh, acc=acc, input_precision=DOT_PREC)
        tl.store(DVO + bh * s_v_bh + tk[:, None] * s_v_s + dv[None, :],
                 acc.to(DVO.dtype.element_ty), mask=mkv[:, None] & mv[None, :])


def sig_state_walk(a, b, gb, gi, n_out, init, cfg, *, reverse, normalize, eps, want_final,
                   dot_dt, dot_prec, state_dtype):
    """Per-chunk states (BH, n_chunks, DA, DB) in state_dtype, and the final state (fp32) or None.

    Forward (reverse False): a = k (BH, S, d_qk), b = v (BH, S, d_hv), init = C0 or None;
    entry c is C before chunk c. Reverse: a = q, b = dh; init = dC_last or None; entry c is
    dC after chunk c; the final state is dC_0.
    """
    BH, S, DA = a.shape
    DB = b.shape[-1]
    out = torch.empty((BH, cfg.n_chunks, DA, DB), dtype=state_dtype, device=a.device)
    final = torch.empty((BH, DA, DB), dtype=torch.float32, device=a.device) if want_final else None
    grid = (triton.cdiv(DA, cfg.BDA_W), triton.cdiv(DB, cfg.BDB_W), BH)
    launch(_sig_state_walk_kernel, grid, cfg,
        a, b, gb, gi, n_out if n_out is not None else gb, init if init is not None else gb, out,
        final if final is not None else gb,
        S, DA, DB, cfg.n_chunks, DA ** -0.5 if reverse else 1.0, eps,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        REVERSE=reverse, NORMALIZE=normalize and reverse, HAS_INIT=init is not None,
        WRITE_FINAL=want_final, DOT_DT=dot_dt, DOT_PREC=dot_prec, L=cfg.L, BL=cfg.BL_W,
        BDA=cfg.BDA_W, BDB=cfg.BDB_W, num_warps=4, num_stages=cfg.num_stages_w)
    return out, final


def sig_bwd_chunk(q, k, v, dh, gb, gi, n_out, C0, dC_last, cfg, *, normalize, eps, want_dC0,
                  dot_dt, dot_prec):
    """dq, dk, dv (BH, S, d) in q's dtype, row sums q·dq, k·dk (BH, S) fp32, dC0 or None.

    q, k (BH, S, d_qk), v, dh (BH, S, d_hv) contiguous; gb, gi, n_out (BH, S) fp32;
    C0, dC_last (BH, d_qk, d_hv) fp32 or None. The scale 1/sqrt(d_qk) enters Q̄ (reverse walk)
    and the intra terms.
    """
    BH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    scale = d_qk ** -0.5
    sdt = q.dtype
    nrm = n_out if normalize else None
    CST, _ = sig_state_walk(k, v, gb, gi, None, C0, cfg, reverse=False, normalize=False,
                            eps=eps, want_final=False, dot_dt=dot_dt, dot_prec=dot_prec,
                            state_dtype=sdt)
    DCST, dC0 = sig_state_walk(q, dh, gb, gi, nrm, dC_last, cfg, reverse=True,
                               normalize=normalize, eps=eps, want_final=want_dC0,
                               dot_dt=dot_dt, dot_prec=dot_prec, state_dtype=sdt)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    qdq = torch.empty((BH, S), dtype=torch.float32, device=q.device)
    kdk = torch.empty_like(qdq)
    NT = cfg.L // cfg.BL_C
    dummy = gb
    common = dict(NORMALIZE=normalize, DOT_DT=dot_dt, DOT_PREC=dot_prec, L=cfg.L, BL=cfg.BL_C,
                  BDQK=cfg.BDQK, BDV=cfg.BDV_C, num_warps=cfg.num_warps_c)
    launch(_sig_bwd_dqdk_chunk_kernel, (2 * NT, cfg.n_chunks, BH), cfg,
        q, k, v, dh, gb, gi, n_out if normalize else dummy, CST, DCST, dq, dk, qdq, kdk,
        S, d_qk, d_hv, cfg.n_chunks, scale, eps,
        q.stride(0), q.stride(1), v.stride(0), v.stride(1),
        num_stages=cfg.num_stages_c, **common)
    del CST
    launch(_sig_bwd_dv_chunk_kernel, (triton.cdiv(d_hv, cfg.BDV_C) * NT, cfg.n_chunks, BH), cfg,
        q, k, dh, gb, gi, n_out if normalize else dummy, DCST, dv,
        S, d_qk, d_hv, cfg.n_chunks, scale, eps,
        q.stride(0), q.stride(1), v.stride(0), v.stride(1),
        num_stages=cfg.num_stages_c, **common)
    return dq, dk, dv, qdq, kdk, dC0
