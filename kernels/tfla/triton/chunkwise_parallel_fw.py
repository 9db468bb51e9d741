"""Parallel (intra-chunk) forward kernel: H^(k) for all chunks at once (paper Table 1, row H).

One program = (d_hv block, query tile of B_Lhq rows, chunk, b, head); it loops over the
key/value tiles of its chunk on or below the diagonal (causal skipping, docs/tfla-tiling.md 4.6) and over
the d_qk blocks. Implements docs/tfla-kernels.md 2.4 ("intra-chunk part and combination").

Difference from the paper's Algorithm 1 (docs/tfla-tiling.md 4.4): the combined max state m^comb is not
found online. Every entry of the intra-chunk log-gate matrix D̃_rs = b_r - b_s + ī_s depends
on the gates alone, so m^comb_r = max(b_r + m_{k-1}, b_r + max_{s<=r}(ī_s - b_s)), with a
prefix maximum that the gate kernel stores per position (m^comb is the recurrent max
state m_t, docs/tfla-kernels.md 2.4). With m^comb known before the loop, mLSTMexp needs no
running max and no rescaling of the accumulators, and the inter-chunk term Q̄ C_{k-1}
shares the Q loads with the first S tile: the loop fusion the paper (C.2) reserves for
mLSTMsig applies to mLSTMexp as well.

With B_Lhq = B_Lkv = L the kernel is the one-level ``limit_chunk`` forward (docs/tfla-tiling.md 4.9):
one program holds the whole L x L gate and score matrices of its chunk.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfla.triton.common import (can_use_tma, cdiv, chunk_tile_pid, descriptor, dot_precision,
                                gate_exponent, head_block, launch, load_tile, placeholder,
                                pow2, store_tile, tile_rows)
from tfla.triton.tuning import DEFAULT, Tuning

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _inter_block(acc, den, q_blk, CD, C_st, n_base, c_row, k0, v0, d_qk, d_hv,
                 B_DQK: tl.constexpr, B_DHV: tl.constexpr, NORMALIZE: tl.constexpr,
                 DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr):
    """acc + Q_blk C_{k-1}[k0.., v0..] (and den + Q_blk n_{k-1}[k0..] where normalised):
    one d_qk block of the inter-chunk product, before the rows are scaled."""
    offs_k = k0 + tl.arange(0, B_DQK)
    c_blk = load_tile(CD, C_st, c_row, k0, v0, d_qk, d_hv, B_DQK, B_DHV, USE_TMA)
    acc = tl.dot(q_blk, c_blk.to(q_blk.dtype), acc, input_precision=DOT_PREC)
    if NORMALIZE:
        n_blk = tl.load(n_base + offs_k, mask=offs_k < d_qk, other=0.0)
        den += tl.sum(q_blk.to(tl.float32) * n_blk[None, :], 1)
    return acc, den


@triton.jit
def _parallel_fw_kernel(
    Q, K, V, QD, KD, VD, CD, HD, QSD, CSD, B_vec, I_vec, MI_vec, C_st, N_st, M_st, H, NOUT,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, B_LQ: tl.constexpr, B_LKV: tl.constexpr,
    B_DQK: tl.constexpr, B_DHV: tl.constexpr, NUM_DQK: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_TMA: tl.constexpr, INTER_IN_LOOP: tl.constexpr, B_CS: tl.constexpr,
    FIRST_ZERO: tl.constexpr,
):
    # 1-D grid, (d_hv block) fastest, then query tile, then chunk*b*head: programs that
    # share a chunk's K, V and C_{k-1} run next to each other (L2 reuse). USE_TMA: tiles
    # through the tensor descriptors QD, KD, VD, HD (BNH, S, d) and CD (BNH·(N_c+1), d_qk,
    # d_hv), whose bounds give the zeros past S; else masked pointers. FIRST_ZERO: the
    # initial state is zero (no C0, n0), so chunk 0 has no inter-chunk part and slot 0 of
    # C_st / n_st is not read (the state kernel need not store it; not with INTER_IN_LOOP).
    pid_v, pid_q, c, bh = chunk_tile_pid(tl.program_id(0), tl.cdiv(d_hv, B_DHV), L // B_LQ, NC)
    S_pad = NC * L

    r_loc, r0, rows = tile_rows(c, pid_q, L, B_LQ)      # positions inside the chunk, in S

    b_q = tl.load(B_vec + bh * S_pad + rows)
    if IS_EXP:
        m_prev = tl.load(M_st + bh * (NC + 1) + c)
        mc_q = tl.maximum(b_q + m_prev, tl.load(MI_vec + bh * S_pad + rows))   # m^comb
        b_bar = tl.exp(b_q + m_prev - mc_q)
    else:
        mc_q = tl.zeros((B_LQ,), dtype=tl.float32)
        b_bar = tl.exp(b_q)

    acc = tl.zeros((B_LQ, B_DHV), dtype=tl.float32)
    den = tl.zeros((B_LQ,), dtype=tl.float32)
    c_row = bh * (NC + 1) + c
    v0 = pid_v * B_DHV
    n_base = N_st + c_row * d_qk
    row_scale = b_bar * scale
    if INTER_IN_LOOP:
        # the inter-chunk part is summed inside the key/value loop below, one d_qk slice of
        # C_{k-1} per iteration, so that its loads are pipelined with the K and V tiles
        # (NUM_DQK == 1); only the Q tile is loaded (and waited for) before the loop
        q_tile = load_tile(QD, Q, bh, r0, 0, S, d_qk, B_LQ, B_DQK, USE_TMA)
    else:
        # inter-chunk part: Q C_{k-1} (and Q n_{k-1}); rows scaled by b̄ * scale afterwards
        if NUM_DQK == 1:
            q_tile = load_tile(QD, Q, bh, r0, 0, S, d_qk, B_LQ, B_DQK, USE_TMA)
            if FIRST_ZERO:
                if c > 0:
                    acc, den = _inter_block(acc, den, q_tile, CD, C_st, n_base, c_row, 0, v0,
                                            d_qk, d_hv, B_DQK, B_DHV, NORMALIZE, DOT_PREC,
                                            USE_TMA)
            else:
                acc, den = _inter_block(acc, den, q_tile, CD, C_st, n_base, c_row, 0, v0, d_qk,
                                        d_hv, B_DQK, B_DHV, NORMALIZE, DOT_PREC, USE_TMA)
        else:
            if FIRST_ZERO:
                n_inter = tl.where(c > 0, NUM_DQK, 0)
            else:
                n_inter = NUM_DQK
            for kb in range(n_inter):
                q_blk = load_tile(QD, Q, bh, r0, kb * B_DQK, S, d_qk, B_LQ, B_DQK, USE_TMA)
                acc, den = _inter_block(acc, den, q_blk, CD, C_st, n_base, c_row, kb * B_DQK,
                                        v0, d_qk, d_hv, B_DQK, B_DHV, NORMALIZE, DOT_PREC,
                                        USE_TMA)
        acc = acc * row_scale[:, None]
        den = den * row_scale

    # intra-chunk part over key/value tiles on or below the diagonal
    n_kv = ((pid_q + 1) * B_LQ) // B_LKV
    for j in range(n_kv):
        s_loc, s0, cols = tile_rows(c, j, L, B_LKV)
        if INTER_IN_LOOP:
            # slice j of Q̄ C_{k-1} (Q̄ = b̄·scale ⊙ Q in the dot dtype): rows j·B_CS.. of C_{k-1};
            # B_DQK / B_CS <= n_kv slices cover d_qk, later ones lie past d_qk and load zeros
            cs0 = j * B_CS
            if B_CS == B_DQK:
                q_s = q_tile
            else:
                q_s = load_tile(QSD, Q, bh, r0, cs0, S, d_qk, B_LQ, B_CS, USE_TMA)
            c_s = load_tile(CSD, C_st, c_row, cs0, v0, d_qk, d_hv, B_CS, B_DHV, USE_TMA)
            q_bar = (q_s.to(tl.float32) * row_scale[:, None]).to(q_s.dtype)
            acc = tl.dot(q_bar, c_s.to(q_s.dtype), acc, input_precision=DOT_PREC)
            if NORMALIZE:
                offs_c = cs0 + tl.arange(0, B_CS)
                n_s = tl.load(n_base + offs_c, mask=offs_c < d_qk, other=0.0)
                den += tl.sum(q_s.to(tl.float32) * n_s[None, :], 1) * row_scale
        if NUM_DQK == 1:
            k_tile = load_tile(KD, K, bh, s0, 0, S, d_qk, B_LKV, B_DQK, USE_TMA)
            s = tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PREC)
        else:
            s = tl.zeros((B_LQ, B_LKV), dtype=tl.float32)
            for kb in range(NUM_DQK):
                q_blk = load_tile(QD, Q, bh, r0, kb * B_DQK, S, d_qk, B_LQ, B_DQK, USE_TMA)
                k_blk = load_tile(KD, K, bh, s0, kb * B_DQK, S, d_qk, B_LKV, B_DQK, USE_TMA)
                s = tl.dot(q_blk, tl.trans(k_blk), s, input_precision=DOT_PREC)
        i_kv = tl.load(I_vec + bh * S_pad + cols)                  # ī, -inf beyond S
        b_kv = tl.load(B_vec + bh * S_pad + cols)
        d_log = gate_exponent(b_q, mc_q, b_kv, i_kv, r_loc, s_loc, False)
        s_bar = s * scale * tl.exp(d_log)
        if NORMALIZE:
            den += tl.sum(s_bar, 1)
        v_tile = load_tile(VD, V, bh, s0, v0, S, d_hv, B_LKV, B_DHV, USE_TMA)
        acc = tl.dot(s_bar.to(v_tile.dtype), v_tile, acc, input_precision=DOT_PREC)

    if NORMALIZE:
        if IS_EXP:
            floor = tl.exp(-mc_q)
        else:
            floor = tl.full((B_LQ,), 1.0, dtype=tl.float32)
        n_out = tl.maximum(tl.abs(den), floor)
        acc = acc / (n_out + eps)[:, None]
        tl.store(NOUT + bh * S_pad + rows, n_out, mask=(rows * 0 + pid_v) == 0)
    store_tile(HD, H, acc.to(H.dtype.element_ty), bh, r0, v0, S, d_hv, B_LQ, B_DHV, USE_TMA)


def fw_config(L: int, d_qk: int, d_hv: int, dtype: torch.dtype, limit: bool,
              is_exp: bool = True, tuning: Tuning = DEFAULT) -> dict:
    """Tile sizes and warps of the H kernel (docs/kernels.md, tuning rules H1-H8).

    limit_chunk: B_Lhq = B_Lkv = L (the whole chunk). xl_chunk: 64 x 64 tiles (L >= 64).
    Head dims: B_dqk covers d_qk up to 128 in one block (Q stays in registers across the
    key/value loop); B_dhv at most 128 (64 for limit_chunk's L = 128 to bound registers).

    mLSTMsig xl_chunk in 16-bit dtypes (``is_exp`` False; the best of sweeps of tile
    configurations per shape, docs/kernels.md rules H2-H4, the latter with TMA tiles):
    d_qk <= 64 takes 64-row query tiles, 32-row key tiles, 4 warps and 2 stages (rule H2);
    d_qk <= 128 with d_hv >= 256 and L >= 128 takes 128-row query tiles, 64-row key tiles,
    the d_hv block 256 and 8 warps (rule H3);
    128 < d_qk <= 256 with L = 128 takes 128 x 128 tiles (the whole chunk), the whole d_qk,
    the d_hv block 256 and 8 warps (rule H4), except where d_qk blocks of 64 pad it less
    than its power of two (e.g. 192): 64 x 64 tiles, d_qk blocks of 64, the d_hv block 128,
    4 warps and 3 stages (rule H9); with d_hv > 256 and L = 256 (rule H7) 128-row
    query and 64-row key tiles, the whole d_qk, the d_hv block 256, 8 warps and one pipeline
    stage (two do not fit shared memory).
    mLSTMexp was not swept. ``GLUON`` (rule H8, on with H7's tiles): ``parallel_fw`` runs
    the H kernel in Gluon (``chunkwise_parallel_fw_gluon``) where its ``applies`` holds.

    ``INTER_IN_LOOP``: the inter-chunk product runs inside the key/value loop, one
    d_qk slice of C_{k-1} per iteration (:func:`inter_slice`), so that the loads of C_{k-1}
    are pipelined with those of K and V instead of waited for before the loop. On for the
    sig tiles at Figure 4's heads and L 128 (one query tile per chunk; docs/kernels.md, rule
    H5): slower where a query tile has more key/value iterations than slices, at the small
    heads and for mLSTMexp (the option takes it from two programs per SM to one); h equal to
    the default within bf16 rounding of the output.

    ``USE_TMA``: xl_chunk in 16-bit dtypes loads its tiles and stores H through tensor
    descriptors (docs/kernels.md, rule H6); limit_chunk was not measured and keeps pointers.
    The measured numbers of each rule: docs/kernel-measurements.md.

    ``tuning.fw`` (xl_chunk) or ``tuning.fw_limit`` (limit_chunk) keys win.
    """
    fp32 = dtype == torch.float32
    b_l = L if limit else min(64, L)
    b_qk = head_block(d_qk, 64 if fp32 else 128)
    b_hv = head_block(d_hv, 32 if (fp32 and b_l >= 128) else 64 if (fp32 or b_l >= 128) else 128)
    warps = 8 if b_l * b_hv >= 128 * 128 or b_l >= 128 else 4
    cfg = dict(B_LQ=b_l, B_LKV=b_l, B_DQK=b_qk, B_DHV=b_hv, num_warps=warps, num_stages=2,
               USE_TMA=(not limit) and dtype in (torch.bfloat16, torch.float16),
               INTER_IN_LOOP=False, GLUON=False)
    if not (is_exp or limit or fp32) and L >= 64:
        if d_qk <= 64:
            cfg.update(B_LQ=64, B_LKV=32, B_DHV=head_block(d_hv, 128), num_warps=4,
                       num_stages=2)
        elif d_qk <= 128 and d_hv >= 256 and L >= 128:
            # one query tile per chunk at L 128: the inter-chunk product runs in the loop
            cfg.update(B_LQ=128, B_LKV=64, B_DHV=256, num_warps=8, num_stages=2,
                       INTER_IN_LOOP=(L == 128))
        elif 128 < d_qk <= 256 and d_hv >= 256 and L == 128 and cdiv(d_qk, 64) * 64 < pow2(d_qk):
            # rule H9: d_qk blocks of 64 pad d_qk less than one block of its power of two
            # (192: three blocks, none padded, against 256 with a quarter zeros)
            cfg.update(B_LQ=64, B_LKV=64, B_DQK=64, B_DHV=128, num_warps=4, num_stages=3)
        elif 128 < d_qk <= 256 and d_hv >= 256 and L == 128:
            # one key tile per chunk: a longer chunk would pipeline two 128 x 256 K and V
            # tiles and need 450 KB of shared memory (measured failure at L 256-1024)
            cfg.update(B_LQ=128, B_LKV=128, B_DQK=256, B_DHV=256, num_warps=8, num_stages=2)
        elif 128 < d_qk <= 256 and d_hv > 256 and L == 256:
            # rule H7 (Figure 5's heads at L 256, what "auto" takes there): 64-row key tiles,
            # one stage (two do not fit shared memory)
            cfg.update(B_LQ=128, B_LKV=64, B_DQK=256, B_DHV=256, num_warps=8, num_stages=1,
                       GLUON=True)
    cfg.update(tuning.fw_limit if limit else tuning.fw)
    if limit:
        cfg["B_LQ"] = cfg["B_LKV"] = L
    cfg["B_LQ"] = min(cfg["B_LQ"], L)
    cfg["B_LKV"] = min(cfg["B_LKV"], cfg["B_LQ"])
    return cfg


def inter_slice(cfg: dict, d_qk: int) -> int:
    """B_CS, the d_qk rows of C_{k-1} that each key/value iteration multiplies when the
    inter-chunk product runs inside the loop (``INTER_IN_LOOP``), or 0 where it cannot: the
    B_LQ / B_LKV iterations of the first query tile must cover d_qk in one d_qk block, in
    slices of at least 16 rows (the smallest tl.dot depth)."""
    if not cfg.get("INTER_IN_LOOP") or cdiv(d_qk, cfg["B_DQK"]) != 1:
        return 0
    b_cs = cfg["B_DQK"] // (cfg["B_LQ"] // cfg["B_LKV"])
    return b_cs if b_cs >= 16 else 0


@functools.lru_cache(maxsize=256)
def skips_first_state(L: int, d_qk: int, d_hv: int, dtype: torch.dtype, limit: bool,
                      is_exp: bool, tuning: Tuning = DEFAULT) -> bool:
    """Whether :func:`parallel_fw` with ``zero_first`` reads no slot 0 of C_st / n_st, so
    that the state kernel need not store it (docs/kernels.md, rule S6): the Triton H kernel
    with the inter-chunk product before the key/value loop; not the Gluon kernel (rule H8)
    nor ``INTER_IN_LOOP`` (rule H5), which read C_0 for chunk 0 like any other chunk.
    Worked out once per arguments (every forward without gradients asks)."""
    cfg = fw_config(L, d_qk, d_hv, dtype, limit, is_exp, tuning)
    return not cfg["GLUON"] and inter_slice(cfg, d_qk) == 0


def parallel_fw(q, k, v, b_vec, i_vec, mi_vec, C_st, n_st, m_st, *, L: int, is_exp: bool,
                normalize: bool, eps: float, limit: bool, tuning: Tuning = DEFAULT,
                zero_first: bool = False):
    """h (BNH, S, d_hv) in the input dtype and n_out (BNH, N_c*L) fp32 (unset if not
    normalised): ``_parallel_fw_kernel``, or the Gluon kernel where rule H8 holds.
    ``tuning``: overrides of :func:`fw_config`'s rules. ``zero_first``: the initial state is
    zero (no C0 and n0), so chunk 0 skips its inter-chunk product where
    :func:`skips_first_state` holds (h bit for bit the same; slot 0 may then be unwritten)."""
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    cfg = fw_config(L, d_qk, d_hv, q.dtype, limit, is_exp, tuning)
    n_out = (torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32) if normalize
             else placeholder(q.device))
    if cfg["GLUON"]:
        from tfla.triton import chunkwise_parallel_fw_gluon as gfw

        if gfw.applies(cfg, q, k, v, C_st, L=L, is_exp=is_exp, normalize=normalize,
                       limit=limit):
            return gfw.parallel_fw_gluon(q, k, v, b_vec, i_vec, C_st, L=L), n_out
    h = torch.empty((BNH, S, d_hv), device=q.device, dtype=q.dtype)
    grid = (cdiv(d_hv, cfg["B_DHV"]) * (L // cfg["B_LQ"]) * NC * BNH,)
    b_lq, b_lkv, b_qk, b_hv = cfg["B_LQ"], cfg["B_LKV"], cfg["B_DQK"], cfg["B_DHV"]
    b_cs = inter_slice(cfg, d_qk)
    use_tma = bool(cfg["USE_TMA"]) and can_use_tma(
        q, k, v, C_st, h, blocks=(b_lq, b_lkv, b_qk, b_hv))
    C_view = C_st.view(-1, d_qk, d_hv)
    num_dqk = cdiv(d_qk, b_qk)
    QD, CD = descriptor(q, (1, b_lq, b_qk), use_tma), descriptor(C_view, (1, b_qk, b_hv), use_tma)
    # the d_qk-slice views of Q and C_{k-1} (INTER_IN_LOOP; else unused, the full ones passed)
    QSD = descriptor(q, (1, b_lq, b_cs), use_tma) if 0 < b_cs < b_qk else QD
    CSD = descriptor(C_view, (1, b_cs, b_hv), use_tma) if b_cs else CD
    launch(
        _parallel_fw_kernel, grid,
        q, k, v, QD, descriptor(k, (1, b_lkv, b_qk), use_tma),
        descriptor(v, (1, b_lkv, b_hv), use_tma), CD,
        descriptor(h, (1, b_lq, b_hv), use_tma), QSD, CSD,
        b_vec, i_vec, mi_vec, C_st, n_st, m_st, h, n_out,
        S, NC, d_qk, d_hv, d_qk ** -0.5, eps,
        L=L, B_LQ=cfg["B_LQ"], B_LKV=cfg["B_LKV"], B_DQK=cfg["B_DQK"], B_DHV=cfg["B_DHV"],
        NUM_DQK=num_dqk, IS_EXP=is_exp, NORMALIZE=normalize,
        DOT_PREC=dot_precision(q.dtype), USE_TMA=use_tma, INTER_IN_LOOP=b_cs > 0,
        B_CS=max(b_cs, 16), FIRST_ZERO=zero_first and b_cs == 0,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return h, n_out
