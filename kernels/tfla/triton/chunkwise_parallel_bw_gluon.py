"""Backward kernels of mLSTMsig in Gluon: dQ at Figure 5's heads (tuning rule B12) and the
one-launch dK/dV at Figure 4's and the small heads (rule B13; docs/kernels.md).

The products of ``_dq_once_kernel`` under rule B11 at L 256 (one program per 64-row query
tile, 128-row key/value tiles, d_qk and d_hv blocks of 128, 4 warps; paper Table 1, row dQ;
docs/tfla-kernels.md 3.3), in the same order and rounding, with the memory traffic
scheduled by hand. The program keeps its query tile's dH (64 × d_hv) and Q blocks in shared
memory and streams every other tile (the V blocks of its key tiles, then per d_qk block the
blocks of C_{k-1} and of K) through one ring of three TMA buffers, each with an mbarrier;
the ring's next tiles load while the current tile's wgmma product runs:

- dS_j = dH̃ V_jᵀ over the d_hv blocks, for the last key tile and (two key tiles) the first;
  gated in registers (mLSTMsig: · exp(b_r - b_s + ī_s), causal, · scale) and rounded to K's
  dtype;
- per d_qk block: dQ = b̄ ⊙ dH̃ C_{k-1}ᵀ · scale (none at chunk 0 without an initial state),
  + dS_0 K_0 (two key tiles) + dS_last K_last; the row sums q·dq in float32 before dQ is
  rounded and stored through TMA.

dq and q·dq are ``_dq_once_kernel``'s bit for bit (checked on the GPU; the CPU tests compile
it for sm_90, Triton's interpreter cannot run Gluon). Elsewhere (mLSTMexp, the normaliser,
32-bit inputs, other heads or chunk sizes, tiles a ``Tuning`` overrides, addresses TMA cannot
take, Triton's interpreter, a GPU other than sm_90) ``parallel_bw_dq`` runs the Triton kernels.

dK/dV (``_dkv_gluon_kernel``): the products of ``_dkv_fused_kernel`` under rule B4 (one
program per 64-row key/value tile with the whole head dimensions; paper Table 1, rows dK, dV),
in its order and rounding. K, V, the first two query tiles' Q and dH̃ and dC_k load through TMA
at once; per query tile K Qᵀ and V dH̃ᵀ run as asynchronous wgmma while the gate matrix Dᵀ is
formed in registers, then dV += (K Qᵀ ⊙ Dᵀ) dH̃ and dK += (V dH̃ᵀ ⊙ Dᵀ) Q; after the loop
ā ⊙ (K dC_k) and ā ⊙ (V dC_kᵀ) (none at the last chunk without dC_last); the row sums k·dk from
the K tile on chip; dK and dV leave through the K and V buffers. dk and dv are
``_dkv_fused_kernel``'s bit for bit (checked on the GPU); elsewhere ``parallel_bw_dkv`` runs
the Triton kernels.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from tfla.triton.common import cdiv, gluon_descriptor, gluon_takes, launch

#: the tiles the kernel is written for (rules B11 and C2 at L 256): query rows, the side of
#: every streamed tile (key/value rows, d_qk and d_hv blocks), d_qk, d_hv (blocks of 128),
#: ring buffers, warps
B_LQ, B_T, D_QK, D_HV, NBUF, NUM_WARPS = 64, 128, 256, 512, 3, 4


@gluon.jit
def _issue(t, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars,
           L: gl.constexpr, B_T: gl.constexpr, NBUF: gl.constexpr, N_RED: gl.constexpr):
    # tile t of the program's sequence into ring slot t % NBUF: the d_hv blocks of V for key
    # tile n_kv - 1, then (n_kv 2) for key tile 0; per d_qk block kb the d_hv blocks of
    # C_{k-1}'s rows kb (where the inter-chunk product runs), then block kb of K for key
    # tiles 0 .. n_kv - 1
    slot = t % NBUF
    bar = bars.index(slot)
    buf = ring.index(slot)
    mbarrier.expect(bar, v_desc.block_type.nbytes)      # the ring's tiles share one shape
    n_ds = N_RED * n_kv
    if t < n_ds:
        j = n_kv - 1 - t // N_RED
        tma.async_copy_global_to_shared(v_desc, [bh, c * L + j * B_T, (t % N_RED) * B_T], bar,
                                        buf)
    else:
        u = t - n_ds
        per = N_RED * inter + n_kv
        kb = u // per
        w = u % per
        if w < N_RED * inter:
            tma.async_copy_global_to_shared(c_desc, [c_row, kb * B_T, w * B_T], bar, buf)
        else:
            j = w - N_RED * inter
            tma.async_copy_global_to_shared(k_desc, [bh, c * L + j * B_T, kb * B_T], bar, buf)


@gluon.jit
def _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars,
          L: gl.constexpr, B_T: gl.constexpr, NBUF: gl.constexpr, N_RED: gl.constexpr):
    # tile t's product is done: its slot takes tile t + NBUF
    if t + NBUF < T:
        _issue(t + NBUF, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L, B_T,
               NBUF, N_RED)
    return t + 1


@gluon.jit
def _dh_times_ring(acc, dh_smem, t, ring, bars, B_LQ: gl.constexpr, B_T: gl.constexpr, NBUF: gl.constexpr,
                   PER: gl.constexpr, DH_W: gl.constexpr, vb: gl.constexpr):
    # acc += dH̃[:, block vb] · (ring tile t)ᵀ, waited for
    slot = t % NBUF
    mbarrier.wait(bars.index(slot), (t // NBUF) & 1)
    a = dh_smem.index(vb // PER).reshape([B_LQ, DH_W]).slice((vb % PER) * B_T, B_T, dim=1)
    acc = warpgroup_mma(a, ring.index(slot).reshape([B_T, B_T]).permute((1, 0)), acc,
                        is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _times_ring(acc, ds, t, ring, bars, B_T: gl.constexpr, NBUF: gl.constexpr):
    # acc += dS · (ring tile t: a K block), waited for
    slot = t % NBUF
    mbarrier.wait(bars.index(slot), (t // NBUF) & 1)
    acc = warpgroup_mma(ds, ring.index(slot).reshape([B_T, B_T]), acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _gated(ds, j, b_q, rows, B_vec, I_vec, g_base, scale, out_dtype: gl.constexpr,
           op_layout: gl.constexpr, B_T: gl.constexpr):
    # dS of key tile j gated (· exp(b_r - b_s + ī_s), causal, · scale), rounded to K's dtype,
    # as wgmma's register operand
    cols = j * B_T + gl.arange(0, B_T, layout=gl.SliceLayout(0, ds.type.layout))
    d_log = b_q[:, None] - gl.load(B_vec + g_base + cols)[None, :] \
        + gl.load(I_vec + g_base + cols)[None, :]                   # b_r - b_s first
    d_log = gl.where(rows[:, None] >= cols[None, :], d_log, float("-inf"))
    return gl.convert_layout((ds * gl.exp(d_log) * scale).to(out_dtype), op_layout)


@gluon.jit
def _ring_barriers(NBUF: gl.constexpr):
    # one mbarrier per slot of a ring of NBUF TMA buffers, each for one arrival
    bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(bars.index(i), count=1)
    return bars


@gluon.jit
def _invalidate_ring(bars, NBUF: gl.constexpr):
    for i in gl.static_range(NBUF):
        mbarrier.invalidate(bars.index(i))


@gluon.jit
def _tile_pid(L: gl.constexpr, B: gl.constexpr, NC, ROLES: gl.constexpr):
    # (role, tile, chunk, b·head, first gate index of the chunk) of the 1-D grid: ROLES
    # programs per tile fastest, then the chunk's tiles of B rows, then chunk·b·head (as the
    # Triton kernels' chunk_tile_pid)
    pid = gl.program_id(0)
    N_T: gl.constexpr = L // B
    cbh = pid // (ROLES * N_T)
    c = cbh % NC
    bh = cbh // NC
    return pid % ROLES, (pid // ROLES) % N_T, c, bh, bh.to(gl.int64) * (NC * L) + c * L


@gluon.jit
def _dq_gluon_kernel(q_desc, k_desc, v_desc, c_desc, dh_desc, dq_desc, B_vec, I_vec, QDQ, NC,
                     scale, HAS_C0: gl.constexpr, L: gl.constexpr, B_LQ: gl.constexpr,
                     B_T: gl.constexpr, N_RED: gl.constexpr, N_OUT: gl.constexpr,
                     NBUF: gl.constexpr, num_warps: gl.constexpr):
    # 1-D grid as _dq_once_kernel's: query tile fastest, then chunk·b·head
    _, pid_q, c, bh, g_base = _tile_pid(L, B_LQ, NC, 1)
    r0 = c * L + pid_q * B_LQ
    c_row = bh * (NC + 1) + c
    n_kv = (pid_q * B_LQ) // B_T + 1               # key tiles on or below the diagonal
    inter = gl.minimum(c + HAS_C0, 1)              # C_{k-1} != 0: the inter-chunk product
    T = N_RED * n_kv + N_OUT * (N_RED * inter + n_kv)

    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, B_T, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    DH_W: gl.constexpr = dh_desc.block_type.shape[2]
    PER: gl.constexpr = DH_W // B_T
    N_DH: gl.constexpr = N_RED // PER

    dh_smem = gl.allocate_shared_memory(dh_desc.dtype, [N_DH] + dh_desc.block_type.shape,
                                        dh_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [N_OUT] + q_desc.block_type.shape,
                                       q_desc.layout)
    ring = gl.allocate_shared_memory(v_desc.dtype, [NBUF] + v_desc.block_type.shape,
                                     v_desc.layout)
    bar_in = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_in, count=1)
    bars = _ring_barriers(NBUF)

    # the query tile's dH̃ and Q; the ring's first tiles
    mbarrier.expect(bar_in, N_DH * dh_desc.block_type.nbytes + N_OUT * q_desc.block_type.nbytes)
    for i in gl.static_range(N_DH):
        tma.async_copy_global_to_shared(dh_desc, [bh, r0, i * DH_W], bar_in, dh_smem.index(i))
    for i in gl.static_range(N_OUT):
        tma.async_copy_global_to_shared(q_desc, [bh, r0, i * B_T], bar_in, q_smem.index(i))
    for i in gl.static_range(NBUF):
        if i < T:
            _issue(i, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L, B_T,
                   NBUF, N_RED)
    rows = pid_q * B_LQ + gl.arange(0, B_LQ, layout=gl.SliceLayout(1, acc_layout))
    b_q = gl.load(B_vec + g_base + rows)
    row_scale = gl.exp(b_q) * scale                 # b̄ · scale
    mbarrier.wait(bar_in, 0)

    # dS of the last key tile, then (two key tiles) of the first, gated and rounded
    t = 0
    ds = gl.zeros((B_LQ, B_T), dtype=gl.float32, layout=acc_layout)
    for vb in gl.static_range(N_RED):
        ds = _dh_times_ring(ds, dh_smem, t, ring, bars, B_LQ, B_T, NBUF, PER, DH_W, vb)
        t = _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L, B_T,
                  NBUF, N_RED)
    ds_last = _gated(ds, n_kv - 1, b_q, rows, B_vec, I_vec, g_base, scale, k_desc.dtype,
                     op_layout, B_T)
    ds_0 = gl.zeros((B_LQ, B_T), dtype=k_desc.dtype, layout=op_layout)
    if n_kv == 2:
        ds = gl.zeros((B_LQ, B_T), dtype=gl.float32, layout=acc_layout)
        for vb in gl.static_range(N_RED):
            ds = _dh_times_ring(ds, dh_smem, t, ring, bars, B_LQ, B_T, NBUF, PER, DH_W,
                                vb)
            t = _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L,
                      B_T, NBUF, N_RED)
        ds_0 = _gated(ds, 0, b_q, rows, B_vec, I_vec, g_base, scale, k_desc.dtype, op_layout,
                      B_T)

    # per d_qk block: the inter-chunk part, then dS_0 K_0 and dS_last K_last
    rowsum = gl.zeros((B_LQ,), dtype=gl.float32, layout=gl.SliceLayout(1, acc_layout))
    for kb in gl.static_range(N_OUT):
        acc = gl.zeros((B_LQ, B_T), dtype=gl.float32, layout=acc_layout)
        if inter == 1:
            for vb in gl.static_range(N_RED):
                acc = _dh_times_ring(acc, dh_smem, t, ring, bars, B_LQ, B_T, NBUF, PER,
                                     DH_W, vb)
                t = _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars,
                          L, B_T, NBUF, N_RED)
        acc = acc * row_scale[:, None]
        if n_kv == 2:
            acc = _times_ring(acc, ds_0, t, ring, bars, B_T, NBUF)
            t = _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L,
                      B_T, NBUF, N_RED)
        acc = _times_ring(acc, ds_last, t, ring, bars, B_T, NBUF)
        t = _next(t, T, n_kv, inter, bh, c, c_row, v_desc, c_desc, k_desc, ring, bars, L, B_T,
                  NBUF, N_RED)
        q_blk = q_smem.index(kb).reshape([B_LQ, B_T])
        rowsum += gl.sum(q_blk.load(acc_layout).to(gl.float32) * acc, axis=1)
        q_blk.store(acc.to(dq_desc.dtype))           # dQ leaves through the Q block's buffer
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [bh, r0, kb * B_T], q_smem.index(kb))
    gl.store(QDQ + g_base + rows, rowsum)
    tma.store_wait(pendings=0)
    mbarrier.invalidate(bar_in)
    _invalidate_ring(bars, NBUF)


def applies_dq(cfg: dict, q, k, v, C_st, dh, *, L: int, is_exp: bool, normalize: bool) -> bool:
    """Whether ``parallel_bw_dq`` runs :func:`parallel_bw_dq_gluon` (rule B12,
    docs/kernels.md): mLSTMsig without the normaliser, 16-bit q, k, v, dh (and chunk states),
    L 256, d_qk 256, 256 < d_hv <= 512, ``bw_config``'s B11 tiles at L 256 with its ``GLUON``
    flag on, 16-byte aligned rows (TMA), Triton compiling for an sm_90 target."""
    if is_exp or normalize or L != 256 or not (cfg.get("GLUON") and cfg["ONCE_DQ"]):
        return False
    if not (q.shape[-1] == D_QK and 256 < v.shape[-1] <= D_HV):
        return False
    if (cfg["B_LQ"], cfg["B_LKV"], cfg["B_DQK"], cfg["B_DHV"], cfg["num_warps"]) != (
            B_LQ, B_T, B_T, B_T, NUM_WARPS):
        return False
    return gluon_takes(q, k, v, dh, C_st, blocks=(B_LQ, B_T, 256))


def parallel_bw_dq_gluon(q, k, v, b_vec, i_vec, C_st, dh, *, L: int, has_c0: bool):
    """(dq in q's dtype, the fp32 row sums q·dq (BNH, N_c·L)) under rule B12 (where
    :func:`applies_dq`).

    q, k (BNH, S, 256), v, dh (BNH, S, d_hv) contiguous 16-bit; b_vec, i_vec (BNH, N_c·L)
    fp32 (the gate kernel's b and ī, ī -inf beyond S); C_st (BNH, N_c+1, 256, d_hv) in q's
    dtype (C_{k-1} at index k); ``has_c0`` False: C_0 = 0 and chunk 0's inter-chunk product is
    skipped. No normaliser (paper eqs. 22-23).
    """
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    dq = torch.empty_like(q)
    qdq = torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32)
    launch(
        _dq_gluon_kernel, ((L // B_LQ) * NC * BNH,), gluon_descriptor(q, [1, B_LQ, B_T]), gluon_descriptor(k, [1, B_T, B_T]),
        gluon_descriptor(v, [1, B_T, B_T]),
        gluon_descriptor(C_st.view(-1, d_qk, d_hv), [1, B_T, B_T]),
        gluon_descriptor(dh, [1, B_LQ, 256]), gluon_descriptor(dq, [1, B_LQ, B_T]),
        b_vec, i_vec, qdq, NC, d_qk ** -0.5,
        HAS_C0=has_c0, L=L, B_LQ=B_LQ, B_T=B_T, N_RED=D_HV // B_T, N_OUT=D_QK // B_T,
        NBUF=NBUF, num_warps=NUM_WARPS)
    return dq, qdq


# ------------------------------------------------------------------ dK and dV (rule B13)

#: the tiles of the dK/dV kernel (rule B4's): query and key/value rows, query-tile buffers;
#: rule B4's 4 or 8 warps (with 8, each warpgroup takes half the columns of every product)
DKV_B_L, DKV_NBUF = 64, 2
#: the head dimensions it is written for, (d_qk, d_hv) rounded up to powers of two (rule B4's)
DKV_HEADS = ((128, 256), (64, 128))


@gluon.jit
def _issue_q(u, j0, bh, c, q_desc, dh_desc, q_ring, dh_ring, bars, L: gl.constexpr,
             B_L: gl.constexpr, NBUF: gl.constexpr):
    # query tile j0 + u's Q and dH̃ into ring slot u % NBUF
    slot = u % NBUF
    bar = bars.index(slot)
    r0 = c * L + (j0 + u) * B_L
    mbarrier.expect(bar, q_desc.block_type.nbytes + dh_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh, r0, 0], bar, q_ring.index(slot))
    tma.async_copy_global_to_shared(dh_desc, [bh, r0, 0], bar, dh_ring.index(slot))


# NC not specialised: NC = 1 as a constant (no dC_last) folds the inter-chunk part away, and
# Triton 3.6 then fails to lower the unused dC_k buffer
@gluon.jit(do_not_specialize=["NC"])
def _dkv_gluon_kernel(q_desc, k_desc, v_desc, dh_desc, dc_desc, dk_desc, dv_desc, B_vec, I_vec,
                      A_vec, KDK, NC, scale, HAS_DC_LAST: gl.constexpr, L: gl.constexpr,
                      B_L: gl.constexpr, D_QK: gl.constexpr, D_HV: gl.constexpr,
                      NBUF: gl.constexpr, num_warps: gl.constexpr):
    # 1-D grid as _dkv_fused_kernel's: key/value tile fastest, then chunk·b·head
    _, pid_kv, c, bh, g_base = _tile_pid(L, B_L, NC, 1)
    s0 = c * L + pid_kv * B_L
    n_q = L // B_L - pid_kv                         # query tiles on or after the diagonal
    inter = c < NC - 1 + HAS_DC_LAST                # dC_k != 0: the inter-chunk products

    # every product splits its columns over the WG warpgroups
    WG: gl.constexpr = num_warps // 4
    p_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, B_L // WG, 16])
    dk_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, D_QK // WG, 16])
    dv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, D_HV // WG, 16])
    pk_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout,
                                                  k_width=2)
    pv_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout,
                                                  k_width=2)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    dc_smem = gl.allocate_shared_memory(dc_desc.dtype, dc_desc.block_type.shape,
                                        dc_desc.layout)
    q_ring = gl.allocate_shared_memory(q_desc.dtype, [NBUF] + q_desc.block_type.shape,
                                       q_desc.layout)
    dh_ring = gl.allocate_shared_memory(dh_desc.dtype, [NBUF] + dh_desc.block_type.shape,
                                        dh_desc.layout)
    bar_kv = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bar_dc = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_kv, count=1)
    mbarrier.init(bar_dc, count=1)
    bars = _ring_barriers(NBUF)

    # every load at once: K and V, the first query tiles' Q and dH̃, then dC_k
    mbarrier.expect(bar_kv, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [bh, s0, 0], bar_kv, k_smem)
    tma.async_copy_global_to_shared(v_desc, [bh, s0, 0], bar_kv, v_smem)
    for i in gl.static_range(NBUF):
        if i < n_q:
            _issue_q(i, pid_kv, bh, c, q_desc, dh_desc, q_ring, dh_ring, bars, L, B_L, NBUF)
    if inter:
        mbarrier.expect(bar_dc, dc_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(dc_desc, [bh * (NC + 1) + c + 1, 0, 0], bar_dc,
                                        dc_smem)

    # per key/value row: b, ī (-inf beyond S); ā = exp(a)
    s_loc = pid_kv * B_L + gl.arange(0, B_L, layout=gl.SliceLayout(1, p_layout))
    b_kv = gl.load(B_vec + g_base + s_loc)
    i_kv = gl.load(I_vec + g_base + s_loc)
    k2 = k_smem.reshape([B_L, D_QK])
    v2 = v_smem.reshape([B_L, D_HV])
    dk = gl.zeros((B_L, D_QK), dtype=gl.float32, layout=dk_layout)
    dv = gl.zeros((B_L, D_HV), dtype=gl.float32, layout=dv_layout)
    mbarrier.wait(bar_kv, 0)
    for u in range(n_q):
        slot = u % NBUF
        mbarrier.wait(bars.index(slot), (u // NBUF) & 1)
        q2 = q_ring.index(slot).reshape([B_L, D_QK])
        dh2 = dh_ring.index(slot).reshape([B_L, D_HV])
        zero = gl.zeros((B_L, B_L), dtype=gl.float32, layout=p_layout)
        p = warpgroup_mma(k2, q2.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(v2, dh2.permute((1, 0)), zero, use_acc=False, is_async=True)
        # the gate matrix Dᵀ (key/value rows, query columns) and the row scale, while they run
        r_loc = (pid_kv + u) * B_L + gl.arange(0, B_L, layout=gl.SliceLayout(0, p_layout))
        b_q = gl.load(B_vec + g_base + r_loc)
        d_log = b_q[None, :] - b_kv[:, None] + i_kv[:, None]      # b_r - b_s first
        d_log = gl.where(r_loc[None, :] >= s_loc[:, None], d_log, float("-inf"))
        d_mat = gl.exp(d_log) * scale
        p = warpgroup_mma_wait(num_outstanding=1, deps=(p,))
        p = gl.convert_layout((p * d_mat).to(q_desc.dtype), pv_layout)
        dv = warpgroup_mma(p, dh2, dv, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))
        dp = gl.convert_layout((dp * d_mat).to(q_desc.dtype), pk_layout)
        dk = warpgroup_mma(dp, q2, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        if u + NBUF < n_q:                          # the slot's products are done
            _issue_q(u + NBUF, pid_kv, bh, c, q_desc, dh_desc, q_ring, dh_ring, bars, L, B_L,
                     NBUF)

    # inter: ā ⊙ (K dC_k), ā ⊙ (V dC_kᵀ) (none at the last chunk without dC_last)
    if inter:
        mbarrier.wait(bar_dc, 0)
        dc2 = dc_smem.reshape([D_QK, D_HV])
        a_dv = gl.exp(gl.load(A_vec + g_base + pid_kv * B_L
                              + gl.arange(0, B_L, layout=gl.SliceLayout(1, dv_layout))))
        a_dk = gl.exp(gl.load(A_vec + g_base + pid_kv * B_L
                              + gl.arange(0, B_L, layout=gl.SliceLayout(1, dk_layout))))
        iv = warpgroup_mma(k2, dc2, gl.zeros((B_L, D_HV), dtype=gl.float32, layout=dv_layout),
                           use_acc=False, is_async=True)
        iv = warpgroup_mma_wait(num_outstanding=0, deps=(iv,))
        dv = dv + iv * a_dv[:, None]
        ik = warpgroup_mma(v2, dc2.permute((1, 0)),
                           gl.zeros((B_L, D_QK), dtype=gl.float32, layout=dk_layout),
                           use_acc=False, is_async=True)
        ik = warpgroup_mma_wait(num_outstanding=0, deps=(ik,))
        dk = dk + ik * a_dk[:, None]

    # the row sums k·dk (fp32, before dk is rounded) from the K tile on chip; dK and dV
    # leave through the K and V buffers
    rowsum = gl.sum(k2.load(dk_layout).to(gl.float32) * dk, axis=1)
    gl.store(KDK + g_base + pid_kv * B_L
             + gl.arange(0, B_L, layout=gl.SliceLayout(1, dk_layout)), rowsum)
    k2.store(dk.to(dk_desc.dtype))
    v2.store(dv.to(dv_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [bh, s0, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [bh, s0, 0], v_smem)
    tma.store_wait(pendings=0)
    mbarrier.invalidate(bar_kv)
    mbarrier.invalidate(bar_dc)
    _invalidate_ring(bars, NBUF)


def applies_dkv(cfg: dict, q, k, v, dC_st, dh, *, L: int, is_exp: bool,
                normalize: bool) -> bool:
    """Whether ``parallel_bw_dkv`` runs :func:`parallel_bw_dkv_gluon` (rule B13,
    docs/kernels.md): mLSTMsig without the normaliser, 16-bit q, k, v, dh (and state
    gradients), ``bw_config``'s one-launch dK/dV (rule B4) in 64-row tiles with 4 or 8 warps
    and its ``GLUON`` flag on, (d_qk, d_hv) exactly (128, 256) or (64, 128), L a multiple of 64
    up to 256, 16-byte aligned rows (TMA), Triton compiling for an sm_90 target."""
    if is_exp or normalize or not (cfg.get("GLUON") and cfg["FUSED_DKV"]):
        return False
    if (q.shape[-1], v.shape[-1]) not in DKV_HEADS or L not in (64, 128, 256):
        return False
    if (cfg["DKV_B_LQ"], cfg["DKV_B_LKV"]) != (DKV_B_L, DKV_B_L) or cfg["DKV_num_warps"] not in (
            4, 8):
        return False
    return gluon_takes(q, k, v, dh, dC_st, blocks=(DKV_B_L, q.shape[-1], v.shape[-1]))


def parallel_bw_dkv_gluon(q, k, v, b_vec, i_vec, a_vec, dC_st, dh, *, L: int,
                          has_dc_last: bool, num_warps: int = 8):
    """(dk, dv in q's dtype, the fp32 row sums k·dk (BNH, N_c·L)) under rule B13 (where
    :func:`applies_dkv`).

    q, k (BNH, S, d_qk), v, dh (BNH, S, d_hv) contiguous 16-bit, (d_qk, d_hv) one of
    ``DKV_HEADS``; b_vec, i_vec, a_vec (BNH, N_c·L) fp32 (the gate kernel's b, ī and a; ī
    -inf beyond S); dC_st (BNH, N_c+1, d_qk, d_hv) in q's dtype (dC_k at index k);
    ``has_dc_last`` False: dC_N = 0 and the last chunk's inter-chunk products are skipped.
    ``num_warps``: 4 or 8 (rule B4's). No normaliser (paper eqs. 22-23).
    """
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    kdk = torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32)
    rows_qk, rows_hv = [1, DKV_B_L, d_qk], [1, DKV_B_L, d_hv]
    launch(
        _dkv_gluon_kernel, ((L // DKV_B_L) * NC * BNH,), gluon_descriptor(q, rows_qk), gluon_descriptor(k, rows_qk),
        gluon_descriptor(v, rows_hv), gluon_descriptor(dh, rows_hv),
        gluon_descriptor(dC_st.view(-1, d_qk, d_hv), [1, d_qk, d_hv]),
        gluon_descriptor(dk, rows_qk), gluon_descriptor(dv, rows_hv),
        b_vec, i_vec, a_vec, kdk, NC, d_qk ** -0.5,
        HAS_DC_LAST=has_dc_last, L=L, B_L=DKV_B_L, D_QK=d_qk, D_HV=d_hv, NBUF=DKV_NBUF,
        num_warps=num_warps)
    return dk, dv, kdk
