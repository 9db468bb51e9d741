"""limit_chunk parallel backward: dQ, dK, dV of one chunk in one program (docs/tfla-tiling.md 4.9).

One level of sequence parallelism: the grid is (N_c · B · NH,), and each program holds its
chunk's whole L x L matrices (S = QKᵀ, dS̄ = dH̃Vᵀ and the gate matrix D) on chip, then
loops over the d_qk blocks (dQ, dK) and the d_hv blocks (dV), adding the inter-chunk terms
with C_{k-1} and dC_k (docs/tfla-kernels.md 3.3). Also writes the fp32 row sums q·dq and k·dk for
the gate gradients (docs/tfla-kernels.md 3.4, docs/tfla-tiling.md 4.5). L is limited by registers:
16..128.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import cdiv, dot_precision, gate_exponent, head_block, launch
from tfla.triton.tuning import DEFAULT, Tuning

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _load_block(X, rows, cols, D, mask):
    """The (rows, cols) block of a row-major matrix of D columns at X; 0 where mask is off."""
    return tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _chunk_gram(A, B, t, ok, D, L: tl.constexpr, B_D: tl.constexpr, NUM: tl.constexpr,
                DOT_PREC: tl.constexpr):
    """A Bᵀ (L x L, fp32) over rows t of two row-major (S, D) tensors at A and B (one b·head),
    in NUM blocks of B_D columns; zeros past S (``ok``) and D."""
    acc = tl.zeros((L, L), dtype=tl.float32)
    offs_d = tl.arange(0, B_D)
    for kb in range(NUM):
        offs = kb * B_D + offs_d
        m = ok[:, None] & (offs < D)[None, :]
        a_blk = _load_block(A, t, offs, D, m)
        b_blk = _load_block(B, t, offs, D, m)
        acc = tl.dot(a_blk, tl.trans(b_blk), acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def _limit_bw_kernel(
    Q, K, V, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT, C_st, DC_st, DH, DQ, DK, DV, QDQ, KDK,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    NUM_DQK: tl.constexpr, NUM_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    c = pid % NC
    bh = (pid // NC).to(tl.int64)
    S_pad = NC * L
    loc = tl.arange(0, L)
    t = c * L + loc
    ok = t < S
    q_base = Q + bh * S * d_qk
    k_base = K + bh * S * d_qk
    v_base = V + bh * S * d_hv
    dh_base = DH + bh * S * d_hv
    offs_dk = tl.arange(0, B_DQK)
    offs_dv = tl.arange(0, B_DHV)

    # gates of the chunk (docs/tfla-kernels.md 2.4)
    b = tl.load(B_vec + bh * S_pad + t)
    ig = tl.load(I_vec + bh * S_pad + t)                 # ī, -inf beyond S
    a = tl.load(A_vec + bh * S_pad + t)
    if IS_EXP:
        m_prev = tl.load(M_st + bh * (NC + 1) + c)
        m_k = tl.load(M_st + bh * (NC + 1) + c + 1)
        mc = tl.maximum(b + m_prev, tl.load(MI_vec + bh * S_pad + t))
        b_bar = tl.exp(b + m_prev - mc)
        a_bar = tl.exp(a - m_k)
    else:
        mc = b * 0.0
        b_bar = tl.exp(b)
        a_bar = tl.exp(a)
    if NORMALIZE:
        rs = scale / (tl.load(NOUT + bh * S_pad + t) + eps)
    else:
        rs = b * 0.0 + scale
    d_log = gate_exponent(b, mc, b, ig, loc, loc, False)
    dmat = tl.exp(d_log) * rs[:, None]          # D with the query-row factor scale/(n_out+eps)

    # S = Q Kᵀ and dS̄ = dH Vᵀ over the whole chunk
    s = _chunk_gram(q_base, k_base, t, ok, d_qk, L, B_DQK, NUM_DQK, DOT_PREC)
    ds = _chunk_gram(dh_base, v_base, t, ok, d_hv, L, B_DHV, NUM_DHV, DOT_PREC)
    ds = (ds * dmat).to(Q.dtype.element_ty)       # dS ⊙ D · scale / (n_out + eps)
    s_bar = (s * dmat).to(Q.dtype.element_ty)     # S̄ · 1/(n_out + eps)  (scale included)

    c_base = C_st + (bh * (NC + 1) + c) * d_qk * d_hv
    dc_base = DC_st + (bh * (NC + 1) + c + 1) * d_qk * d_hv
    qdq = tl.zeros((L,), dtype=tl.float32)
    kdk = tl.zeros((L,), dtype=tl.float32)
    for kb in range(NUM_DQK):
        offs_k = kb * B_DQK + offs_dk
        mask_k = offs_k < d_qk
        mk = ok[:, None] & mask_k[None, :]
        q_blk = _load_block(q_base, t, offs_k, d_qk, mk)
        k_blk = _load_block(k_base, t, offs_k, d_qk, mk)
        inter_q = tl.zeros((L, B_DQK), dtype=tl.float32)
        inter_k = tl.zeros((L, B_DQK), dtype=tl.float32)
        for vb in range(NUM_DHV):
            offs_v = vb * B_DHV + offs_dv
            mask_v = offs_v < d_hv
            mv = ok[:, None] & mask_v[None, :]
            dh_blk = _load_block(dh_base, t, offs_v, d_hv, mv)
            v_blk = _load_block(v_base, t, offs_v, d_hv, mv)
            cm = mask_k[:, None] & mask_v[None, :]
            c_blk = _load_block(c_base, offs_k, offs_v, d_hv, cm)
            dc_blk = _load_block(dc_base, offs_k, offs_v, d_hv, cm)
            inter_q = tl.dot(dh_blk, tl.trans(c_blk.to(dh_blk.dtype)), inter_q,
                             input_precision=DOT_PREC)
            inter_k = tl.dot(v_blk, tl.trans(dc_blk.to(v_blk.dtype)), inter_k,
                             input_precision=DOT_PREC)
        dq = tl.dot(ds, k_blk, inter_q * (b_bar * rs)[:, None], input_precision=DOT_PREC)
        dk = tl.dot(tl.trans(ds), q_blk, inter_k * a_bar[:, None], input_precision=DOT_PREC)
        tl.store(DQ + bh * S * d_qk + t[:, None] * d_qk + offs_k[None, :],
                 dq.to(DQ.dtype.element_ty), mask=mk)
        tl.store(DK + bh * S * d_qk + t[:, None] * d_qk + offs_k[None, :],
                 dk.to(DK.dtype.element_ty), mask=mk)
        qdq += tl.sum(q_blk.to(tl.float32) * dq, 1)
        kdk += tl.sum(k_blk.to(tl.float32) * dk, 1)
    tl.store(QDQ + bh * S_pad + t, qdq)
    tl.store(KDK + bh * S_pad + t, kdk)

    for vb in range(NUM_DHV):
        offs_v = vb * B_DHV + offs_dv
        mask_v = offs_v < d_hv
        mv = ok[:, None] & mask_v[None, :]
        inter_v = tl.zeros((L, B_DHV), dtype=tl.float32)
        for kb in range(NUM_DQK):
            offs_k = kb * B_DQK + offs_dk
            mask_k = offs_k < d_qk
            k_blk = _load_block(k_base, t, offs_k, d_qk, ok[:, None] & mask_k[None, :])
            dc_blk = _load_block(dc_base, offs_k, offs_v, d_hv, mask_k[:, None] & mask_v[None, :])
            inter_v = tl.dot(k_blk, dc_blk.to(k_blk.dtype), inter_v, input_precision=DOT_PREC)
        dh_blk = _load_block(dh_base, t, offs_v, d_hv, mv)
        dv = tl.dot(tl.trans(s_bar), dh_blk, inter_v * a_bar[:, None], input_precision=DOT_PREC)
        tl.store(DV + bh * S * d_hv + t[:, None] * d_hv + offs_v[None, :],
                 dv.to(DV.dtype.element_ty), mask=mv)


def limit_bw_config(L: int, d_qk: int, d_hv: int, dtype: torch.dtype,
                    tuning: Tuning = DEFAULT) -> dict:
    """Head-dim blocks and warps of the limit_chunk backward (heuristic, docs/kernels.md, tuning
    rule B2); ``tuning.limit_bw``'s keys win."""
    cap = 32 if (dtype == torch.float32 or L >= 128) else 64
    cfg = dict(B_DQK=head_block(d_qk, cap), B_DHV=head_block(d_hv, cap),
               num_warps=8 if L >= 128 else 4, num_stages=1)
    cfg.update(tuning.limit_bw)
    return cfg


def limit_parallel_bw(q, k, v, gates, m_st, n_out, C_st, dC_st, dh, *, L: int,
                      is_exp: bool, normalize: bool, eps: float, tuning: Tuning = DEFAULT):
    """dq, dk, dv (input dtype) and fp32 row sums q·dq, k·dk (BNH, N_c*L) for limit_chunk.
    ``tuning``: overrides of :func:`limit_bw_config`'s rule."""
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    cfg = limit_bw_config(L, d_qk, d_hv, q.dtype, tuning)
    qdq = torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32)
    kdk = torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    b_vec, a_vec, i_vec, mi_vec = gates
    launch(
        _limit_bw_kernel, (NC * BNH,), q, k, v, b_vec, i_vec, a_vec, mi_vec, m_st, n_out, C_st, dC_st, dh, dq, dk, dv, qdq, kdk,
        S, NC, d_qk, d_hv, d_qk ** -0.5, eps,
        L=L, B_DQK=cfg["B_DQK"], B_DHV=cfg["B_DHV"],
        NUM_DQK=cdiv(d_qk, cfg["B_DQK"]), NUM_DHV=cdiv(d_hv, cfg["B_DHV"]),
        IS_EXP=is_exp, NORMALIZE=normalize, DOT_PREC=dot_precision(q.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return dq, dk, dv, qdq, kdk
