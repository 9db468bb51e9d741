"""Gate and recurrent (inter-chunk) Triton kernels shared by mLSTMexp xl_chunk and limit_chunk.

* :func:`chunk_gates`: one program per (chunk, b, head), fully parallel. Per position the
  chunk-local gate vectors b (inclusive cumsum of f̄), a (exclusive reverse cumsum of f̄
  plus ī, computed directly, docs/tfla-verification.md pitfall 8), ī itself (-inf beyond S; the
  parallel kernels form D̃_rs = (b_r - b_s) + ī_s, never b_r + (ī_s - b_s), whose two large terms
  cancel: with f̃ near -20, b reaches -20 L and ī_s - b_s kept only ~1e-4 of the exponent) and, for
  mLSTMexp, the intra-chunk max m^intra = b + max_{s<=r}(ī_s - b_s) (a stabiliser: its
  rounding cancels between numerator and normaliser); per chunk g = Σ f̄ and max_r a_r
  (docs/tfla-kernels.md 2.4, paper eqs. 9-11, 36-38).
* :func:`recurrent_fw`: the chunk states C_k, n_k, m_k for k = 0..N_c (eqs. 39-43):
  m_k = max(g_k + m_{k-1}, max_r a_r), C_k = ḡ_k C_{k-1} + (ā ⊙ K)ᵀ V.
* :func:`recurrent_bw`: the state gradients dC_k for k = N_c..0 (eqs. 63-64, docs/tfla-kernels.md 3.2).
* :func:`gate_grads`: di and df from the parallel backward's row sums q·dq and k·dk (a
  reverse cumulative sum over S per b·head, docs/tfla-kernels.md 3.4).

The recurrent kernels parallelise over (d_qk / B_dqk, d_hv / B_dhv, B·NH) and loop over the
chunks; a chunk longer than ``PIECE`` positions is reduced in pieces (a dot-product loop:
the chunk formula needs no intermediate states), so no L x d tile is ever needed on chip.
With one piece per chunk the chunk loop is the innermost loop and Triton pipelines its
loads. The states that the parallel kernels read are stored in the dot dtype (they are
cast to it before every tl.dot anyway, docs/tfla-tiling.md 4.10); the last state C_S and dC_0 are also
written in fp32.

mLSTMsig runs the same code with every max state fixed at 0 (docs/tfla-kernels.md 2.4, "drop every m").
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfla.triton.common import (can_use_tma, cdiv, descriptor, dot_precision, head_block,
                                launch, load_tile, num_sms, placeholder, pow2,
                                read_only_zeros, split_pid, store_tile)
from tfla.triton.tuning import DEFAULT, Tuning

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _log1p_small(y):
    # log(1 + y) for 0 <= y <= 1, accurate also where 1 + y rounds to 1 (Goldberg's trick)
    u = 1.0 + y
    return tl.where(u == 1.0, y, tl.log(u) * (y / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def logsigmoid(x):
    """Stable log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)) (docs/tfla-kernels.md 2.1,
    docs/tfla-verification.md pitfall 6)."""
    return tl.minimum(x, 0.0) - _log1p_small(tl.exp(-tl.abs(x)))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _gates_kernel(
    I, F, B_vec, A_vec, I_vec, MI_vec, G_ch, AMAX_ch,
    S, NC, L: tl.constexpr, IS_EXP: tl.constexpr,
):
    pid = tl.program_id(0)
    c = pid % NC
    bh = (pid // NC).to(tl.int64)
    S_pad = NC * L
    t = c * L + tl.arange(0, L)
    valid = t < S
    f_raw = tl.load(F + bh * S + t, mask=valid, other=0.0).to(tl.float32)
    i_raw = tl.load(I + bh * S + t, mask=valid, other=0.0).to(tl.float32)
    f_log = tl.where(valid, logsigmoid(f_raw), 0.0)
    if IS_EXP:
        i_log = tl.where(valid, i_raw, float("-inf"))
    else:
        i_log = tl.where(valid, logsigmoid(i_raw), float("-inf"))
    b = tl.cumsum(f_log, 0)                                    # inclusive
    a = tl.cumsum(f_log, 0, reverse=True) - f_log + i_log      # exclusive reverse, + ī
    tl.store(B_vec + bh * S_pad + t, b)
    tl.store(A_vec + bh * S_pad + t, a)
    tl.store(I_vec + bh * S_pad + t, i_log)   # ī itself: D̃ is formed as (b_r - b_s) + ī_s
    tl.store(G_ch + bh * NC + c, tl.sum(f_log, 0))
    if IS_EXP:
        # ī_s - b_s from the loaded ĩ, not from i_log: with i_log feeding both the store
        # above and this scan, triton 3.6's TritonGPURemoveLayoutConversions rewrote the
        # select into the scan's layout after its first use ("operand #0 does not dominate
        # this use", "PassManager::run failed") wherever 16-bit gates were loaded as
        # 8-value vectors per thread (L 256 at 1 warp, L 512 at 1-2, L 1024 at 1-4)
        u = tl.where(valid, i_raw - b, float("-inf"))
        tl.store(MI_vec + bh * S_pad + t, b + tl.associative_scan(u, 0, _max_combine))
        tl.store(AMAX_ch + bh * NC + c, tl.max(a, 0))


@triton.jit
def _state_tile(pid, d_qk, d_hv, B_DQK: tl.constexpr, B_DHV: tl.constexpr):
    """The C block of a state kernel's program (1-D grid: d_hv block fastest, then d_qk
    block, then b·head): pid_v, pid_k, b·head (int64), the first row k0 and column v0, the
    row offsets and their mask, the block's mask and element offsets in a (d_qk, d_hv) state."""
    pid_v, pid_k, bh = split_pid(pid, tl.cdiv(d_hv, B_DHV), tl.cdiv(d_qk, B_DQK))
    bh = bh.to(tl.int64)
    k0 = pid_k * B_DQK
    v0 = pid_v * B_DHV
    offs_k = k0 + tl.arange(0, B_DQK)
    offs_v = v0 + tl.arange(0, B_DHV)
    mask_k = offs_k < d_qk
    mask_v = offs_v < d_hv
    mask_kv = mask_k[:, None] & mask_v[None, :]
    c_offs = offs_k[:, None] * d_hv + offs_v[None, :]
    return pid_v, pid_k, bh, k0, v0, offs_k, mask_k, mask_kv, c_offs


@triton.jit
def _kv_piece(acc, n_acc, KD, VD, K, V, A_vec, bh, t0, S, S_pad, m_new, k0, v0, d_qk, d_hv,
              PIECE: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
              WITH_N: tl.constexpr, USE_TMA: tl.constexpr, SCALE_V: tl.constexpr,
              DOT_PREC: tl.constexpr):
    """acc + (ā ⊙ K)ᵀ V and n_acc + colsum(ā ⊙ K) over positions t0..t0+PIECE (zeros past S).

    SCALE_V: the gate column scales V instead, Kᵀ (ā ⊙ V): K then feeds the dot unchanged
    (its transpose is a view of the loaded tile, no register relayout); the same product up
    to the rounding of the scaled operand to the dot dtype."""
    t = t0 + tl.arange(0, PIECE)
    a_bar = tl.exp(tl.load(A_vec + bh * S_pad + t) - m_new)      # 0 past S (a = -inf there)
    k_t = load_tile(KD, K, bh, t0, k0, S, d_qk, PIECE, B_DQK, USE_TMA)
    v_t = load_tile(VD, V, bh, t0, v0, S, d_hv, PIECE, B_DHV, USE_TMA)
    if SCALE_V:
        v_bar = (v_t.to(tl.float32) * a_bar[:, None]).to(v_t.dtype)
        acc = tl.dot(tl.trans(k_t), v_bar, acc, input_precision=DOT_PREC)
        if WITH_N:
            n_acc += tl.sum(k_t.to(tl.float32) * a_bar[:, None], 0)
    else:
        k_bar = k_t.to(tl.float32) * a_bar[:, None]
        acc = tl.dot(tl.trans(k_bar.to(k_t.dtype)), v_t, acc, input_precision=DOT_PREC)
        if WITH_N:
            n_acc += tl.sum(k_bar, 0)
    return acc, n_acc


@triton.jit
def _fw_state_step(C, n, m, c, KD, VD, K, V, A_vec, G_ch, AMAX_ch, N_st, M_st, bh, n_base,
                   offs_k, mask_k, writer_n, writer_m, S, NC, k0, v0, d_qk, d_hv,
                   L: tl.constexpr, PIECE: tl.constexpr, B_DQK: tl.constexpr,
                   B_DHV: tl.constexpr, IS_EXP: tl.constexpr, WITH_N: tl.constexpr,
                   ACC_IN_C: tl.constexpr, USE_TMA: tl.constexpr, SCALE_V: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """One chunk of the forward state walk (eqs. 39-43): C_c+1, n_c+1, m_c+1 from C_c, n_c,
    m_c, with n and m stored in slot c + 1 (C is stored by the caller)."""
    S_pad = NC * L
    g = tl.load(G_ch + bh * NC + c)
    if IS_EXP:
        m_new = tl.maximum(g + m, tl.load(AMAX_ch + bh * NC + c))
    else:
        m_new = m
    g_bar = tl.exp(g + m - m_new)
    if ACC_IN_C:
        acc = C * g_bar
    else:
        acc = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    n_acc = tl.zeros((B_DQK,), dtype=tl.float32)
    if L == PIECE:
        acc, n_acc = _kv_piece(acc, n_acc, KD, VD, K, V, A_vec, bh, c * L, S, S_pad, m_new,
                               k0, v0, d_qk, d_hv, PIECE, B_DQK, B_DHV, WITH_N, USE_TMA,
                               SCALE_V, DOT_PREC)
    else:
        for p in range(L // PIECE):
            acc, n_acc = _kv_piece(acc, n_acc, KD, VD, K, V, A_vec, bh, c * L + p * PIECE, S,
                                   S_pad, m_new, k0, v0, d_qk, d_hv, PIECE, B_DQK, B_DHV,
                                   WITH_N, USE_TMA, SCALE_V, DOT_PREC)
    if ACC_IN_C:
        C = acc
    else:
        C = g_bar * C + acc
    if WITH_N:
        n = g_bar * n + n_acc
        tl.store(N_st + n_base + (c + 1) * d_qk + offs_k, n, mask=mask_k & writer_n)
    tl.store(M_st + bh * (NC + 1) + c + 1 + tl.zeros((1,), dtype=tl.int32), m_new,
             mask=writer_m)
    return C, n, m_new


@triton.jit
def _recurrent_fw_kernel(
    K, V, KD, VD, CD, A_vec, G_ch, AMAX_ch, C0, N0, M0,
    C_st, N_st, M_st, C_last,
    S, NC, d_qk, d_hv,
    L: tl.constexpr, PIECE: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, HAS_C0: tl.constexpr, HAS_N0: tl.constexpr, HAS_M0: tl.constexpr,
    DOT_PREC: tl.constexpr, WITH_N: tl.constexpr, ACC_IN_C: tl.constexpr,
    USE_TMA: tl.constexpr, SCALE_V: tl.constexpr, STORE_FIRST: tl.constexpr,
    STORE_LAST: tl.constexpr, WITH_C_LAST: tl.constexpr,
):
    # 1-D grid, (d_hv block) fastest, then d_qk block, then b*head. STORE_FIRST / STORE_LAST
    # / WITH_C_LAST False: C_0 / C_{N_c} / the fp32 C_last are not stored, where nothing
    # reads them (recurrent_fw's ``store_first``, ``store_last``, ``with_last``); n and m
    # are stored in every slot.
    # WITH_N: carry and store
    # the normaliser state n (skipped when nothing reads it: its column sum is a cross-thread
    # reduction on every step of the serial chain). ACC_IN_C: the step's tl.dot accumulates
    # into ḡ·C itself instead of a fresh tile added afterwards (one 128 x 128 fp32 tile of
    # registers less per thread). USE_TMA: K, V tiles and the C_k stores go through tensor
    # descriptors KD, VD (BNH, S, d) and CD (BNH·(N_c+1), d_qk, d_hv); else pointers.
    pid_v, pid_k, bh, k0, v0, offs_k, mask_k, mask_kv, c_offs = _state_tile(
        tl.program_id(0), d_qk, d_hv, B_DQK, B_DHV)
    n_base = bh * (NC + 1) * d_qk
    st_row = bh * (NC + 1)          # C_k is "row" st_row + k of the (BNH·(N_c+1), d_qk, d_hv) view
    # which programs store n and m, as block masks (triton 3.9's interpreter rejects a
    # scalar bool combined with a block mask)
    writer_n = (offs_k * 0 + pid_v) == 0
    writer_m = (tl.zeros((1,), dtype=tl.int32) + pid_k + pid_v) == 0

    if HAS_C0:
        C = tl.load(C0 + bh * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        C = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    if HAS_N0:
        n = tl.load(N0 + bh * d_qk + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    else:
        n = tl.zeros((B_DQK,), dtype=tl.float32)
    m = tl.zeros((1,), dtype=tl.float32)
    if IS_EXP:
        if HAS_M0:
            m = tl.load(M0 + bh + tl.zeros((1,), dtype=tl.int32)).to(tl.float32)
    if STORE_FIRST:
        store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row, k0, v0, d_qk, d_hv, B_DQK,
                   B_DHV, USE_TMA)
    if WITH_N:
        tl.store(N_st + n_base + offs_k, n, mask=mask_k & writer_n)
    tl.store(M_st + bh * (NC + 1) + tl.zeros((1,), dtype=tl.int32), m, mask=writer_m)

    # without STORE_LAST the last chunk's step runs after the loop, which then stores every
    # state it makes (a store under a condition inside the loop made the whole forward 15-17 %
    # slower at S 65536, where it runs 512 steps)
    if STORE_LAST:
        n_stored = NC
    else:
        n_stored = NC - 1
    for c in range(n_stored):
        C, n, m = _fw_state_step(C, n, m, c, KD, VD, K, V, A_vec, G_ch, AMAX_ch, N_st, M_st, bh,
                                 n_base, offs_k, mask_k, writer_n, writer_m, S, NC, k0, v0, d_qk,
                                 d_hv, L, PIECE, B_DQK, B_DHV, IS_EXP, WITH_N, ACC_IN_C, USE_TMA,
                                 SCALE_V, DOT_PREC)
        store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row + c + 1, k0, v0, d_qk, d_hv,
                   B_DQK, B_DHV, USE_TMA)
    if not STORE_LAST:
        C, n, m = _fw_state_step(C, n, m, NC - 1, KD, VD, K, V, A_vec, G_ch, AMAX_ch, N_st, M_st,
                                 bh, n_base, offs_k, mask_k, writer_n, writer_m, S, NC, k0, v0,
                                 d_qk, d_hv, L, PIECE, B_DQK, B_DHV, IS_EXP, WITH_N, ACC_IN_C,
                                 USE_TMA, SCALE_V, DOT_PREC)
    if WITH_C_LAST:
        tl.store(C_last + bh * d_qk * d_hv + c_offs, C, mask=mask_kv)


@triton.jit
def _dc_piece(acc, QD, DHD, Q, DH, B_vec, MI_vec, NOUT, bh, t0, S, S_pad, m_prev, k0, v0,
              d_qk, d_hv, scale, eps,
              PIECE: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
              IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
              USE_TMA: tl.constexpr, SCALE_DH: tl.constexpr):
    """acc + Q̄ᵀ dH̃ over positions t0..t0+PIECE (Q̄ = b̄ ⊙ Q·scale, dH̃ = dH/(n_out+eps)).

    SCALE_DH: the row scale multiplies dH instead, Qᵀ (row ⊙ dH), so that Q feeds the dot
    unchanged (its transpose a view of the loaded tile); the same product up to the rounding
    of the scaled operand."""
    t = t0 + tl.arange(0, PIECE)
    b = tl.load(B_vec + bh * S_pad + t)
    if IS_EXP:
        mc = tl.maximum(b + m_prev, tl.load(MI_vec + bh * S_pad + t))
        row = tl.exp(b + m_prev - mc) * scale
    else:
        row = tl.exp(b) * scale
    if NORMALIZE:
        row = row / (tl.load(NOUT + bh * S_pad + t) + eps)
    q_t = load_tile(QD, Q, bh, t0, k0, S, d_qk, PIECE, B_DQK, USE_TMA)
    dh_t = load_tile(DHD, DH, bh, t0, v0, S, d_hv, PIECE, B_DHV, USE_TMA)
    if SCALE_DH:
        dh_bar = (dh_t.to(tl.float32) * row[:, None]).to(dh_t.dtype)
        return tl.dot(tl.trans(q_t), dh_bar, acc, input_precision=DOT_PREC)
    q_bar = (q_t.to(tl.float32) * row[:, None]).to(dh_t.dtype)
    return tl.dot(tl.trans(q_bar), dh_t, acc, input_precision=DOT_PREC)


@triton.jit
def _recurrent_bw_kernel(
    Q, DH, QD, DHD, DCD, B_vec, MI_vec, M_st, NOUT, DC_last, DC_st, DC_0,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, PIECE: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DC_LAST: tl.constexpr,
    WITH_DC0: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
    SCALE_DH: tl.constexpr,
):
    # USE_TMA: Q, dH tiles and the dC_k stores go through tensor descriptors QD, DHD
    # (BNH, S, d) and DCD (BNH·(N_c+1), d_qk, d_hv); else pointers. WITH_DC0 False: the
    # walk stops at dC_1 (no kernel reads slot 0), skipping chunk 0's Q and dH.
    S_pad = NC * L
    _, _, bh, k0, v0, _, _, mask_kv, c_offs = _state_tile(tl.program_id(0), d_qk, d_hv, B_DQK,
                                                          B_DHV)
    st_row = bh * (NC + 1)          # dC_k is "row" st_row + k of the (BNH·(N_c+1), d_qk, d_hv) view
    if HAS_DC_LAST:
        dC = tl.load(DC_last + bh * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        dC = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    store_tile(DCD, DC_st, dC.to(DC_st.dtype.element_ty), st_row + NC, k0, v0, d_qk, d_hv,
               B_DQK, B_DHV, USE_TMA)
    if WITH_DC0:
        n_steps = NC
    else:
        n_steps = NC - 1
    for cc in range(n_steps):
        c = NC - 1 - cc
        g = tl.load(B_vec + bh * S_pad + c * L + L - 1)
        if IS_EXP:
            m_prev = tl.load(M_st + bh * (NC + 1) + c)
            m_k = tl.load(M_st + bh * (NC + 1) + c + 1)
        else:
            m_prev = 0.0
            m_k = 0.0
        g_bar = tl.exp(g + m_prev - m_k)
        acc = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
        if L == PIECE:
            acc = _dc_piece(acc, QD, DHD, Q, DH, B_vec, MI_vec, NOUT, bh, c * L, S, S_pad, m_prev,
                            k0, v0, d_qk, d_hv, scale, eps, PIECE, B_DQK, B_DHV, IS_EXP,
                            NORMALIZE, DOT_PREC, USE_TMA, SCALE_DH)
        else:
            for p in range(L // PIECE):
                acc = _dc_piece(acc, QD, DHD, Q, DH, B_vec, MI_vec, NOUT, bh, c * L + p * PIECE,
                                S, S_pad, m_prev, k0, v0, d_qk, d_hv, scale, eps, PIECE, B_DQK,
                                B_DHV, IS_EXP, NORMALIZE, DOT_PREC, USE_TMA, SCALE_DH)
        dC = g_bar * dC + acc
        store_tile(DCD, DC_st, dC.to(DC_st.dtype.element_ty), st_row + c, k0, v0, d_qk, d_hv,
                   B_DQK, B_DHV, USE_TMA)
    if WITH_DC0:
        tl.store(DC_0 + bh * d_qk * d_hv + c_offs, dC, mask=mask_kv)


@functools.lru_cache(maxsize=256)
def state_blocks(d_qk: int, d_hv: int, BNH: int = 1 << 30, n_sms: int = 0,
                 dtype: torch.dtype = torch.bfloat16, step: int = 128,
                 sig_forward: bool = False, tuning: Tuning = DEFAULT) -> tuple[int, int, int, int]:
    """(B_dqk, B_dhv, num_warps, num_stages) of the recurrent kernels.

    These kernels are sequential over the chunks, and each step is short, so a step's
    latency, not bandwidth, sets their time: state blocks as large as the grid allows.
    Blocks of up to 128 x 128 (64 x 64 for fp32 inputs, whose pipelined tiles would not
    fit in shared memory) are halved while the grid would have fewer than MIN_PROGRAMS
    programs, by default half the SMs (``n_sms``; 0, as in the interpreter, means no bound),
    not below 32. Steps (``step``, positions reduced per tl.dot) of 128 halve the larger
    side first (d_qk on a tie); shorter steps halve both sides (square blocks). 8 warps for
    128 x 64 and larger, 4 for 64 x 64, else 2; 3 pipeline stages.

    Measured on the H200 at the Figure-4 sizes, forward (docs/kernels.md, rule S1; its
    numbers in docs/kernel-measurements.md).

    ``sig_forward`` (mLSTMsig's forward state kernel, 16-bit dtypes, d_qk <= 64, steps of
    128): 64 x 128 blocks, 4 warps, 3 stages, the best of those measured with TMA tiles at
    the small heads. Other sig shapes keep these defaults: at d_qk 128 / 256 they were
    within 1 % of the best measured (docs/kernels.md, rule S4).

    ``tuning.state``'s keys win (a block, warps or stages override also turns S4 off).
    """
    over = tuning.state
    if (sig_forward and d_qk <= 64 and step >= 128 and dtype != torch.float32
            and d_hv >= 128
            and not any(k in over for k in ("B_DQK", "B_DHV", "num_warps", "num_stages"))):
        return head_block(d_qk, 64), 128, 4, 3
    cap = 64 if dtype == torch.float32 else 128
    b_qk = head_block(d_qk, cap)
    b_hv = head_block(d_hv, cap)
    min_programs = over.get("MIN_PROGRAMS", n_sms // 2)

    def programs(a, b):
        return cdiv(d_qk, a) * cdiv(d_hv, b) * BNH

    while programs(b_qk, b_hv) < min_programs and max(b_qk, b_hv) > 32:
        if step < 128:
            b_qk = b_qk // 2 if b_qk > 32 else b_qk
            b_hv = b_hv // 2 if b_hv > 32 else b_hv
        elif b_qk >= b_hv:
            b_qk //= 2
        else:
            b_hv //= 2
    b_qk = over.get("B_DQK", b_qk)
    b_hv = over.get("B_DHV", b_hv)
    size = b_qk * b_hv
    default_warps = 8 if size >= 128 * 64 else 4 if size >= 64 * 64 else 2
    warps = over.get("num_warps", default_warps)
    return b_qk, b_hv, warps, over.get("num_stages", 3)


def fw_state_options(k, v, C_st, b_qk: int, b_hv: int, P: int,
                     tuning: Tuning = DEFAULT) -> tuple[bool, bool]:
    """(USE_TMA, SCALE_V) of the forward state kernel, both variants.

    Default: both on for 16-bit inputs (TMA only where the tensors allow it), off for fp32
    (not measured there); ``tuning.state``'s keys win. Measured on the H200, bf16, forward ms,
    state kernel with both vs pointer loads of ā-scaled K (docs/kernels.md,
    rule S3): mLSTMsig Figure-4 heads L 128 1.22 vs 1.41 (the whole forward; 1.08 with the
    H kernel's TMA too), 7B heads 1.88 vs 2.33; mLSTMexp 1.53 vs 1.61, 2.77 vs 2.91.
    """
    half = k.dtype in (torch.bfloat16, torch.float16)
    over = tuning.state
    use_tma = over.get("USE_TMA", half) and can_use_tma(
        k, v, C_st, blocks=(P, b_qk, b_hv))
    return bool(use_tma), bool(over.get("SCALE_V", half))


def piece(L: int, tuning: Tuning = DEFAULT) -> int:
    """Positions per tl.dot in the recurrent kernels: the whole chunk up to 128
    (``tuning.state["PIECE"]`` wins)."""
    return min(L, tuning.state.get("PIECE", 128))


def gates_num_warps(L: int) -> int:
    """Warps of the chunk-gates kernel: one per 128 positions (1 to 8), so that each thread
    holds at most 4 gate values of the chunk. The kernel compiles at any warps count for
    every gate dtype (tests/test_kernels_compile.py)."""
    return max(1, min(8, L // 128))


def chunk_gates(i, f, *, L: int, is_exp: bool):
    """Gate vectors of every chunk: b, a, ī (BNH, N_c*L), m^intra (exp; else a dummy),
    g and max a per chunk (BNH, N_c), all fp32. i, f (BNH, S) contiguous, any float dtype."""
    BNH, S = f.shape
    NC = cdiv(S, L)
    dev = f.device
    vec = lambda: torch.empty((BNH, NC * L), device=dev, dtype=torch.float32)  # noqa: E731
    b_vec, a_vec, i_vec = vec(), vec(), vec()
    mi_vec = vec() if is_exp else b_vec
    g_ch = torch.empty((BNH, NC), device=dev, dtype=torch.float32)
    amax_ch = torch.empty((BNH, NC), device=dev, dtype=torch.float32) if is_exp else g_ch
    launch(_gates_kernel, (NC * BNH,), i, f, b_vec, a_vec, i_vec, mi_vec, g_ch, amax_ch, S, NC,
           L=L, IS_EXP=is_exp, num_warps=gates_num_warps(L))
    return b_vec, a_vec, i_vec, mi_vec, g_ch, amax_ch


@triton.jit
def _gate_grads_kernel(QDQ, KDK, I, F, T, DI, DF, S, S_pad, BLOCK: tl.constexpr,
                       IS_EXP: tl.constexpr):
    # one program per (block of BLOCK positions, b·head): df̄ = the reverse cumulative sum of
    # q·dq - k·dk within the block plus the sum over every later position (read again by each
    # block: a few MB from L2, where a carry passed between blocks would make the blocks of a
    # long sequence sequential), then the sigmoid factors (docs/tfla-kernels.md 3.4)
    n_blocks = tl.cdiv(S, BLOCK)
    pid = tl.program_id(0)
    j = pid % n_blocks
    bh = (pid // n_blocks).to(tl.int64)
    carry = tl.load(T + bh)
    for s0 in range((j + 1) * BLOCK, S, BLOCK):
        offs = s0 + tl.arange(0, BLOCK)
        m = offs < S
        carry += tl.sum(tl.load(QDQ + bh * S_pad + offs, mask=m, other=0.0)
                        - tl.load(KDK + bh * S_pad + offs, mask=m, other=0.0), 0)
    offs = j * BLOCK + tl.arange(0, BLOCK)
    m = offs < S
    qdq = tl.load(QDQ + bh * S_pad + offs, mask=m, other=0.0)
    kdk = tl.load(KDK + bh * S_pad + offs, mask=m, other=0.0)
    df_log = tl.cumsum(qdq - kdk, 0, reverse=True) + carry
    f = tl.load(F + bh * S + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(DF + bh * S + offs, (df_log * tl.sigmoid(-f)).to(DF.dtype.element_ty), mask=m)
    if IS_EXP:
        di = kdk
    else:
        di = kdk * tl.sigmoid(-tl.load(I + bh * S + offs, mask=m, other=0.0).to(tl.float32))
    tl.store(DI + bh * S + offs, di.to(DI.dtype.element_ty), mask=m)


def gate_grads(qdq, kdk, i, f, T=None, *, is_exp: bool):
    """The gate gradients (docs/tfla-kernels.md 3.4, paper eqs. 65-66) from the fp32 row sums
    of the parallel backward: df̄_t = Σ_{u≥t} (q·dq − k·dk)_u + T, df = df̄ · σ(−f̃), and
    dī = k·dk, di = dī (mLSTMexp) or dī · σ(−ĩ) (mLSTMsig), in one kernel.

    qdq, kdk: (BNH, S_pad ≥ S) fp32, contiguous; i, f: (BNH, S) pre-activations, contiguous,
    any float dtype; T: (BNH,) fp32 (⟨dC_S, C_S⟩ where the last state has a gradient) or None.
    Returns di, df (BNH, S) in i's and f's dtypes."""
    BNH, S = f.shape
    # Triton's CPU interpreter rounds to bfloat16 by truncation (the GPU to nearest even):
    # there the kernel writes float32 and torch rounds
    out = lambda dt: torch.float32 if INTERPRET and dt == torch.bfloat16 else dt  # noqa: E731
    di = torch.empty((BNH, S), device=f.device, dtype=out(i.dtype))
    df = torch.empty((BNH, S), device=f.device, dtype=out(f.dtype))
    if T is None:          # read only: the kept zeros, no fill launched per call
        T = read_only_zeros(f.device, BNH)
    block = min(4096, max(16, pow2(S)))
    launch(
        _gate_grads_kernel, (BNH * cdiv(S, block),), qdq, kdk, i, f, T, di, df, S, qdq.shape[1],
        BLOCK=block, IS_EXP=is_exp, num_warps=4 if block <= 1024 else 8)
    # no cast where the kernel wrote the dtype already (a no-op .to is still an operation)
    return (di if di.dtype == i.dtype else di.to(i.dtype),
            df if df.dtype == f.dtype else df.to(f.dtype))


def recurrent_fw(k, v, a_vec, g_ch, amax_ch, C0, n0, m0, *, L: int, is_exp: bool,
                 with_n: bool = True, tuning: Tuning = DEFAULT, store_first: bool = True,
                 store_last: bool = True, with_last: bool = True):
    """Chunk states from the chunk gates.

    k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous, input dtype; C0 (BNH, d_qk, d_hv),
    n0 (BNH, d_qk), m0 (BNH,) or None. Returns C_st (BNH, N_c+1, d_qk, d_hv) in the input
    dtype (the copies the parallel kernels read), n_st (BNH, N_c+1, d_qk) and m_st
    (BNH, N_c+1) fp32, and C_last (BNH, d_qk, d_hv) fp32. ``with_n`` False: n is neither
    carried nor stored (n_st is a placeholder; for callers that read no normaliser state:
    mLSTMsig without normalisation and without the last state). ``tuning``: overrides of
    the rules (``tuning.state``).

    ``store_first`` / ``store_last`` False (a forward that nothing differentiates: no kernel
    reads those states; docs/kernels.md, rule S6): C_st's slot 0 / slot N_c stays unwritten;
    ``with_last`` False: C_last is not written (None is returned for it). Each state
    is as large as d_qk·d_hv elements, at head dimensions near the chunk size as large as a
    chunk of V: the two slots and the fp32 C_last are up to half the kernel's stores.
    """
    BNH, S, d_qk = k.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    dev = k.device
    C_st = torch.empty((BNH, NC + 1, d_qk, d_hv), device=dev, dtype=k.dtype)
    # n is neither carried nor stored without with_n: a placeholder then
    n_st = (torch.empty((BNH, NC + 1, d_qk), device=dev, dtype=torch.float32) if with_n
            else placeholder(dev))
    m_st = torch.empty((BNH, NC + 1), device=dev, dtype=torch.float32)
    dummy = m_st
    C_last = (torch.empty((BNH, d_qk, d_hv), device=dev, dtype=torch.float32) if with_last
              else dummy)
    P = piece(L, tuning)
    b_qk, b_hv, warps, stages = state_blocks(d_qk, d_hv, BNH, num_sms(k.device), k.dtype, P,
                                             sig_forward=not is_exp, tuning=tuning)
    grid = (cdiv(d_qk, b_qk) * cdiv(d_hv, b_hv) * BNH,)
    use_tma, scale_v = fw_state_options(k, v, C_st, b_qk, b_hv, P, tuning)
    C_view = C_st.view(BNH * (NC + 1), d_qk, d_hv)
    acc_in_c = tuning.state.get("ACC_IN_C", False)
    launch(
        _recurrent_fw_kernel, grid,
        k, v, descriptor(k, (1, P, b_qk), use_tma), descriptor(v, (1, P, b_hv), use_tma),
        descriptor(C_view, (1, b_qk, b_hv), use_tma), a_vec, g_ch, amax_ch,
        C0 if C0 is not None else dummy, n0 if n0 is not None else dummy,
        m0 if m0 is not None else dummy,
        C_st, n_st, m_st, C_last,
        S, NC, d_qk, d_hv,
        L=L, PIECE=P, B_DQK=b_qk, B_DHV=b_hv, IS_EXP=is_exp,
        HAS_C0=C0 is not None, HAS_N0=n0 is not None, HAS_M0=m0 is not None,
        DOT_PREC=dot_precision(k.dtype), WITH_N=with_n,
        ACC_IN_C=acc_in_c, USE_TMA=use_tma, SCALE_V=scale_v, STORE_FIRST=store_first,
        STORE_LAST=store_last, WITH_C_LAST=with_last, num_warps=warps, num_stages=stages,
    )
    return C_st, n_st, m_st, C_last if with_last else None


def bw_state_options(q, dh, dC_st, b_qk: int, b_hv: int, P: int,
                     tuning: Tuning = DEFAULT) -> tuple[bool, bool]:
    """(USE_TMA, SCALE_DH) of the backward state kernel: both on for 16-bit inputs (TMA only
    where the tensors allow it), off for fp32 (not measured there); ``tuning.state_bw``'s
    keys win. Measured on the H200 (docs/kernels.md, Tuning rules B3)."""
    half = q.dtype in (torch.bfloat16, torch.float16)
    over = tuning.state_bw
    use_tma = over.get("USE_TMA", half) and can_use_tma(q, dh, dC_st, blocks=(P, b_qk, b_hv))
    return bool(use_tma), bool(over.get("SCALE_DH", half))


def recurrent_bw(q, b_vec, mi_vec, m_st, n_out, dh, dC_last, *, L: int, is_exp: bool,
                 normalize: bool, eps: float, d_hv: int, with_dc0: bool = True,
                 tuning: Tuning = DEFAULT):
    """State gradients: dC_st (BNH, N_c+1, d_qk, d_hv) in the input dtype (slot N_c =
    dC_last or 0) and dC_0 (BNH, d_qk, d_hv) fp32, or None with ``with_dc0`` False: then
    slot 0 of dC_st is left unset (the parallel backward reads slots 1 to N_c) and chunk 0's
    q and dh are not read, one chunk in N_c less work.

    q (BNH, S, d_qk), dh (BNH, S, d_hv) contiguous in the input dtype; gate vectors as
    returned by :func:`chunk_gates`; n_out (BNH, N_c*L) fp32 from the forward. ``tuning``:
    overrides of the rules (``tuning.state``, then ``tuning.state_bw``).
    """
    BNH, S, d_qk = q.shape
    NC = cdiv(S, L)
    dC_st = torch.empty((BNH, NC + 1, d_qk, d_hv), device=q.device, dtype=q.dtype)
    dC_0 = (torch.empty((BNH, d_qk, d_hv), device=q.device, dtype=torch.float32) if with_dc0
            else placeholder(q.device))
    P = piece(L, tuning)
    b_qk, b_hv, warps, stages = state_blocks(d_qk, d_hv, BNH, num_sms(q.device), q.dtype, P,
                                             tuning=tuning)
    over = tuning.state_bw
    b_qk = over.get("B_DQK", b_qk)
    b_hv = over.get("B_DHV", b_hv)
    warps = over.get("num_warps", warps)
    stages = over.get("num_stages", stages)
    grid = (cdiv(d_qk, b_qk) * cdiv(d_hv, b_hv) * BNH,)
    use_tma, scale_dh = bw_state_options(q, dh, dC_st, b_qk, b_hv, P, tuning)
    dC_view = dC_st.view(BNH * (NC + 1), d_qk, d_hv)
    launch(
        _recurrent_bw_kernel, grid,
        q, dh, descriptor(q, (1, P, b_qk), use_tma), descriptor(dh, (1, P, b_hv), use_tma),
        descriptor(dC_view, (1, b_qk, b_hv), use_tma),
        b_vec, mi_vec, m_st, n_out, dC_last if dC_last is not None else dC_0, dC_st, dC_0,
        S, NC, d_qk, d_hv, d_qk ** -0.5, eps,
        L=L, PIECE=P, B_DQK=b_qk, B_DHV=b_hv, IS_EXP=is_exp, NORMALIZE=normalize,
        HAS_DC_LAST=dC_last is not None, WITH_DC0=with_dc0, DOT_PREC=dot_precision(q.dtype),
        USE_TMA=use_tma, SCALE_DH=scale_dh, num_warps=warps, num_stages=stages,
    )
    return dC_st, (dC_0 if with_dc0 else None)
