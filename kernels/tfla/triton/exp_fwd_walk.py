"""mLSTMexp xl_chunk forward with the chunk recurrence kept on chip (the "walk" kernel).

Algorithm: docs/tfla-kernels.md 2.4 (chunkwise form with max states) and 4.4/4.8 (the H
kernel). As in exp_parallel_fw, the combined max state m^comb_r = max(b_r + m_{k-1},
m^intra_r) comes from the gates alone, so no online max and no rescaling of accumulators
is needed; here, in addition, the inter-chunk state never travels through HBM between the
recurrent and the parallel kernel: one program = (d_hv block jv, b*head) holds its block
of C (d_qk x B_dhv, fp32), n (d_qk) and m (a scalar) and walks the chunks in order:

    m^comb = max(b + m_{k-1}, m^intra)
    H      = [diag(exp(b + m_{k-1} - m^comb)·scale) Q C_{k-1}
              + (Q Kᵀ·scale ⊙ exp(b - m^comb + u)_causal) V] / (max(|den|, exp(-m^comb)) + eps)
    m_k    = max(g + m_{k-1}, max a),  C_k = exp(g + m_{k-1} - m_k) C_{k-1} + (exp(a - m_k) ⊙ K)ᵀ V

(b, a, u, m^intra, g, max a from exp_recurrent.chunk_gates.) The chunk is one tile
(L <= 128 rows): with 8 warps a 128 x 128 score tile and the 128 x 64 state block fit in
registers on Hopper. One level of parallelism over (d_hv blocks, heads) and none over the
chunks, so the host uses it only when that grid fills the GPU (exp_chunkwise.use_walk);
otherwise the chunk-parallel kernels (exp_recurrent + exp_parallel_fw) run.

With ``STORE_STATES`` (the backward needs them) the chunk states C_0..C_{N_c} are written in
the input dtype, exactly what exp_recurrent.recurrent_fw writes; n_k, m_k (fp32) and the
last state C_S (fp32) are always written (they are small and give the last state).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import can_use_tma, descriptor, load_tile, next_pow2, store_tile
from tfla.triton.exp_recurrent import dot_precision

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _exp_fwd_walk_kernel(
    QD, KD, VD, HD, Q, K, V, H,
    B_vec, A_vec, U_vec, MI_vec, G_ch, AMAX_ch, C0, N0, M0,
    NOUT, C_st, N_st, M_st, C_last,
    S, NC, d_qk, d_hv, scale, eps,
    L: tl.constexpr, BDQK: tl.constexpr, BDHV: tl.constexpr,
    IS_EXP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_C0: tl.constexpr,
    HAS_N0: tl.constexpr, HAS_M0: tl.constexpr, STORE_STATES: tl.constexpr,
    USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
):
    jv = tl.program_id(0)
    bh = tl.program_id(1)
    bh64 = bh.to(tl.int64)
    S_pad = NC * L
    dk = tl.arange(0, BDQK)
    dv = jv * BDHV + tl.arange(0, BDHV)
    mk = dk < d_qk
    mv = dv < d_hv
    cmask = mk[:, None] & mv[None, :]
    c_offs = dk[:, None] * d_hv + dv[None, :]
    st_base = bh64 * (NC + 1) * d_qk * d_hv
    n_base = bh64 * (NC + 1) * d_qk
    writer_n = (dk * 0 + jv) == 0          # block masks (triton 3.9's interpreter, see recurrent)
    writer_m = (tl.zeros((1,), dtype=tl.int32) + jv) == 0
    zero1 = tl.zeros((1,), dtype=tl.int32)

    if HAS_C0:
        C = tl.load(C0 + bh64 * d_qk * d_hv + c_offs, mask=cmask, other=0.0).to(tl.float32)
    else:
        C = tl.zeros((BDQK, BDHV), dtype=tl.float32)
    if HAS_N0:
        n = tl.load(N0 + bh64 * d_qk + dk, mask=mk, other=0.0).to(tl.float32)
    else:
        n = tl.zeros((BDQK,), dtype=tl.float32)
    m = tl.sum(tl.zeros((1,), dtype=tl.float32), 0)      # scalar 0.0
    if IS_EXP:
        if HAS_M0:
            m = tl.load(M0 + bh64).to(tl.float32)
    if STORE_STATES:
        tl.store(C_st + st_base + c_offs, C.to(C_st.dtype.element_ty), mask=cmask)
    tl.store(N_st + n_base + dk, n, mask=mk & writer_n)
    tl.store(M_st + bh64 * (NC + 1) + zero1, m + tl.zeros((1,), dtype=tl.float32), mask=writer_m)

    rows = tl.arange(0, L)
    causal = rows[:, None] >= rows[None, :]
    for c in range(NC):
        t0 = c * L
        pos = bh64 * S_pad + t0 + rows
        q = load_tile(QD, Q, bh, t0, 0, S * d_qk, d_qk, S, d_qk, L, BDQK, USE_TMA)
        k = load_tile(KD, K, bh, t0, 0, S * d_qk, d_qk, S, d_qk, L, BDQK, USE_TMA)
        v = load_tile(VD, V, bh, t0, jv * BDHV, S * d_hv, d_hv, S, d_hv, L, BDHV, USE_TMA)
        b = tl.load(B_vec + pos)
        u = tl.load(U_vec + pos)                 # ī - b, -inf beyond S
        g = tl.load(G_ch + bh64 * NC + c)
        if IS_EXP:
            mc = tl.maximum(b + m, tl.load(MI_vec + pos))        # m^comb (= recurrent m_t)
            m_new = tl.maximum(g + m, tl.load(AMAX_ch + bh64 * NC + c))
        else:
            mc = tl.zeros((L,), dtype=tl.float32)
            m_new = m
        # inter-chunk part, rows scaled by exp(b + m_{k-1} - m^comb)·scale in fp32
        wq = tl.exp(b + m - mc) * scale
        acc = tl.dot(q, C.to(q.dtype), input_precision=DOT_PREC) * wq[:, None]
        # intra-chunk part
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        d_log = tl.where(causal, (b - mc)[:, None] + u[None, :], float("-inf"))
        s_bar = s * (tl.exp(d_log) * scale)
        acc = tl.dot(s_bar.to(v.dtype), v, acc=acc, input_precision=DOT_PREC)
        if NORMALIZE:
            den = wq * tl.sum(q.to(tl.float32) * n[None, :], axis=1) + tl.sum(s_bar, axis=1)
            if IS_EXP:
                floor = tl.exp(-mc)
            else:
                floor = tl.full((L,), 1.0, dtype=tl.float32)
            n_out = tl.maximum(tl.abs(den), floor)
            acc = acc / (n_out + eps)[:, None]
            tl.store(NOUT + pos, n_out, mask=(rows * 0 + jv) == 0)
        store_tile(HD, H, acc.to(H.dtype.element_ty), bh, t0, jv * BDHV, S * d_hv, d_hv,
                   S, d_hv, L, BDHV, USE_TMA)
        # state update C_k = exp(g + m_{k-1} - m_k) C_{k-1} + (exp(a - m_k) ⊙ K)ᵀ V
        a_bar = tl.exp(tl.load(A_vec + pos) - m_new)
        k_bar = k.to(tl.float32) * a_bar[:, None]
        g_bar = tl.exp(g + m - m_new)
        C = tl.dot(tl.trans(k_bar.to(k.dtype)), v, acc=C * g_bar, input_precision=DOT_PREC)
        n = n * g_bar + tl.sum(k_bar, axis=0)
        m = m_new
        if STORE_STATES:
            tl.store(C_st + st_base + (c + 1) * d_qk * d_hv + c_offs, C.to(C_st.dtype.element_ty),
                     mask=cmask)
        tl.store(N_st + n_base + (c + 1) * d_qk + dk, n, mask=mk & writer_n)
        tl.store(M_st + bh64 * (NC + 1) + c + 1 + zero1, m + tl.zeros((1,), dtype=tl.float32),
                 mask=writer_m)
    tl.store(C_last + bh64 * d_qk * d_hv + c_offs, C, mask=cmask)


# Tuning overrides for benchmarks (keys BDHV, num_warps, num_stages, use_tma).
WALK_OVERRIDE: dict = {}


def walk_config(L: int, d_qk: int, d_hv: int) -> dict:
    """Tiles of the walk kernel (a heuristic, docs/kernels-exp-notes.md, version 3).

    The whole d_qk in one block (BDQK = next power of two); B_dhv 64 for L = 128 (the
    128 x 128 score tile, the 128 x 64 accumulator and the state block share the register
    file), else up to 128 with BDQK * B_dhv <= 128 * 128; 8 warps for 64-row or longer
    tiles of that size, 2 pipeline stages (TMA loads of the next chunk overlap this one).
    """
    bdqk = max(16, next_pow2(d_qk))
    bdhv = min(max(16, next_pow2(d_hv)), 64 if L >= 128 else 128, max(16, 16384 // bdqk))
    bdhv = WALK_OVERRIDE.get("BDHV", bdhv)
    warps = 8 if bdqk * bdhv >= 8192 and L >= 64 else 4
    return dict(BDQK=bdqk, BDHV=bdhv, num_warps=WALK_OVERRIDE.get("num_warps", warps),
                num_stages=WALK_OVERRIDE.get("num_stages", 2),
                use_tma=WALK_OVERRIDE.get("use_tma", True))


def exp_fwd_walk(q, k, v, gates, C0, n0, m0, *, L: int, is_exp: bool, normalize: bool,
                 eps: float, store_states: bool):
    """h, n_out and the chunk states in one kernel (the forward of exp_recurrent.recurrent_fw
    followed by exp_parallel_fw.parallel_fw, without the states' round trip through HBM).

    q, k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous, input dtype; gates as returned by
    exp_recurrent.chunk_gates; C0 (BNH, d_qk, d_hv), n0 (BNH, d_qk), m0 (BNH,) or None.
    Returns h (BNH, S, d_hv) in the input dtype, n_out (BNH, N_c*L) fp32, and
    (C_st (BNH, N_c+1, d_qk, d_hv) in the input dtype, or None unless store_states;
    n_st (BNH, N_c+1, d_qk) fp32; m_st (BNH, N_c+1) fp32; C_last (BNH, d_qk, d_hv) fp32).
    """
    b_vec, a_vec, u_vec, mi_vec, g_ch, amax_ch = gates
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = triton.cdiv(S, L)
    dev = q.device
    cfg = walk_config(L, d_qk, d_hv)
    h = torch.empty((BNH, S, d_hv), device=dev, dtype=q.dtype)
    n_out = torch.empty((BNH, NC * L), device=dev, dtype=torch.float32)
    C_st = (torch.empty((BNH, NC + 1, d_qk, d_hv), device=dev, dtype=q.dtype)
            if store_states else None)
    n_st = torch.empty((BNH, NC + 1, d_qk), device=dev, dtype=torch.float32)
    m_st = torch.empty((BNH, NC + 1), device=dev, dtype=torch.float32)
    C_last = torch.empty((BNH, d_qk, d_hv), device=dev, dtype=torch.float32)
    use_tma = cfg["use_tma"] and can_use_tma(q, k, v, h, blocks=(cfg["BDQK"], cfg["BDHV"], L))
    QD = descriptor(q, (1, L, cfg["BDQK"]), use_tma)
    KD = descriptor(k, (1, L, cfg["BDQK"]), use_tma)
    VD = descriptor(v, (1, L, cfg["BDHV"]), use_tma)
    HD = descriptor(h, (1, L, cfg["BDHV"]), use_tma)
    dummy = m_st
    grid = (triton.cdiv(d_hv, cfg["BDHV"]), BNH)
    _exp_fwd_walk_kernel[grid](
        QD, KD, VD, HD, q, k, v, h,
        b_vec, a_vec, u_vec, mi_vec, g_ch, amax_ch,
        C0 if C0 is not None else dummy, n0 if n0 is not None else dummy,
        m0 if m0 is not None else dummy,
        n_out, C_st if store_states else dummy, n_st, m_st, C_last,
        S, NC, d_qk, d_hv, d_qk ** -0.5, eps,
        L=L, BDQK=cfg["BDQK"], BDHV=cfg["BDHV"], IS_EXP=is_exp, NORMALIZE=normalize,
        HAS_C0=C0 is not None, HAS_N0=n0 is not None, HAS_M0=m0 is not None,
        STORE_STATES=store_states, USE_TMA=use_tma, DOT_PREC=dot_precision(q.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return h, n_out, (C_st, n_st, m_st, C_last)
