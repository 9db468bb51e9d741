"""Recurrent (inter-chunk) Triton kernels shared by mLSTMexp xl_chunk and both limit_chunk variants.

Forward (:func:`recurrent_fw`): the chunk states C_k, n_k, m_k for k = 0..N_c (paper eqs.
39-43, docs/tfla-kernels.md 2.4) and, per position, the chunk-local gate cumsum b and the
combined max state m^comb (= the recurrent m_t). Backward (:func:`recurrent_bw`): the state
gradients dC_k for k = 0..N_c (eqs. 63-64, docs 3.2).

Both parallelise over (d_qk / B_dqk, d_hv / B_dhv, B * NH) and loop over the chunks in
sub-steps of ``L_sub`` positions (the peer's L_inter idea: no L x d tile is ever needed in
SRAM, whatever the chunk size). Storage: states (B*NH, N_c + 1, d_qk, d_hv) fp32, slot k
holding the state after chunk k (slot 0 = initial state); vectors (B*NH, N_c * L) fp32.

mLSTMsig runs the same code with every max state fixed at 0 (docs 2.4, "drop every m").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _log1p_small(y):
    # log(1 + y) for 0 <= y <= 1, accurate also where 1 + y rounds to 1 (Goldberg's trick)
    u = 1.0 + y
    return tl.where(u == 1.0, y, tl.log(u) * (y / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def logsigmoid(x):
    """Stable log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)) (docs 2.1, Pitfall 6)."""
    return tl.minimum(x, 0.0) - _log1p_small(tl.exp(-tl.abs(x)))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _recurrent_fw_kernel(
    K, V, I, F, C0, N0, M0,
    C_st, N_st, M_st, B_vec, MC_vec,
    S, NC, d_qk, d_hv,
    L: tl.constexpr, L_SUB: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, HAS_C0: tl.constexpr, HAS_N0: tl.constexpr, HAS_M0: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # 1-D grid, (d_hv block) fastest, then d_qk block, then b*head
    pid = tl.program_id(0)
    n_v = tl.cdiv(d_hv, B_DHV)
    n_k = tl.cdiv(d_qk, B_DQK)
    pid_v = pid % n_v
    pid_k = (pid // n_v) % n_k
    bh = (pid // (n_v * n_k)).to(tl.int64)
    S_pad = NC * L
    offs_k = pid_k * B_DQK + tl.arange(0, B_DQK)
    offs_v = pid_v * B_DHV + tl.arange(0, B_DHV)
    mask_k = offs_k < d_qk
    mask_v = offs_v < d_hv
    mask_kv = mask_k[:, None] & mask_v[None, :]
    c_offs = offs_k[:, None] * d_hv + offs_v[None, :]
    st_base = bh * (NC + 1) * d_qk * d_hv
    n_base = bh * (NC + 1) * d_qk
    writer_n = pid_v == 0
    writer_g = (pid_k == 0) & (pid_v == 0)

    if HAS_C0:
        C = tl.load(C0 + bh * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        C = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    if HAS_N0:
        n = tl.load(N0 + bh * d_qk + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    else:
        n = tl.zeros((B_DQK,), dtype=tl.float32)
    m = 0.0
    if IS_EXP:
        if HAS_M0:
            m = tl.load(M0 + bh).to(tl.float32)
    tl.store(C_st + st_base + c_offs, C, mask=mask_kv)
    tl.store(N_st + n_base + offs_k, n, mask=mask_k & writer_n)
    if writer_g:
        tl.store(M_st + bh * (NC + 1), m)

    t_loc = tl.arange(0, L_SUB)
    for c in range(NC):
        b_run = 0.0
        for sub in range(L // L_SUB):
            t = c * L + sub * L_SUB + t_loc
            valid = t < S
            f_raw = tl.load(F + bh * S + t, mask=valid, other=0.0).to(tl.float32)
            i_raw = tl.load(I + bh * S + t, mask=valid, other=0.0).to(tl.float32)
            f_log = tl.where(valid, logsigmoid(f_raw), 0.0)
            if IS_EXP:
                i_log = tl.where(valid, i_raw, float("-inf"))
            else:
                i_log = tl.where(valid, logsigmoid(i_raw), float("-inf"))
            b_loc = tl.cumsum(f_log, 0)                                   # inclusive
            g = tl.sum(f_log, 0)
            a = tl.cumsum(f_log, 0, reverse=True) - f_log + i_log         # exclusive reverse
            if IS_EXP:
                m_new = tl.maximum(g + m, tl.max(a, 0))
                g_bar = tl.exp(g + m - m_new)
                a_bar = tl.exp(a - m_new)
            else:
                m_new = m
                g_bar = tl.exp(g)
                a_bar = tl.exp(a)
            if writer_g:
                tl.store(B_vec + bh * S_pad + t, b_run + b_loc)
                if IS_EXP:
                    # m_t = b_t + max(m_start, max_{s<=t}(i_s - b_s)): the recurrent max state
                    cm = tl.associative_scan(i_log - b_loc, 0, _max_combine)
                    tl.store(MC_vec + bh * S_pad + t, b_loc + tl.maximum(m, cm))
            k_t = tl.load(K + bh * S * d_qk + t[:, None] * d_qk + offs_k[None, :],
                          mask=valid[:, None] & mask_k[None, :], other=0.0)
            v_t = tl.load(V + bh * S * d_hv + t[:, None] * d_hv + offs_v[None, :],
                          mask=valid[:, None] & mask_v[None, :], other=0.0)
            k_bar = k_t.to(tl.float32) * a_bar[:, None]
            C = g_bar * C + tl.dot(tl.trans(k_bar.to(k_t.dtype)), v_t, input_precision=DOT_PREC)
            n = g_bar * n + tl.sum(k_bar, 0)
            m = m_new
            b_run += g
        tl.store(C_st + st_base + (c + 1) * d_qk * d_hv + c_offs, C, mask=mask_kv)
        tl.store(N_st + n_base + (c + 1) * d_qk + offs_k, n, mask=mask_k & writer_n)
        if writer_g:
            tl.store(M_st + bh * (NC + 1) + c + 1, m)


@triton.jit
def _recurrent_bw_kernel(
    Q, B_vec, MC_vec, M_st, NOUT, DH, DC_last, DC_st,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, L_SUB: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DC_LAST: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # 1-D grid, (d_hv block) fastest, then d_qk block, then b*head
    pid = tl.program_id(0)
    n_v = tl.cdiv(d_hv, B_DHV)
    n_k = tl.cdiv(d_qk, B_DQK)
    pid_v = pid % n_v
    pid_k = (pid // n_v) % n_k
    bh = (pid // (n_v * n_k)).to(tl.int64)
    S_pad = NC * L
    offs_k = pid_k * B_DQK + tl.arange(0, B_DQK)
    offs_v = pid_v * B_DHV + tl.arange(0, B_DHV)
    mask_k = offs_k < d_qk
    mask_v = offs_v < d_hv
    mask_kv = mask_k[:, None] & mask_v[None, :]
    c_offs = offs_k[:, None] * d_hv + offs_v[None, :]
    st_base = bh * (NC + 1) * d_qk * d_hv
    if HAS_DC_LAST:
        dC = tl.load(DC_last + bh * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        dC = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    tl.store(DC_st + st_base + NC * d_qk * d_hv + c_offs, dC, mask=mask_kv)
    t_loc = tl.arange(0, L_SUB)
    for cc in range(NC):
        c = NC - 1 - cc
        g = tl.load(B_vec + bh * S_pad + c * L + L - 1)
        if IS_EXP:
            m_prev = tl.load(M_st + bh * (NC + 1) + c)
            m_k = tl.load(M_st + bh * (NC + 1) + c + 1)
            g_bar = tl.exp(g + m_prev - m_k)
        else:
            g_bar = tl.exp(g)
        acc = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
        for sub in range(L // L_SUB):
            t = c * L + sub * L_SUB + t_loc
            valid = t < S
            b = tl.load(B_vec + bh * S_pad + t)
            if IS_EXP:
                mc = tl.load(MC_vec + bh * S_pad + t)
                row = tl.exp(b + m_prev - mc) * scale
            else:
                row = tl.exp(b) * scale
            if NORMALIZE:
                row = row / (tl.load(NOUT + bh * S_pad + t) + eps)
            q_t = tl.load(Q + bh * S * d_qk + t[:, None] * d_qk + offs_k[None, :],
                          mask=valid[:, None] & mask_k[None, :], other=0.0)
            dh_t = tl.load(DH + bh * S * d_hv + t[:, None] * d_hv + offs_v[None, :],
                           mask=valid[:, None] & mask_v[None, :], other=0.0)
            q_bar = (q_t.to(tl.float32) * row[:, None]).to(dh_t.dtype)
            acc += tl.dot(tl.trans(q_bar), dh_t, input_precision=DOT_PREC)
        dC = g_bar * dC + acc
        tl.store(DC_st + st_base + c * d_qk * d_hv + c_offs, dC, mask=mask_kv)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 ("ieee") for fp32 inputs, else the tensor-core default."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _p2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


# Tuning overrides for benchmarks (keys B_DQK, B_DHV, num_warps, num_stages, MIN_PROGRAMS).
STATE_OVERRIDE: dict = {}


def state_blocks(d_qk: int, d_hv: int, BNH: int = 1 << 30) -> tuple[int, int, int, int]:
    """(B_dqk, B_dhv, num_warps, num_stages) of the recurrent kernels.

    Head-dim tiles of at most 64; halved (d_qk first, not below 32) while the grid would
    have fewer than MIN_PROGRAMS (default 264, two per H100/H200 multiprocessor) programs:
    these kernels are sequential over the chunks, so parallelism comes from the tiles.
    """
    b_qk = max(16, min(64, _p2(d_qk)))
    b_hv = max(16, min(64, _p2(d_hv)))
    min_programs = STATE_OVERRIDE.get("MIN_PROGRAMS", 264)

    def programs(a, b):
        return triton.cdiv(d_qk, a) * triton.cdiv(d_hv, b) * BNH

    while programs(b_qk, b_hv) < min_programs and max(b_qk, b_hv) > 32:
        if b_qk >= b_hv and b_qk > 32:
            b_qk //= 2
        else:
            b_hv //= 2
    b_qk = STATE_OVERRIDE.get("B_DQK", b_qk)
    b_hv = STATE_OVERRIDE.get("B_DHV", b_hv)
    warps = STATE_OVERRIDE.get("num_warps", 4 if b_qk * b_hv >= 64 * 64 else 2)
    return b_qk, b_hv, warps, STATE_OVERRIDE.get("num_stages", 2)


def recurrent_fw(k, v, i, f, C0, n0, m0, *, L: int, L_sub: int, is_exp: bool):
    """Chunk states and per-position gate vectors.

    k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous, input dtype; i, f (BNH, S) any float dtype;
    C0 (BNH, d_qk, d_hv), n0 (BNH, d_qk), m0 (BNH,) or None. Returns C_st (BNH, N_c+1, d_qk,
    d_hv), n_st (BNH, N_c+1, d_qk), m_st (BNH, N_c+1), b (BNH, N_c*L), m_comb (BNH, N_c*L or
    dummy for mLSTMsig), all fp32.
    """
    BNH, S, d_qk = k.shape
    d_hv = v.shape[-1]
    NC = triton.cdiv(S, L)
    dev = k.device
    C_st = torch.empty((BNH, NC + 1, d_qk, d_hv), device=dev, dtype=torch.float32)
    n_st = torch.empty((BNH, NC + 1, d_qk), device=dev, dtype=torch.float32)
    m_st = torch.empty((BNH, NC + 1), device=dev, dtype=torch.float32)
    b_vec = torch.empty((BNH, NC * L), device=dev, dtype=torch.float32)
    mc_vec = torch.empty((BNH, NC * L) if is_exp else (1,), device=dev, dtype=torch.float32)
    b_qk, b_hv, warps, stages = state_blocks(d_qk, d_hv, BNH)
    grid = (triton.cdiv(d_qk, b_qk) * triton.cdiv(d_hv, b_hv) * BNH,)
    dummy = b_vec
    _recurrent_fw_kernel[grid](
        k, v, i, f,
        C0 if C0 is not None else dummy, n0 if n0 is not None else dummy,
        m0 if m0 is not None else dummy,
        C_st, n_st, m_st, b_vec, mc_vec,
        S, NC, d_qk, d_hv,
        L=L, L_SUB=L_sub, B_DQK=b_qk, B_DHV=b_hv, IS_EXP=is_exp,
        HAS_C0=C0 is not None, HAS_N0=n0 is not None, HAS_M0=m0 is not None,
        DOT_PREC=dot_precision(k.dtype), num_warps=warps, num_stages=stages,
    )
    return C_st, n_st, m_st, b_vec, mc_vec


def recurrent_bw(q, b_vec, mc_vec, m_st, n_out, dh, dC_last, *, L: int, L_sub: int,
                 is_exp: bool, normalize: bool, eps: float, d_hv: int):
    """State gradients dC_k (BNH, N_c+1, d_qk, d_hv) fp32, slot N_c = dC_last (or 0).

    q (BNH, S, d_qk), dh (BNH, S, d_hv) contiguous in the input dtype; vectors as returned by
    :func:`recurrent_fw` and the parallel forward (n_out (BNH, N_c*L) fp32).
    """
    BNH, S, d_qk = q.shape
    NC = triton.cdiv(S, L)
    dC_st = torch.empty((BNH, NC + 1, d_qk, d_hv), device=q.device, dtype=torch.float32)
    b_qk, b_hv, warps, stages = state_blocks(d_qk, d_hv, BNH)
    grid = (triton.cdiv(d_qk, b_qk) * triton.cdiv(d_hv, b_hv) * BNH,)
    _recurrent_bw_kernel[grid](
        q, b_vec, mc_vec, m_st, n_out, dh, dC_last if dC_last is not None else dC_st, dC_st,
        S, NC, d_qk, d_hv, d_qk ** -0.5, eps,
        L=L, L_SUB=L_sub, B_DQK=b_qk, B_DHV=b_hv, IS_EXP=is_exp, NORMALIZE=normalize,
        HAS_DC_LAST=dC_last is not None, DOT_PREC=dot_precision(q.dtype),
        num_warps=warps, num_stages=stages,
    )
    return dC_st
