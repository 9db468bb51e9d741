"""Parallel (intra-chunk) backward kernels of xl_chunk: dQ, dK, dV (paper Table 1, rows 2-4).

docs/tfla-kernels.md 3.3 (per-chunk gradients) and 4.5 (tiled loops). One program of

- dQ: (d_qk block, query tile, chunk·b·head), loops over kv tiles up to the diagonal;
  or per (query tile, chunk·b·head) one program that forms the tile's gated product with
  the chunk's (at most two) kv tiles once and loops over the d_qk blocks
  (``_dq_once_kernel``, where ``bw_config`` sets ONCE_DQ);
- dK: (d_qk block, kv tile, chunk·b·head), loops over query tiles from the diagonal on;
- dV: (d_hv block, kv tile, chunk·b·head), same loop as dK: one launch of ``_dkv_kernel``
  serves both, its dK and dV programs of a chunk next to each other in the grid (each runs
  ``_dkv_tile``, where the constexpr OUT_K swaps the roles of d_qk and d_hv);
- or per (kv tile, chunk·b·head) one dK and one dV program that each form the tile's
  gated product with the chunk's (at most two) query tiles once and loop over their output
  blocks (``_dkv_once_kernel``, where ``bw_config`` sets ONCE_DKV);
- or dK and dV together (``_dkv_fused_kernel``, where ``bw_config`` sets FUSED_DKV): one
  program per (kv tile, chunk·b·head) with the whole head dimensions, which reads K, V and
  dC_k once and forms K Qᵀ ⊙ Dᵀ and V dH̃ᵀ ⊙ Dᵀ once per query tile.

No kernel has an online max: D is rebuilt from b, ī and the saved m^comb. The normaliser
1/(n_out + eps) is applied as a row (query) scale in fp32 after each dot. dQ and dK also
write the fp32 row sums q·dq and k·dk (before dq, dk are rounded to the input dtype) for
the gate gradients (docs/tfla-kernels.md 3.4, docs/tfla-tiling.md 4.5); with several d_qk blocks
they are added atomically.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfla.triton.common import (can_use_tma, cdiv, chunk_tile_pid, descriptor, dot_precision,
                                gate_exponent, head_block, launch, load_tile, pow2,
                                store_tile, tile_rows)
from tfla.triton.tuning import DEFAULT, Tuning

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _q_rows(B_vec, MI_vec, M_st, NOUT, bh, c, rows, S_pad, NC, scale, eps,
            IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr):
    """Per query row: b, m^comb (0 for sig), b̄ and scale/(n_out + eps) (scale if unnormalised)."""
    b_q = tl.load(B_vec + bh * S_pad + rows)
    if IS_EXP:
        m_prev = tl.load(M_st + bh * (NC + 1) + c)
        mc_q = tl.maximum(b_q + m_prev, tl.load(MI_vec + bh * S_pad + rows))
        b_bar = tl.exp(b_q + m_prev - mc_q)
    else:
        mc_q = b_q * 0.0
        b_bar = tl.exp(b_q)
    if NORMALIZE:
        rs = scale / (tl.load(NOUT + bh * S_pad + rows) + eps)
    else:
        rs = b_q * 0.0 + scale
    return b_q, mc_q, b_bar, rs


@triton.jit
def _kv_rows(B_vec, I_vec, A_vec, M_st, bh, c, cols, S_pad, NC, IS_EXP: tl.constexpr):
    """Per key/value row: b, ī (-inf beyond S) and ā = exp(a - m_k) (docs/tfla-kernels.md 2.4)."""
    b_kv = tl.load(B_vec + bh * S_pad + cols)
    i_kv = tl.load(I_vec + bh * S_pad + cols)
    a_kv = tl.load(A_vec + bh * S_pad + cols)
    if IS_EXP:
        a_kv = a_kv - tl.load(M_st + bh * (NC + 1) + c + 1)
    return b_kv, i_kv, tl.exp(a_kv)


@triton.jit
def _store_rowsum(ROWSUM, bh, S_pad, rows, x_blk, acc, ATOMIC: tl.constexpr):
    """The fp32 row sums of x ⊙ acc (q·dq or k·dk, before acc is rounded) at positions rows
    of b·head bh of ROWSUM (BNH, S_pad), added atomically where several programs (d_qk blocks)
    share a row."""
    rowsum = tl.sum(x_blk.to(tl.float32) * acc, 1)
    if ATOMIC:
        tl.atomic_add(ROWSUM + bh * S_pad + rows, rowsum)
    else:
        tl.store(ROWSUM + bh * S_pad + rows, rowsum)


@triton.jit
def _dq_kernel(
    Q, K, V, QD, KD, VD, CD, DHD, DQD, B_vec, I_vec, MI_vec, M_st, NOUT, C_st, DH, DQ, QDQ,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr, NUM_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, ATOMIC_ROWSUM: tl.constexpr,
    HAS_C0: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    pid_k, pid_q, c, bh = chunk_tile_pid(tl.program_id(0), tl.cdiv(d_qk, B_DQK), L // B_LQ, NC)
    S_pad = NC * L
    r_loc, r0, rows = tile_rows(c, pid_q, L, B_LQ)
    k0 = pid_k * B_DQK
    b_q, mc_q, b_bar, rs = _q_rows(B_vec, MI_vec, M_st, NOUT, bh, c, rows, S_pad, NC, scale, eps,
                                   IS_EXP, NORMALIZE)
    acc = _dq_inter(CD, C_st, DHD, DH, bh, c, r0, k0, S, NC, d_qk, d_hv, b_bar * rs, B_LQ,
                    B_DQK, B_DHV, NUM_DHV, HAS_C0, DOT_PREC, USE_TMA)
    # intra: (dH̃ Vᵀ ⊙ D) K · scale over the key/value tiles on or below the diagonal (a key
    # tile longer than the query tile reaches past it: D masks the positions after the query)
    n_kv = tl.cdiv((pid_q + 1) * B_LQ, B_LKV)
    for j in range(n_kv):
        ds = _dq_ds(DHD, DH, VD, V, B_vec, I_vec, bh, c, j, r0, r_loc, b_q, mc_q, rs, S, S_pad,
                    d_hv, L, B_LQ, B_LKV, B_DHV, NUM_DHV, DOT_PREC, USE_TMA)
        k_blk = load_tile(KD, K, bh, c * L + j * B_LKV, k0, S, d_qk, B_LKV, B_DQK, USE_TMA)
        acc = tl.dot(ds.to(k_blk.dtype), k_blk, acc, input_precision=DOT_PREC)
    q_blk = load_tile(QD, Q, bh, r0, k0, S, d_qk, B_LQ, B_DQK, USE_TMA)
    store_tile(DQD, DQ, acc.to(DQ.dtype.element_ty), bh, r0, k0, S, d_qk, B_LQ, B_DQK, USE_TMA)
    _store_rowsum(QDQ, bh, S_pad, rows, q_blk, acc, ATOMIC_ROWSUM)


@triton.jit
def _dq_inter(CD, C_st, DHD, DH, bh, c, r0, k0, S, NC, d_qk, d_hv, row_scale,
              B_LQ: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
              NUM_DHV: tl.constexpr, HAS_C0: tl.constexpr, DOT_PREC: tl.constexpr,
              USE_TMA: tl.constexpr):
    """The inter-chunk part of dQ, b̄ ⊙ dH̃ C_{k-1}ᵀ · scale (row_scale = b̄ · scale/(n + eps)),
    fp32 (B_LQ, B_DQK): d_qk columns k0.. of query tile r0 of chunk c, C_{k-1} in the
    (BNH·(N_c+1), d_qk, d_hv) view; none at chunk 0 without C0 (C_0 = 0): a trip count of 0
    there, not a branch, which would keep Triton from pipelining the loop."""
    acc = tl.zeros((B_LQ, B_DQK), dtype=tl.float32)
    c_row = bh * (NC + 1) + c
    n_inter = NUM_DHV if HAS_C0 else tl.where(c > 0, NUM_DHV, 0)
    for vb in range(n_inter):
        dh_blk = load_tile(DHD, DH, bh, r0, vb * B_DHV, S, d_hv, B_LQ, B_DHV, USE_TMA)
        c_blk = load_tile(CD, C_st, c_row, k0, vb * B_DHV, d_qk, d_hv, B_DQK, B_DHV, USE_TMA)
        acc = tl.dot(dh_blk, tl.trans(c_blk.to(dh_blk.dtype)), acc, input_precision=DOT_PREC)
    return acc * row_scale[:, None]


@triton.jit
def _dq_ds(DHD, DH, VD, V, B_vec, I_vec, bh, c, j, r0, r_loc, b_q, mc_q, rs, S, S_pad, d_hv,
           L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr, B_DHV: tl.constexpr,
           NUM_DHV: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr):
    """(dH̃ Vᵀ ⊙ D) · row scale of query tile r0 and key/value tile j of chunk c, fp32
    (B_LQ, B_LKV), the contraction over d_hv in NUM_DHV blocks of B_DHV."""
    s_loc, s0, cols = tile_rows(c, j, L, B_LKV)
    ds = tl.zeros((B_LQ, B_LKV), dtype=tl.float32)
    for vb in range(NUM_DHV):
        dh_blk = load_tile(DHD, DH, bh, r0, vb * B_DHV, S, d_hv, B_LQ, B_DHV, USE_TMA)
        v_blk = load_tile(VD, V, bh, s0, vb * B_DHV, S, d_hv, B_LKV, B_DHV, USE_TMA)
        ds = tl.dot(dh_blk, tl.trans(v_blk), ds, input_precision=DOT_PREC)
    i_kv = tl.load(I_vec + bh * S_pad + cols)
    b_kv = tl.load(B_vec + bh * S_pad + cols)
    d_log = gate_exponent(b_q, mc_q, b_kv, i_kv, r_loc, s_loc, False)
    return ds * tl.exp(d_log) * rs[:, None]


@triton.jit
def _dq_once_kernel(
    Q, K, V, QD, KD, VD, CD, DHD, DQD, B_vec, I_vec, MI_vec, M_st, NOUT, C_st, DH, DQ, QDQ,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr, NUM_DQK: tl.constexpr, NUM_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_C0: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    # dQ with each product of a query tile formed once (rule B11): one program per (query
    # tile, chunk, b·head) forms dH̃ Vᵀ ⊙ D with its (at most two, L <= 2·B_LKV) key/value
    # tiles once, keeps it on chip, and loops over the d_qk blocks of dQ, adding the
    # products in _dq_kernel's order (inter-chunk part, then the key/value tiles in order);
    # _dq_kernel's d_qk-block programs each form it again. The row sums q·dq are summed in
    # the program (no atomics).
    _, pid_q, c, bh = chunk_tile_pid(tl.program_id(0), 1, L // B_LQ, NC)
    S_pad = NC * L
    r_loc, r0, rows = tile_rows(c, pid_q, L, B_LQ)
    b_q, mc_q, b_bar, rs = _q_rows(B_vec, MI_vec, M_st, NOUT, bh, c, rows, S_pad, NC, scale, eps,
                                   IS_EXP, NORMALIZE)
    k_ty = K.dtype.element_ty
    n_kv = tl.cdiv((pid_q + 1) * B_LQ, B_LKV)
    j_last = n_kv - 1
    ds_last = _dq_ds(DHD, DH, VD, V, B_vec, I_vec, bh, c, j_last, r0, r_loc, b_q, mc_q, rs, S,
                     S_pad, d_hv, L, B_LQ, B_LKV, B_DHV, NUM_DHV, DOT_PREC, USE_TMA).to(k_ty)
    if L // B_LKV == 2:
        if n_kv == 2:
            ds_0 = _dq_ds(DHD, DH, VD, V, B_vec, I_vec, bh, c, 0, r0, r_loc, b_q, mc_q, rs, S,
                          S_pad, d_hv, L, B_LQ, B_LKV, B_DHV, NUM_DHV, DOT_PREC,
                          USE_TMA).to(k_ty)
        else:
            ds_0 = tl.zeros((B_LQ, B_LKV), dtype=k_ty)
    rowsum = tl.zeros((B_LQ,), dtype=tl.float32)
    for kb in range(NUM_DQK):
        k0 = kb * B_DQK
        acc = _dq_inter(CD, C_st, DHD, DH, bh, c, r0, k0, S, NC, d_qk, d_hv, b_bar * rs, B_LQ,
                        B_DQK, B_DHV, NUM_DHV, HAS_C0, DOT_PREC, USE_TMA)
        if L // B_LKV == 2:
            if n_kv == 2:
                k_0 = load_tile(KD, K, bh, c * L, k0, S, d_qk, B_LKV, B_DQK, USE_TMA)
                acc = tl.dot(ds_0, k_0, acc, input_precision=DOT_PREC)
        k_l = load_tile(KD, K, bh, c * L + j_last * B_LKV, k0, S, d_qk, B_LKV, B_DQK, USE_TMA)
        acc = tl.dot(ds_last, k_l, acc, input_precision=DOT_PREC)
        q_blk = load_tile(QD, Q, bh, r0, k0, S, d_qk, B_LQ, B_DQK, USE_TMA)
        store_tile(DQD, DQ, acc.to(DQ.dtype.element_ty), bh, r0, k0, S, d_qk, B_LQ, B_DQK,
                   USE_TMA)
        rowsum += tl.sum(q_blk.to(tl.float32) * acc, 1)
    tl.store(QDQ + bh * S_pad + rows, rowsum)


@triton.jit
def _dkv_kernel(
    Q, K, V, DH, QD, KD, VD, DHD, DCD, DKD, DVD, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT,
    DC_st, DK, DV, KDK, S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr, NUM_DQK: tl.constexpr, NUM_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, ATOMIC_ROWSUM: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    # dK and dV in one grid (rule B9): per (key/value tile, chunk, b·head) the NUM_DQK dK
    # programs (d_qk blocks) and then the NUM_DHV dV programs (d_hv blocks), next to each
    # other, so that the chunk's dC_k, K, V, Q and dH tiles that both read come from HBM
    # once and from L2 for the rest
    blk, pid_kv, c, bh = chunk_tile_pid(tl.program_id(0), NUM_DQK + NUM_DHV, L // B_LKV, NC)
    if blk < NUM_DQK:
        _dkv_tile(V, DH, Q, K, VD, DHD, QD, KD, DCD, DKD, B_vec, I_vec, A_vec, MI_vec, M_st,
                  NOUT, DC_st, DK, KDK, blk, pid_kv, c, bh, S, NC, d_qk, d_hv, scale, eps,
                  L, B_LQ, B_LKV, B_DQK, B_DHV, NUM_DHV, True, IS_EXP, NORMALIZE,
                  ATOMIC_ROWSUM, DOT_PREC, USE_TMA)
    else:
        _dkv_tile(K, Q, DH, K, KD, QD, DHD, KD, DCD, DVD, B_vec, I_vec, A_vec, MI_vec, M_st,
                  NOUT, DC_st, DV, KDK, blk - NUM_DQK, pid_kv, c, bh, S, NC, d_qk, d_hv, scale,
                  eps, L, B_LQ, B_LKV, B_DHV, B_DQK, NUM_DQK, False, IS_EXP, NORMALIZE, False,
                  DOT_PREC, USE_TMA)


@triton.jit
def _dkv_tile(
    X, Y, Z, K, XD, YD, ZD, KD, DCD, DXD, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT, DC_st, DX, KDK,
    pid_o, pid_kv, c, bh, S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_OUT: tl.constexpr, B_RED: tl.constexpr, NUM_RED: tl.constexpr, OUT_K: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, ATOMIC_ROWSUM: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One program of :func:`_dkv_kernel`: the output block pid_o of dK (OUT_K) or dV for
    key/value tile pid_kv of chunk c of b·head bh; the same loops with the roles of the head
    dimensions swapped:

        dK = ā ⊙ (V dC_kᵀ) + (V dH̃ᵀ ⊙ Dᵀ) Q · scale   (out: d_qk; contracted: d_hv)
        dV = (ā ⊙ K) dC_k + (K Qᵀ ⊙ Dᵀ) dH̃ · scale   (out: d_hv; contracted: d_qk)

    X is the key-side operand of the contraction (V | K), Y its query-side partner (dH | Q),
    Z the query-side operand of the output (Q | dH); B_OUT, B_RED the blocks of the output
    and contracted head dimensions. dK also writes the row sums k·dk to KDK."""
    if OUT_K:
        D_OUT = d_qk
        D_RED = d_hv
    else:
        D_OUT = d_hv
        D_RED = d_qk
    S_pad = NC * L
    s_loc, s0, cols = tile_rows(c, pid_kv, L, B_LKV)
    o0 = pid_o * B_OUT
    b_kv, i_kv, a_bar = _kv_rows(B_vec, I_vec, A_vec, M_st, bh, c, cols, S_pad, NC, IS_EXP)
    # inter: ā ⊙ (X dC_k (dK: transposed)) (also where dC_k = 0: a trip count of 0 at the last
    # chunk, as in dQ, made the two launches 8 % slower at d_qk 256 / d_hv 512)
    acc = _inter_dc(XD, X, DCD, DC_st, bh, c, s0, o0, a_bar, S, NC, d_qk, d_hv, D_RED, B_LKV,
                    B_OUT, B_RED, NUM_RED, OUT_K, DOT_PREC, USE_TMA)
    # intra: (X Yᵀ ⊙ Dᵀ) Z · scale over query tiles on or after the diagonal
    j0 = (pid_kv * B_LKV) // B_LQ
    for j in range(j0, L // B_LQ):
        st = _gated_st(XD, X, YD, Y, B_vec, MI_vec, M_st, NOUT, bh, c, j, s0, s_loc, b_kv,
                       i_kv, S, NC, D_RED, scale, eps, L, B_LQ, B_LKV, B_RED, NUM_RED, IS_EXP,
                       NORMALIZE, DOT_PREC, USE_TMA)
        z_blk = load_tile(ZD, Z, bh, c * L + j * B_LQ, o0, S, D_OUT, B_LQ, B_OUT, USE_TMA)
        acc = tl.dot(st.to(z_blk.dtype), z_blk, acc, input_precision=DOT_PREC)
    if OUT_K:
        k_blk = load_tile(KD, K, bh, s0, o0, S, d_qk, B_LKV, B_OUT, USE_TMA)
    store_tile(DXD, DX, acc.to(DX.dtype.element_ty), bh, s0, o0, S, D_OUT, B_LKV, B_OUT, USE_TMA)
    if OUT_K:
        _store_rowsum(KDK, bh, S_pad, cols, k_blk, acc, ATOMIC_ROWSUM)


@triton.jit
def _inter_dc(XD, X, DCD, DC_st, bh, c, s0, o0, a_bar, S, NC, d_qk, d_hv, D_RED,
              B_LKV: tl.constexpr, B_OUT: tl.constexpr, B_RED: tl.constexpr,
              NUM_RED: tl.constexpr, OUT_K: tl.constexpr, DOT_PREC: tl.constexpr,
              USE_TMA: tl.constexpr):
    """ā ⊙ (X dC_k) fp32 (B_LKV, B_OUT): output columns o0.. of key/value tile s0 of chunk c,
    dC_k transposed for dK (OUT_K), the contraction over D_RED in NUM_RED blocks of B_RED;
    dC_k in the (BNH·(N_c+1), d_qk, d_hv) view."""
    acc = tl.zeros((B_LKV, B_OUT), dtype=tl.float32)
    dc_row = bh * (NC + 1) + c + 1
    for rb in range(NUM_RED):
        x_blk = load_tile(XD, X, bh, s0, rb * B_RED, S, D_RED, B_LKV, B_RED, USE_TMA)
        if OUT_K:
            dc_blk = tl.trans(load_tile(DCD, DC_st, dc_row, o0, rb * B_RED, d_qk, d_hv,
                                        B_OUT, B_RED, USE_TMA))
        else:
            dc_blk = load_tile(DCD, DC_st, dc_row, rb * B_RED, o0, d_qk, d_hv, B_RED, B_OUT,
                               USE_TMA)
        acc = tl.dot(x_blk, dc_blk.to(x_blk.dtype), acc, input_precision=DOT_PREC)
    return acc * a_bar[:, None]


@triton.jit
def _gated_st(XD, X, YD, Y, B_vec, MI_vec, M_st, NOUT, bh, c, j, s0, s_loc, b_kv, i_kv, S, NC,
              D_RED, scale, eps, L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
              B_RED: tl.constexpr, NUM_RED: tl.constexpr, IS_EXP: tl.constexpr,
              NORMALIZE: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr):
    """(X Yᵀ ⊙ Dᵀ) · row scale of key/value tile s0 and query tile j of chunk c, fp32
    (B_LKV, B_LQ): X the key-side operand (V | K), Y its query-side partner (dH̃ | Q), the
    contraction over D_RED in NUM_RED blocks of B_RED, in the order ``_dkv_tile`` takes."""
    r_loc, r0, rows = tile_rows(c, j, L, B_LQ)
    b_q, mc_q, b_bar, rs = _q_rows(B_vec, MI_vec, M_st, NOUT, bh, c, rows, NC * L, NC, scale,
                                   eps, IS_EXP, NORMALIZE)
    st = tl.zeros((B_LKV, B_LQ), dtype=tl.float32)
    for rb in range(NUM_RED):
        x_blk = load_tile(XD, X, bh, s0, rb * B_RED, S, D_RED, B_LKV, B_RED, USE_TMA)
        y_blk = load_tile(YD, Y, bh, r0, rb * B_RED, S, D_RED, B_LQ, B_RED, USE_TMA)
        st = tl.dot(x_blk, tl.trans(y_blk), st, input_precision=DOT_PREC)
    d_log = gate_exponent(b_q, mc_q, b_kv, i_kv, r_loc, s_loc, True)
    return st * tl.exp(d_log) * rs[None, :]


@triton.jit
def _dkv_once_kernel(
    Q, K, V, DH, QD, KD, VD, DHD, DCD, DKD, DVD, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT,
    DC_st, DK, DV, KDK, S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr, NUM_DQK: tl.constexpr, NUM_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    # dK and dV with each product of a key/value tile formed once (rule B10): per (key/value
    # tile, chunk, b·head) one dK program and one dV program, next to each other. Each forms
    # its gated product with the chunk's query tiles (V dH̃ᵀ ⊙ Dᵀ, K Qᵀ ⊙ Dᵀ; at most two
    # tiles, L <= 2·B_LQ) once, keeps it on chip, and loops over its output blocks;
    # _dkv_kernel's d_qk / d_hv-block programs each form it again
    role, pid_kv, c, bh = chunk_tile_pid(tl.program_id(0), 2, L // B_LKV, NC)
    if role == 0:
        _dkv_once_tile(V, DH, Q, K, VD, DHD, QD, KD, DCD, DKD, B_vec, I_vec, A_vec, MI_vec,
                       M_st, NOUT, DC_st, DK, KDK, pid_kv, c, bh, S, NC, d_qk, d_hv, scale, eps,
                       L, B_LQ, B_LKV, B_DQK, B_DHV, NUM_DQK, NUM_DHV, True, IS_EXP,
                       NORMALIZE, DOT_PREC, USE_TMA)
    else:
        _dkv_once_tile(K, Q, DH, K, KD, QD, DHD, KD, DCD, DVD, B_vec, I_vec, A_vec, MI_vec,
                       M_st, NOUT, DC_st, DV, KDK, pid_kv, c, bh, S, NC, d_qk, d_hv, scale, eps,
                       L, B_LQ, B_LKV, B_DHV, B_DQK, NUM_DHV, NUM_DQK, False, IS_EXP,
                       NORMALIZE, DOT_PREC, USE_TMA)


@triton.jit
def _dkv_once_tile(
    X, Y, Z, K, XD, YD, ZD, KD, DCD, DXD, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT, DC_st, DX,
    KDK, pid_kv, c, bh, S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_OUT: tl.constexpr, B_RED: tl.constexpr, NUM_OUT: tl.constexpr, NUM_RED: tl.constexpr,
    OUT_K: tl.constexpr, IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One program of :func:`_dkv_once_kernel`: all output blocks of dK (OUT_K) or dV for
    key/value tile pid_kv of chunk c, roles as in ``_dkv_tile`` (X, Y, Z; B_OUT, B_RED the
    blocks of the output and contracted head dimensions). The gated products with the last
    query tile and (for the first key/value tile of a two-tile chunk) the first are formed
    once, rounded to Z's dtype as ``_dkv_tile`` rounds them, then every output block adds
    ā ⊙ (X dC_k) and those products times its Z block, in ``_dkv_tile``'s order. dK also
    writes the row sums k·dk, summed over its blocks here (no atomics)."""
    if OUT_K:
        D_OUT = d_qk
        D_RED = d_hv
    else:
        D_OUT = d_hv
        D_RED = d_qk
    S_pad = NC * L
    s_loc, s0, cols = tile_rows(c, pid_kv, L, B_LKV)
    b_kv, i_kv, a_bar = _kv_rows(B_vec, I_vec, A_vec, M_st, bh, c, cols, S_pad, NC, IS_EXP)
    z_ty = Z.dtype.element_ty
    j_last = L // B_LQ - 1
    first = (pid_kv * B_LKV) // B_LQ == 0       # this tile also sees query tile 0
    st_last = _gated_st(XD, X, YD, Y, B_vec, MI_vec, M_st, NOUT, bh, c, j_last, s0, s_loc,
                        b_kv, i_kv, S, NC, D_RED, scale, eps, L, B_LQ, B_LKV, B_RED, NUM_RED,
                        IS_EXP, NORMALIZE, DOT_PREC, USE_TMA).to(z_ty)
    if L // B_LQ == 2:
        if first:
            st_0 = _gated_st(XD, X, YD, Y, B_vec, MI_vec, M_st, NOUT, bh, c, 0, s0, s_loc,
                             b_kv, i_kv, S, NC, D_RED, scale, eps, L, B_LQ, B_LKV, B_RED,
                             NUM_RED, IS_EXP, NORMALIZE, DOT_PREC, USE_TMA).to(z_ty)
        else:
            st_0 = tl.zeros((B_LKV, B_LQ), dtype=z_ty)
    r0_last = c * L + j_last * B_LQ
    rowsum = tl.zeros((B_LKV,), dtype=tl.float32)
    for ob in range(NUM_OUT):
        o0 = ob * B_OUT
        acc = _inter_dc(XD, X, DCD, DC_st, bh, c, s0, o0, a_bar, S, NC, d_qk, d_hv, D_RED,
                        B_LKV, B_OUT, B_RED, NUM_RED, OUT_K, DOT_PREC, USE_TMA)
        if L // B_LQ == 2:
            if first:
                z_0 = load_tile(ZD, Z, bh, c * L, o0, S, D_OUT, B_LQ, B_OUT, USE_TMA)
                acc = tl.dot(st_0, z_0, acc, input_precision=DOT_PREC)
        z_l = load_tile(ZD, Z, bh, r0_last, o0, S, D_OUT, B_LQ, B_OUT, USE_TMA)
        acc = tl.dot(st_last, z_l, acc, input_precision=DOT_PREC)
        store_tile(DXD, DX, acc.to(DX.dtype.element_ty), bh, s0, o0, S, D_OUT, B_LKV, B_OUT,
                   USE_TMA)
        if OUT_K:
            k_blk = load_tile(KD, K, bh, s0, o0, S, d_qk, B_LKV, B_OUT, USE_TMA)
            rowsum += tl.sum(k_blk.to(tl.float32) * acc, 1)
    if OUT_K:
        tl.store(KDK + bh * S_pad + cols, rowsum)


@triton.jit
def _dkv_fused_kernel(
    Q, K, V, DH, QD, KD, VD, DHD, DCD, DKD, DVD, B_vec, I_vec, A_vec, MI_vec, M_st, NOUT, DC_st,
    DK, DV, KDK, S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DC_LAST: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    # dK and dV of one key/value tile together (whole head dimensions: B_DQK >= d_qk,
    # B_DHV >= d_hv): K, V and dC_k are read once, and per query tile on or after the
    # diagonal the gate matrix Dᵀ (row scale included), P = K Qᵀ ⊙ Dᵀ and dP = V dH̃ᵀ ⊙ Dᵀ
    # are formed once each:
    #   dK = ā ⊙ (V dC_kᵀ) + dP Q,   dV = ā ⊙ (K dC_k) + P dH̃   (scale inside the row scale)
    _, pid_kv, c, bh = chunk_tile_pid(tl.program_id(0), 1, L // B_LKV, NC)
    S_pad = NC * L
    s_loc, s0, cols = tile_rows(c, pid_kv, L, B_LKV)
    b_kv, i_kv, a_bar = _kv_rows(B_vec, I_vec, A_vec, M_st, bh, c, cols, S_pad, NC, IS_EXP)
    k_blk = load_tile(KD, K, bh, s0, 0, S, d_qk, B_LKV, B_DQK, USE_TMA)
    v_blk = load_tile(VD, V, bh, s0, 0, S, d_hv, B_LKV, B_DHV, USE_TMA)
    dk = tl.zeros((B_LKV, B_DQK), dtype=tl.float32)
    dv = tl.zeros((B_LKV, B_DHV), dtype=tl.float32)
    # intra over query tiles on or after the diagonal
    j0 = (pid_kv * B_LKV) // B_LQ
    for j in range(j0, L // B_LQ):
        r_loc, r0, rows = tile_rows(c, j, L, B_LQ)
        b_q, mc_q, b_bar, rs = _q_rows(B_vec, MI_vec, M_st, NOUT, bh, c, rows, S_pad, NC,
                                       scale, eps, IS_EXP, NORMALIZE)
        q_blk = load_tile(QD, Q, bh, r0, 0, S, d_qk, B_LQ, B_DQK, USE_TMA)
        dh_blk = load_tile(DHD, DH, bh, r0, 0, S, d_hv, B_LQ, B_DHV, USE_TMA)
        d_log = gate_exponent(b_q, mc_q, b_kv, i_kv, r_loc, s_loc, True)
        d_mat = tl.exp(d_log) * rs[None, :]
        p = tl.dot(k_blk, tl.trans(q_blk), input_precision=DOT_PREC) * d_mat
        dv = tl.dot(p.to(dh_blk.dtype), dh_blk, dv, input_precision=DOT_PREC)
        dp = tl.dot(v_blk, tl.trans(dh_blk), input_precision=DOT_PREC) * d_mat
        dk = tl.dot(dp.to(q_blk.dtype), q_blk, dk, input_precision=DOT_PREC)
    # inter: ā ⊙ (V dC_kᵀ), ā ⊙ (K dC_k), dC_k in the (BNH·(N_c+1), d_qk, d_hv) view (after
    # the loop: Triton 3.6 fails to pipeline the loop's tile loads when K and V also feed a
    # dot before it); none at the last chunk without dC_last (dC_N = 0)
    if HAS_DC_LAST or c < NC - 1:
        dc_blk = load_tile(DCD, DC_st, bh * (NC + 1) + c + 1, 0, 0, d_qk, d_hv, B_DQK, B_DHV,
                           USE_TMA).to(k_blk.dtype)
        dv += tl.dot(k_blk, dc_blk, input_precision=DOT_PREC) * a_bar[:, None]
        dk += tl.dot(v_blk, tl.trans(dc_blk), input_precision=DOT_PREC) * a_bar[:, None]
    store_tile(DVD, DV, dv.to(DV.dtype.element_ty), bh, s0, 0, S, d_hv, B_LKV, B_DHV, USE_TMA)
    store_tile(DKD, DK, dk.to(DK.dtype.element_ty), bh, s0, 0, S, d_qk, B_LKV, B_DQK, USE_TMA)
    # the row sums k·dk from the K tile already on chip (rule B8): loading it again here
    # added one more load waited for, with one program per SM, to every program
    tl.store(KDK + bh * S_pad + cols, tl.sum(k_blk.to(tl.float32) * dk, 1))


def _fused_dkv_rule(L: int, d_qk: int, d_hv: int, dtype: torch.dtype) -> dict:
    """Where dK and dV run as one launch by default (docs/kernels.md, tuning rule B4): 16-bit
    inputs at the head shapes and chunk sizes where it was measured faster, with the tiles
    measured there; elsewhere ``_dkv_kernel``'s dK and dV programs. At L 128 also rule B5:
    3 pipeline stages for the one launch, and dQ (which the other bw keys then configure
    alone) in d_hv blocks of 64 with 3 stages at 128 / 256, with one stage at 64 / 128.
    GLUON: the one launch in Gluon where rule B13 holds (``chunkwise_parallel_bw_gluon``)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return {}
    heads = (pow2(d_qk), pow2(d_hv))
    if heads == (128, 256) and L in (128, 256):
        b5 = dict(DKV_num_stages=3, B_DHV=64, num_stages=3) if L == 128 else {}
        return dict(FUSED_DKV=True, DKV_B_LQ=64, DKV_B_LKV=64, DKV_num_warps=8, GLUON=True,
                    **b5)
    if heads == (64, 128) and L in (64, 128):
        b5 = dict(DKV_num_stages=3, num_stages=1) if L == 128 else {}
        return dict(FUSED_DKV=True, DKV_B_LQ=64, DKV_B_LKV=64, DKV_num_warps=4, GLUON=True,
                    **b5)
    return {}


def _once_rule(L: int, d_qk: int, d_hv: int, dtype: torch.dtype) -> dict:
    """Where the backward forms each tile's products once by default (docs/kernels.md, tuning
    rules B10, B11), for 16-bit inputs at L 128:

    - B10, dK and dV as ``_dkv_once_kernel`` (``bw_config`` keeps it only where B4's
      one-program kernel does not run), in its own DKV_* tiles: at d_qk 256 / d_hv 512
      the whole chunk as one query and one key/value tile, 8 warps, 3 pipeline stages;
      elsewhere 64-row tiles, 4 warps, 2 stages;
    - B11, at d_qk 256 / d_hv 512 only, dQ as ``_dq_once_kernel`` in 3 pipeline stages.

    At d_qk 256 / d_hv 512 also at L 256 (what "auto" takes there, rule C2): dK/dV in
    128-row tiles (two of each per chunk), dQ in 64-row query tiles against 128-row key
    tiles, both in Gluon where rules B12 and B14 hold (``GLUON``).
    """
    fig5 = (pow2(d_qk), pow2(d_hv)) == (256, 512)
    if dtype not in (torch.bfloat16, torch.float16) or L not in ((128, 256) if fig5 else (128,)):
        return {}
    if fig5:
        # at L 256 dQ and dK/dV in Gluon where they can run (B12, chunkwise_parallel_bw_gluon;
        # B14, chunkwise_parallel_bw_gluon_once)
        dq = dict(B_LKV=128, GLUON=True) if L == 256 else {}
        return dict(ONCE_DKV=True, DKV_B_LQ=128, DKV_B_LKV=128, DKV_num_warps=8,
                    DKV_num_stages=3, ONCE_DQ=True, num_stages=3, **dq)
    return dict(ONCE_DKV=True, DKV_B_LQ=64, DKV_B_LKV=64, DKV_num_warps=4, DKV_num_stages=2)


def bw_config(L: int, d_qk: int, d_hv: int, dtype: torch.dtype,
              tuning: Tuning = DEFAULT) -> dict:
    """Tile sizes of the xl_chunk backward kernels (docs/kernels.md, tuning rules B2-B5, B10,
    B11). USE_TMA: tiles and stores through tensor descriptors, on for 16-bit inputs.
    B_LQ, B_LKV, B_DQK, B_DHV, num_warps, num_stages: dQ's, and dK/dV's where neither of:

    - FUSED_DKV: dK and dV in one launch (``_dkv_fused_kernel``, its tiles DKV_*), only
      where d_qk and d_hv fit one tile of at most 256 columns;
    - ONCE_DKV, elsewhere: ``_dkv_once_kernel`` (rule B10; its row tiles, warps and stages
      DKV_*, its head-dimension blocks DKV_B_DQK / DKV_B_DHV, by default B_DQK / B_DHV),
      only where a chunk holds at most two of its query tiles.

    ONCE_DQ: dQ as ``_dq_once_kernel`` (rule B11), only where a chunk holds at most two
    key/value tiles. ``tuning.bw``'s keys win over every default (FUSED is
    :func:`fused_bw`'s). A new dict per call, worked out once per set of arguments (both
    launches of every backward ask: docs/kernels.md, "Host time")."""
    return dict(_bw_config(L, d_qk, d_hv, dtype, tuning))


@functools.lru_cache(maxsize=256)
def _bw_config(L: int, d_qk: int, d_hv: int, dtype: torch.dtype, tuning: Tuning) -> dict:
    """:func:`bw_config`'s rule (the cached dict: callers get a copy)."""
    fp32 = dtype == torch.float32
    b_l = min(64, L)
    cap = 64 if fp32 else 128
    cfg = dict(
        B_LQ=b_l, B_LKV=b_l,
        B_DQK=head_block(d_qk, cap),
        B_DHV=head_block(d_hv, cap),
        num_warps=4, num_stages=2, USE_TMA=dtype in (torch.bfloat16, torch.float16),
        # dK and dV in one launch (_dkv_fused_kernel), where the whole head dimensions fit
        # one tile (d_qk, d_hv <= 256); its own tiles, warps and stages
        FUSED_DKV=False, DKV_B_LQ=32, DKV_B_LKV=64, DKV_num_warps=8, DKV_num_stages=2,
        # where dK and dV are separate programs: one of each per key/value tile, each
        # forming its tile's products once (_dkv_once_kernel, its tiles DKV_*; head-dimension
        # blocks DKV_B_DQK / DKV_B_DHV, None: B_DQK / B_DHV)
        ONCE_DKV=False, DKV_B_DQK=None, DKV_B_DHV=None,
        # one dQ program per query tile, forming its products once (_dq_once_kernel)
        ONCE_DQ=False,
        # that program in Gluon (_dq_gluon_kernel) where rule B12 holds
        GLUON=False,
    )
    cfg.update(_once_rule(L, d_qk, d_hv, dtype))
    cfg.update(_fused_dkv_rule(L, d_qk, d_hv, dtype))
    cfg.update((k, v) for k, v in tuning.bw.items() if k != "FUSED")
    for key in ("B_LQ", "B_LKV", "DKV_B_LQ", "DKV_B_LKV"):
        cfg[key] = min(cfg[key], L)
    cfg["FUSED_DKV"] = bool(cfg["FUSED_DKV"]) and max(pow2(d_qk), pow2(d_hv)) <= 256
    cfg["ONCE_DKV"] = (bool(cfg["ONCE_DKV"]) and not cfg["FUSED_DKV"]
                       and L // cfg["DKV_B_LQ"] <= 2)
    cfg["ONCE_DQ"] = bool(cfg["ONCE_DQ"]) and L // cfg["B_LKV"] <= 2
    cfg["DKV_B_DQK"] = cfg["DKV_B_DQK"] or cfg["B_DQK"]
    cfg["DKV_B_DHV"] = cfg["DKV_B_DHV"] or cfg["B_DHV"]
    return cfg


def fused_bw(L: int, d_qk: int, d_hv: int, dtype: torch.dtype,
             tuning: Tuning = DEFAULT) -> bool:
    """Whether xl_chunk's backward runs the one-program-per-chunk kernel of limit_chunk
    (``limit_parallel_bw``: dQ, dK, dV of a chunk from its L x L matrices held on chip)
    instead of the three tiled kernels here: off unless ``tuning.bw["FUSED"]`` (L <= 128)."""
    return bool(tuning.bw.get("FUSED", False)) and L <= 128


def _rowsum_buffer(q, NC: int, L: int, atomic: bool) -> torch.Tensor:
    """The fp32 row sums (BNH, N_c*L) that a launch writes (q·dq or k·dk): zeroed where
    several programs (d_qk blocks) add into a row, else left unset."""
    return (torch.zeros if atomic else torch.empty)((q.shape[0], NC * L), device=q.device,
                                                    dtype=torch.float32)


def _launch_common(q, v, L: int, tuning: Tuning):
    """(cfg, NC, n_dqk, n_dhv, scale, dot precision) shared by the dQ and the dK/dV launches."""
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    cfg = bw_config(L, d_qk, d_hv, q.dtype, tuning)
    return (cfg, cdiv(S, L), cdiv(d_qk, cfg["B_DQK"]),
            cdiv(d_hv, cfg["B_DHV"]), d_qk ** -0.5, dot_precision(q.dtype))


def dq_in_gluon(q, k, v, C_st, dh, *, L: int, is_exp: bool, normalize: bool,
                tuning: Tuning = DEFAULT) -> bool:
    """Whether :func:`parallel_bw_dq` runs dQ as the Gluon kernel (rule B12:
    ``bw_config``'s ``GLUON`` and ``chunkwise_parallel_bw_gluon.applies_dq``) for these
    tensors, as it takes them."""
    cfg = bw_config(L, q.shape[-1], v.shape[-1], q.dtype, tuning)
    if not cfg["GLUON"]:
        return False
    from tfla.triton import chunkwise_parallel_bw_gluon as gbw

    return gbw.applies_dq(cfg, q, k, v, C_st, dh, L=L, is_exp=is_exp, normalize=normalize)


def parallel_bw_dq(q, k, v, gates, m_st, n_out, C_st, dh, *, L: int, is_exp: bool,
                   normalize: bool, eps: float, has_c0: bool = True, tuning: Tuning = DEFAULT):
    """dq (input dtype) and the fp32 row sums q·dq (BNH, N_c*L) (``_dq_kernel``, or
    ``_dq_once_kernel`` where ``bw_config`` sets ONCE_DQ, in Gluon where rule B12 holds; it needs the
    forward's chunk states C_st, not the state gradients, so it may run beside
    :func:`tfla.triton.chunkwise_recurrent.recurrent_bw`). q, k (BNH, S, d_qk), v, dh (BNH, S,
    d_hv) contiguous in the input dtype; gates (b, a, ī, m^intra) and m_st, n_out as the
    forward returns them. ``has_c0`` False: C_st's slot 0 is zero (no initial state) and
    chunk 0's inter-chunk product is skipped. ``tuning``: overrides of :func:`bw_config`'s
    rules."""
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    cfg, NC, n_dqk, n_dhv, scale, prec = _launch_common(q, v, L, tuning)
    if dq_in_gluon(q, k, v, C_st, dh, L=L, is_exp=is_exp, normalize=normalize, tuning=tuning):
        from tfla.triton import chunkwise_parallel_bw_gluon as gbw

        return gbw.parallel_bw_dq_gluon(q, k, v, gates[0], gates[2], C_st, dh, L=L,
                                        has_c0=has_c0)
    atomic = n_dqk > 1 and not cfg["ONCE_DQ"]
    qdq = _rowsum_buffer(q, NC, L, atomic)
    dq = torch.empty_like(q)
    blq, blkv, bqk, bhv = cfg["B_LQ"], cfg["B_LKV"], cfg["B_DQK"], cfg["B_DHV"]
    C_view = C_st.view(-1, d_qk, d_hv)
    tma = bool(cfg["USE_TMA"]) and can_use_tma(q, k, v, dh, C_view, dq,
                                                blocks=(blq, blkv, bqk, bhv))
    D = lambda t, *blk: descriptor(t, (1, *blk), tma)  # noqa: E731
    b_vec, _, i_vec, mi_vec = gates
    if cfg["ONCE_DQ"]:      # one program per query tile, over the d_qk blocks (B11)
        kernel, programs, extra = _dq_once_kernel, 1, dict(NUM_DQK=n_dqk)
    else:                   # one program per d_qk block and query tile
        kernel, programs, extra = _dq_kernel, n_dqk, dict(ATOMIC_ROWSUM=atomic)
    launch(
        kernel, (programs * (L // blq) * NC * BNH,),
        q, k, v, D(q, blq, bqk), D(k, blkv, bqk), D(v, blkv, bhv), D(C_view, bqk, bhv),
        D(dh, blq, bhv), D(dq, blq, bqk),
        b_vec, i_vec, mi_vec, m_st, n_out, C_st, dh, dq, qdq,
        S, NC, d_qk, d_hv, scale, eps, L=L, B_LQ=blq, B_LKV=blkv, B_DQK=bqk, B_DHV=bhv,
        NUM_DHV=n_dhv, IS_EXP=is_exp, NORMALIZE=normalize, HAS_C0=has_c0, DOT_PREC=prec,
        USE_TMA=tma, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **extra)
    return dq, qdq


def parallel_bw_dkv(q, k, v, gates, m_st, n_out, dC_st, dh, *, L: int, is_exp: bool,
                    normalize: bool, eps: float, has_dc_last: bool = True,
                    tuning: Tuning = DEFAULT):
    """dk, dv (input dtype) and the fp32 row sums k·dk (BNH, N_c*L): one launch of
    ``_dkv_fused_kernel`` where ``bw_config`` sets FUSED_DKV (in Gluon where rule B13 holds:
    ``chunkwise_parallel_bw_gluon``), of ``_dkv_once_kernel`` where it sets ONCE_DKV (in
    Gluon where rule B14 holds: ``chunkwise_parallel_bw_gluon_once``), else one of
    ``_dkv_kernel``.
    Tensors as :func:`parallel_bw_dq` takes them, and the state gradients dC_st (BNH, N_c+1,
    d_qk, d_hv). ``has_dc_last`` False: dC_st's slot N_c is zero (the last state has no
    gradient) and the one-launch kernel skips the last chunk's inter-chunk product."""
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    cfg, NC, n_dqk, n_dhv, scale, prec = _launch_common(q, v, L, tuning)
    b_vec, a_vec, i_vec, mi_vec = gates
    if cfg["GLUON"]:
        from tfla.triton import chunkwise_parallel_bw_gluon as gbw
        from tfla.triton import chunkwise_parallel_bw_gluon_once as gonce

        if gbw.applies_dkv(cfg, q, k, v, dC_st, dh, L=L, is_exp=is_exp, normalize=normalize):
            return gbw.parallel_bw_dkv_gluon(q, k, v, b_vec, i_vec, a_vec, dC_st, dh, L=L,
                                             has_dc_last=has_dc_last,
                                             num_warps=cfg["DKV_num_warps"])
        if gonce.applies_dkv_once(cfg, q, k, v, dC_st, dh, L=L, is_exp=is_exp,
                                  normalize=normalize):
            return gonce.parallel_bw_dkv_once_gluon(q, k, v, b_vec, i_vec, a_vec, dC_st, dh, L=L,
                                                    has_dc_last=has_dc_last)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dC_view = dC_st.view(-1, d_qk, d_hv)
    # the one-launch kernel and B10's dK programs hold the whole d_qk: one program per row
    atomic = n_dqk > 1 and not (cfg["FUSED_DKV"] or cfg["ONCE_DKV"])
    kdk = _rowsum_buffer(q, NC, L, atomic)
    if cfg["FUSED_DKV"]:
        flq, flkv, fqk, fhv = cfg["DKV_B_LQ"], cfg["DKV_B_LKV"], pow2(d_qk), pow2(d_hv)
        tma_f = bool(cfg["USE_TMA"]) and can_use_tma(q, k, v, dh, dC_view, dk, dv,
                                                      blocks=(flq, flkv, fqk, fhv))
        Df = lambda t, *blk: descriptor(t, (1, *blk), tma_f)  # noqa: E731
        launch(
            _dkv_fused_kernel, ((L // flkv) * NC * BNH,), q, k, v, dh, Df(q, flq, fqk), Df(k, flkv, fqk), Df(v, flkv, fhv), Df(dh, flq, fhv),
            Df(dC_view, fqk, fhv), Df(dk, flkv, fqk), Df(dv, flkv, fhv),
            b_vec, i_vec, a_vec, mi_vec, m_st, n_out, dC_st, dk, dv, kdk,
            S, NC, d_qk, d_hv, scale, eps, L=L, B_LQ=flq, B_LKV=flkv, B_DQK=fqk, B_DHV=fhv,
            IS_EXP=is_exp, NORMALIZE=normalize, HAS_DC_LAST=has_dc_last, DOT_PREC=prec,
            USE_TMA=tma_f,
            num_warps=cfg["DKV_num_warps"], num_stages=cfg["DKV_num_stages"])
        return dk, dv, kdk
    if cfg["ONCE_DKV"]:     # one dK and one dV program per key/value tile (B10)
        kernel, programs, pre = _dkv_once_kernel, 2, "DKV_"
        extra = {}
    else:                   # the d_qk blocks of dK, then the d_hv blocks of dV (B9)
        kernel, programs, pre = _dkv_kernel, n_dqk + n_dhv, ""
        extra = dict(ATOMIC_ROWSUM=atomic)
    blq, blkv, bqk, bhv = (cfg[pre + key] for key in ("B_LQ", "B_LKV", "B_DQK", "B_DHV"))
    tma = bool(cfg["USE_TMA"]) and can_use_tma(q, k, v, dh, dC_view, dk, dv,
                                                blocks=(blq, blkv, bqk, bhv))
    D = lambda t, *blk: descriptor(t, (1, *blk), tma)  # noqa: E731
    launch(
        kernel, (programs * (L // blkv) * NC * BNH,),
        q, k, v, dh, D(q, blq, bqk), D(k, blkv, bqk), D(v, blkv, bhv), D(dh, blq, bhv),
        D(dC_view, bqk, bhv), D(dk, blkv, bqk), D(dv, blkv, bhv),
        b_vec, i_vec, a_vec, mi_vec, m_st, n_out, dC_st, dk, dv, kdk,
        S, NC, d_qk, d_hv, scale, eps, L=L, B_LQ=blq, B_LKV=blkv, B_DQK=bqk, B_DHV=bhv,
        NUM_DQK=cdiv(d_qk, bqk), NUM_DHV=cdiv(d_hv, bhv), IS_EXP=is_exp,
        NORMALIZE=normalize, DOT_PREC=prec, USE_TMA=tma, num_warps=cfg[pre + "num_warps"],
        num_stages=cfg[pre + "num_stages"], **extra)
    return dk, dv, kdk
