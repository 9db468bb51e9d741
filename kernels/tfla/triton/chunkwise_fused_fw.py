"""One-kernel mLSTMsig forward: chunk states passed between programs through L2.

The two-kernel forward (chunkwise_recurrent + chunkwise_parallel_fw, paper Table 1) moves
every chunk state through device memory twice (C_k written by the state kernel, read by the
H kernel) and reads K and V twice. Here one program per (chunk k, b·head, d_hv block)
computes its chunk's intra-chunk output and its own state increment

    ΔC_k = Kᵀ (ā ⊙ V)                         (docs/tfla-kernels.md 2.4, eqs. 39-43)

from its own tiles, then takes C_{k-1} from the program of chunk k-1 (a two-slot fp32 ring
per b·head in global memory, which stays in L2), publishes C_k = ḡ_k C_{k-1} + ΔC_k for
chunk k+1 and adds the inter-chunk term b̄ ⊙ Q C_{k-1} to its output. Only the short
hand-over (wait, one fma per state element, store, flag) is serial along the sequence; the
loads, the four tile products and the H store of all chunks run in parallel. Device memory
traffic: Q, K, V read once, H written once (plus the chunk states in the input dtype when
the backward needs them), against the two-kernel forward's extra K, V read and C_k write
and read.

Programs take their tile from a ticket (an atomic counter), chunk-major: a program only
ever waits for a tile whose program has already started, so the waits cannot deadlock
whatever order the hardware runs the grid in. In the CPU interpreter programs run one
after another in ticket order and never wait.

mLSTMsig only (no max state), without the normaliser (the paper's mLSTMsig); L <= 128 and
d_qk <= 128, so a chunk is one tile and the whole d_qk one block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.chunkwise_recurrent import dot_precision
from tfla.triton.common import can_use_tma, descriptor, load_tile, store_tile

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _fused_sig_fw_kernel(
    Q, K, V, QD, KD, VD, HD, B_vec, I_vec, A_vec, G_ch, C0, RING, SYNC, C_st, C_last, H,
    S, NC, BNH, d_qk, d_hv, scale,
    L: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    HAS_C0: tl.constexpr, SAVE_STATES: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    # SYNC[0]: the ticket counter; SYNC[1 + bh·n_v + v]: how many chunks of (bh, v) have
    # published their end state. RING (BNH, 2, d_qk, d_hv) fp32: the state after chunk k
    # sits in slot k % 2 (the initial state is not in the ring).
    n_v = tl.cdiv(d_hv, B_DHV)
    tile = tl.atomic_add(SYNC, 1)
    pid_v = tile % n_v
    bh = ((tile // n_v) % BNH).to(tl.int64)
    c = tile // (n_v * BNH)
    S_pad = NC * L
    t0 = c * L
    v0 = pid_v * B_DHV
    rows = t0 + tl.arange(0, L)
    offs_k = tl.arange(0, B_DQK)
    offs_v = v0 + tl.arange(0, B_DHV)
    mask_kv = (offs_k < d_qk)[:, None] & (offs_v < d_hv)[None, :]
    c_offs = offs_k[:, None] * d_hv + offs_v[None, :]

    q_t = load_tile(QD, Q, bh, t0, 0, S, d_qk, L, B_DQK, USE_TMA)
    k_t = load_tile(KD, K, bh, t0, 0, S, d_qk, L, B_DQK, USE_TMA)
    v_t = load_tile(VD, V, bh, t0, v0, S, d_hv, L, B_DHV, USE_TMA)
    b_r = tl.load(B_vec + bh * S_pad + rows)
    i_r = tl.load(I_vec + bh * S_pad + rows)            # ī, -inf past S
    a_bar = tl.exp(tl.load(A_vec + bh * S_pad + rows))  # 0 past S

    # hand-over: C_{k-1} from chunk k-1's program; C_k = ḡ C_{k-1} + Kᵀ (ā ⊙ V) to chunk
    # k+1's (the product accumulates into ḡ C_{k-1}: one state tile of registers, not two)
    flag = SYNC + 1 + bh * n_v + pid_v
    ring = RING + bh * 2 * d_qk * d_hv
    if c > 0:
        while tl.atomic_add(flag, 0, sem="acquire") < c:
            pass
        C_prev = tl.load(ring + ((c - 1) % 2) * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0,
                         cache_modifier=".cg")
    else:
        if HAS_C0:
            C_prev = tl.load(C0 + bh * d_qk * d_hv + c_offs, mask=mask_kv, other=0.0).to(tl.float32)
        else:
            C_prev = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    c_dot = C_prev.to(q_t.dtype)
    v_bar = (v_t.to(tl.float32) * a_bar[:, None]).to(v_t.dtype)
    C_new = tl.dot(tl.trans(k_t), v_bar, tl.exp(tl.load(G_ch + bh * NC + c)) * C_prev,
                   input_precision=DOT_PREC)
    if c + 1 < NC:
        tl.store(ring + (c % 2) * d_qk * d_hv + c_offs, C_new, mask=mask_kv)
        tl.debug_barrier()
        tl.atomic_xchg(flag, c + 1, sem="release")
    else:
        tl.store(C_last + bh * d_qk * d_hv + c_offs, C_new, mask=mask_kv)
    if SAVE_STATES:
        st = C_st + bh * (NC + 1) * d_qk * d_hv
        tl.store(st + c * d_qk * d_hv + c_offs, c_dot.to(C_st.dtype.element_ty), mask=mask_kv)
        if c + 1 == NC:
            tl.store(st + NC * d_qk * d_hv + c_offs, C_new.to(C_st.dtype.element_ty),
                     mask=mask_kv)

    # inter-chunk part b̄ ⊙ Q C_{k-1} (rows scaled after the product, as in the H kernel),
    # then the intra-chunk part (Q Kᵀ ⊙ D) V with D_rs = exp((b_r - b_s) + ī_s) for s <= r
    acc = tl.dot(q_t, c_dot, input_precision=DOT_PREC) * (tl.exp(b_r) * scale)[:, None]
    s = tl.dot(q_t, tl.trans(k_t), input_precision=DOT_PREC)
    d_log = (b_r[:, None] - b_r[None, :]) + i_r[None, :]
    d_log = tl.where(rows[:, None] >= rows[None, :], d_log, float("-inf"))
    s_bar = s * scale * tl.exp(d_log)
    acc = tl.dot(s_bar.to(v_t.dtype), v_t, acc, input_precision=DOT_PREC)
    store_tile(HD, H, acc.to(H.dtype.element_ty), bh, t0, v0, S, d_hv, L, B_DHV, USE_TMA)


def _p2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


# Tuning overrides for benchmarks (keys B_DHV, num_warps, USE_TMA).
FUSED_OVERRIDE: dict = {}


def supports(L: int, d_qk: int, d_hv: int, normalize: bool, with_n: bool) -> bool:
    """Whether the fused forward covers a call: mLSTMsig without the normaliser (and without
    a normaliser state to return), a chunk of at most 128 and d_qk of at most 128."""
    return (not normalize) and (not with_n) and 16 <= L <= 128 and d_qk <= 128


def fused_config(L: int, d_qk: int, d_hv: int, dtype: torch.dtype) -> dict:
    """Tile of the fused forward: the whole chunk (L rows), the whole d_qk, d_hv blocks of at
    most 128 (64 for fp32 inputs), 8 warps for 128-row chunks, else 4."""
    cap = 64 if dtype == torch.float32 else 128
    cfg = dict(B_DHV=max(16, min(cap, _p2(d_hv))), num_warps=8 if L >= 128 else 4,
               USE_TMA=dtype in (torch.bfloat16, torch.float16))
    cfg.update(FUSED_OVERRIDE)
    return cfg


def fused_sig_fw(q, k, v, b_vec, i_vec, a_vec, g_ch, C0, *, L: int, save_states: bool):
    """mLSTMsig forward in one kernel.

    q, k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous, input dtype; the gate vectors of
    :func:`chunkwise_recurrent.chunk_gates` (b, ī, a (BNH, N_c·L), g (BNH, N_c) fp32);
    C0 (BNH, d_qk, d_hv) or None. Returns h (BNH, S, d_hv) in the input dtype, C_st
    (BNH, N_c+1, d_qk, d_hv) in the input dtype when ``save_states`` (else None) and
    C_last (BNH, d_qk, d_hv) fp32.
    """
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = triton.cdiv(S, L)
    dev = q.device
    cfg = fused_config(L, d_qk, d_hv, q.dtype)
    b_dqk, b_dhv = max(16, _p2(d_qk)), cfg["B_DHV"]
    n_v = triton.cdiv(d_hv, b_dhv)
    h = torch.empty((BNH, S, d_hv), device=dev, dtype=q.dtype)
    C_last = torch.empty((BNH, d_qk, d_hv), device=dev, dtype=torch.float32)
    C_st = (torch.empty((BNH, NC + 1, d_qk, d_hv), device=dev, dtype=q.dtype)
            if save_states else C_last)
    ring = torch.empty((BNH, 2, d_qk, d_hv), device=dev, dtype=torch.float32)
    sync = torch.zeros((1 + BNH * n_v,), device=dev, dtype=torch.int32)
    use_tma = bool(cfg["USE_TMA"]) and can_use_tma(q, k, v, h, blocks=(L, b_dqk, b_dhv))
    _fused_sig_fw_kernel[(NC * BNH * n_v,)](
        q, k, v, descriptor(q, (1, L, b_dqk), use_tma), descriptor(k, (1, L, b_dqk), use_tma),
        descriptor(v, (1, L, b_dhv), use_tma), descriptor(h, (1, L, b_dhv), use_tma),
        b_vec, i_vec, a_vec, g_ch, C0 if C0 is not None else C_last, ring, sync, C_st, C_last,
        h, S, NC, BNH, d_qk, d_hv, d_qk ** -0.5,
        L=L, B_DQK=b_dqk, B_DHV=b_dhv, HAS_C0=C0 is not None, SAVE_STATES=save_states,
        DOT_PREC=dot_precision(q.dtype), USE_TMA=use_tma,
        num_warps=cfg["num_warps"], num_stages=1,
    )
    return h, (C_st if save_states else None), C_last
