"""dK and dV of mLSTMsig in Gluon at Figure 5's heads: ``_dkv_once_kernel`` under rule B10 at
L 256 (docs/kernels.md; paper Table 1, rows dK, dV; docs/tfla-kernels.md 3.3).

The products of ``_dkv_once_kernel`` with ``bw_config(256, 256, 512, 16-bit)``'s tiles
(128-row query and key/value tiles, d_qk and d_hv blocks of 128, 8 warps), in the same
order and rounding, with the memory traffic scheduled by hand. One program per (role dK or
dV, key/value tile, chunk, b·head), in ``_dkv_once_kernel``'s grid order. A program keeps
its key/value tile's X (dK: V, 128 × 512; dV: K, 128 × 256) in shared memory and streams
every other 128 × 128 tile through one ring of three TMA buffers, each with an mbarrier; the
ring's next tiles load while the current tile's wgmma product runs:

- S_j = X Y_jᵀ over the blocks of the contracted head dimension (dK: Y = dH̃, d_hv; dV:
  Y = Q, d_qk), for the last query tile and (key/value tile 0) query tile 0; gated in
  registers (mLSTMsig: · exp(b_r - b_s + ī_s), causal r >= s, · scale) and rounded to the
  input dtype;
- per 128-column block of the output (dK: d_qk, Z = Q; dV: d_hv, Z = dH̃):
  ā ⊙ (X dC_k) (dK: dC_kᵀ; the product over the contracted blocks, ā = exp(a) after it;
  at the last chunk without dC_last ā ⊙ 0), + S_0 Z_0 (key/value tile 0) + S_last Z_last;
  dK adds the fp32 row sums k·dk over its blocks (the K block through the ring) before dk
  is rounded; the block leaves through TMA (dK: from the K block's ring buffer; dV: from
  two staging buffers behind the K tile).

Each warpgroup takes 64 rows of every product (the accumulation order per element is the
Triton kernel's). dk, dv and k·dk are ``_dkv_once_kernel``'s bit for bit (checked on the
GPU, ``benchmarks/check_dkv_once_gluon.py``; Triton's interpreter cannot run Gluon). Elsewhere (:func:`applies_dkv_once` False) ``parallel_bw_dkv`` runs the
Triton kernels.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from tfla.triton.chunkwise_parallel_bw_gluon import _invalidate_ring, _ring_barriers, _tile_pid
from tfla.triton.common import cdiv, gluon_descriptor, gluon_takes, launch

#: the tiles the kernel is written for (rule B10 at L 256): the side of every tile (query
#: and key/value rows, d_qk and d_hv blocks), L, d_qk, d_hv, ring buffers, warps
B_T, L_ONCE, D_QK, D_HV, NBUF, NUM_WARPS = 128, 256, 256, 512, 3, 8
#: buffers kept on chip: dK's V tile (d_hv / 128 blocks); dV's K tile and two staging buffers
N_KEEP = max(D_HV // B_T, D_QK // B_T + 2)


@gluon.jit
def _issue(t, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring, bars,
           L: gl.constexpr, B: gl.constexpr, NBUF: gl.constexpr, N_RED: gl.constexpr,
           OUT_K: gl.constexpr):
    # tile t of the program's sequence into ring slot t % NBUF: the N_RED blocks of Y for
    # the last query tile, then (n_q 2) for query tile 0; per output block ob the N_RED
    # blocks of dC_k (where the inter-chunk product runs: dK rows ob, dV columns ob), Z's
    # block ob for query tile 0 (n_q 2) and the last, then (dK) K's block ob
    slot = t % NBUF
    bar = bars.index(slot)
    buf = ring.index(slot)
    mbarrier.expect(bar, y_desc.block_type.nbytes)      # the ring's tiles share one shape
    n_a = N_RED * n_q
    if t < n_a:
        j = L // B - 1 - t // N_RED
        tma.async_copy_global_to_shared(y_desc, [bh, c * L + j * B, (t % N_RED) * B], bar, buf)
    else:
        u = t - n_a
        n_dc = N_RED * inter
        per = n_dc + n_q + OUT_K
        ob = u // per
        w = u % per
        if w < n_dc:
            if OUT_K:
                tma.async_copy_global_to_shared(dc_desc, [dc_row, ob * B, w * B], bar, buf)
            else:
                tma.async_copy_global_to_shared(dc_desc, [dc_row, w * B, ob * B], bar, buf)
        else:
            if w < n_dc + n_q:
                j = L // B - n_q + (w - n_dc)
                tma.async_copy_global_to_shared(z_desc, [bh, c * L + j * B, ob * B], bar, buf)
            else:
                if OUT_K:
                    tma.async_copy_global_to_shared(k_desc, [bh, s0, ob * B], bar, buf)


@gluon.jit
def _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring, bars,
          L: gl.constexpr, B: gl.constexpr, NBUF: gl.constexpr, N_RED: gl.constexpr,
          OUT_K: gl.constexpr):
    # tile t is consumed: its slot takes tile t + NBUF
    if t + NBUF < T:
        _issue(t + NBUF, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring,
               bars, L, B, NBUF, N_RED, OUT_K)
    return t + 1


@gluon.jit
def _times_ring(acc, a, t, ring, bars, B: gl.constexpr, NBUF: gl.constexpr,
                TRANS: gl.constexpr):
    # acc += a · (ring tile t, transposed where TRANS), waited for
    slot = t % NBUF
    mbarrier.wait(bars.index(slot), (t // NBUF) & 1)
    b = ring.index(slot).reshape([B, B])
    if TRANS:
        b = b.permute((1, 0))
    acc = warpgroup_mma(a, b, acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _gated(st, j, s_loc, b_kv, i_kv, B_vec, g_base, scale, out_dtype: gl.constexpr,
           op_layout: gl.constexpr, B: gl.constexpr):
    # S_j (key/value rows, query columns) gated as _gated_st gates it (mLSTMsig, no
    # normaliser: m^comb = b·0, row scale b·0 + scale), rounded to Z's dtype, as wgmma's
    # register operand
    r_loc = j * B + gl.arange(0, B, layout=gl.SliceLayout(0, st.type.layout))
    b_q = gl.load(B_vec + g_base + r_loc)
    mc_q = b_q * 0.0
    rs = b_q * 0.0 + scale
    d_log = b_q[None, :] - b_kv[:, None] + i_kv[:, None]          # b_r - b_s first
    d_log = d_log - mc_q[None, :]
    d_log = gl.where(r_loc[None, :] >= s_loc[:, None], d_log, float("-inf"))
    return gl.convert_layout((st * gl.exp(d_log) * rs[None, :]).to(out_dtype), op_layout)


@gluon.jit
def _once_tile(x_desc, y_desc, z_desc, k_desc, dc_desc, dx_desc, keep, ring, bar_keep, bars,
               B_vec, I_vec, A_vec, KDK, pid_kv, c, bh, g_base, NC, scale,
               HAS_DC_LAST: gl.constexpr, L: gl.constexpr, B: gl.constexpr,
               N_RED: gl.constexpr, N_OUT: gl.constexpr, NBUF: gl.constexpr,
               OUT_K: gl.constexpr, num_warps: gl.constexpr):
    # one program of _dkv_once_gluon_kernel, _dkv_once_tile's roles: dK (OUT_K; X = V,
    # Y = dH̃, Z = Q, N_RED d_hv blocks, N_OUT d_qk blocks) or dV (X = K, Y = Q, Z = dH̃)
    s0 = c * L + pid_kv * B
    dc_row = bh * (NC + 1) + c + 1
    n_q = L // B - pid_kv                           # query tiles on or after the diagonal
    inter = (c < NC - 1 + HAS_DC_LAST).to(gl.int32)  # dC_k loaded (else dC_N = 0)
    T = N_RED * n_q + N_OUT * (N_RED * inter + n_q + OUT_K)

    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, B, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    # the tile's X blocks; the ring's first tiles
    mbarrier.expect(bar_keep, N_RED * x_desc.block_type.nbytes)
    for rb in gl.static_range(N_RED):
        tma.async_copy_global_to_shared(x_desc, [bh, s0, rb * B], bar_keep, keep.index(rb))
    for i in gl.static_range(NBUF):
        if i < T:
            _issue(i, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring,
                   bars, L, B, NBUF, N_RED, OUT_K)
    # per key/value row: b, ī (-inf beyond S), ā = exp(a)
    s_loc = pid_kv * B + gl.arange(0, B, layout=gl.SliceLayout(1, acc_layout))
    b_kv = gl.load(B_vec + g_base + s_loc)
    i_kv = gl.load(I_vec + g_base + s_loc)
    a_bar = gl.exp(gl.load(A_vec + g_base + s_loc))
    mbarrier.wait(bar_keep, 0)

    # S of the last query tile, then (key/value tile 0) of query tile 0, gated and rounded
    t = 0
    st = gl.zeros((B, B), dtype=gl.float32, layout=acc_layout)
    for rb in range(N_RED):
        st = _times_ring(st, keep.index(rb).reshape([B, B]), t, ring, bars, B, NBUF, True)
        t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring,
                  bars, L, B, NBUF, N_RED, OUT_K)
    st_last = _gated(st, L // B - 1, s_loc, b_kv, i_kv, B_vec, g_base, scale, z_desc.dtype,
                     op_layout, B)
    st_0 = gl.zeros((B, B), dtype=z_desc.dtype, layout=op_layout)
    if n_q == 2:
        st = gl.zeros((B, B), dtype=gl.float32, layout=acc_layout)
        for rb in range(N_RED):
            st = _times_ring(st, keep.index(rb).reshape([B, B]), t, ring, bars, B, NBUF, True)
            t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc,
                      ring, bars, L, B, NBUF, N_RED, OUT_K)
        st_0 = _gated(st, 0, s_loc, b_kv, i_kv, B_vec, g_base, scale, z_desc.dtype, op_layout,
                      B)

    # per output block: ā ⊙ (X dC_k), then S_0 Z_0 and S_last Z_last
    rowsum = gl.zeros((B,), dtype=gl.float32, layout=gl.SliceLayout(1, acc_layout))
    for ob in range(N_OUT):
        acc = gl.zeros((B, B), dtype=gl.float32, layout=acc_layout)
        if inter == 1:
            for rb in range(N_RED):
                acc = _times_ring(acc, keep.index(rb).reshape([B, B]), t, ring, bars, B, NBUF,
                                  OUT_K)
                t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc,
                          dc_desc, ring, bars, L, B, NBUF, N_RED, OUT_K)
        acc = acc * a_bar[:, None]
        if n_q == 2:
            acc = _times_ring(acc, st_0, t, ring, bars, B, NBUF, False)
            t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc,
                      ring, bars, L, B, NBUF, N_RED, OUT_K)
        acc = _times_ring(acc, st_last, t, ring, bars, B, NBUF, False)
        t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc, ring,
                  bars, L, B, NBUF, N_RED, OUT_K)
        if OUT_K:
            # the row sums k·dk from K's block ob, then dK's block leaves through its buffer
            slot = t % NBUF
            mbarrier.wait(bars.index(slot), (t // NBUF) & 1)
            k_blk = ring.index(slot).reshape([B, B])
            rowsum += gl.sum(k_blk.load(acc_layout).to(gl.float32) * acc, axis=1)
            k_blk.store(acc.to(dx_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dx_desc, [bh, s0, ob * B], ring.index(slot))
            if t + NBUF < T:                        # the slot loads again
                tma.store_wait(pendings=0)
            t = _next(t, T, n_q, inter, bh, c, s0, dc_row, y_desc, z_desc, k_desc, dc_desc,
                      ring, bars, L, B, NBUF, N_RED, OUT_K)
        else:
            # dV's block leaves through one of two staging buffers behind the K tile
            if ob >= 2:
                tma.store_wait(pendings=1)
            out = keep.index(N_RED + ob % 2)
            out.reshape([B, B]).store(acc.to(dx_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dx_desc, [bh, s0, ob * B], out)
    if OUT_K:
        gl.store(KDK + g_base + s_loc, rowsum)
    tma.store_wait(pendings=0)


# NC not specialised: NC = 1 as a constant (no dC_last) would fold the inter-chunk loads away
@gluon.jit(do_not_specialize=["NC"])
def _dkv_once_gluon_kernel(q_desc, k_desc, v_desc, dh_desc, dc_desc, dk_desc, dv_desc, B_vec,
                           I_vec, A_vec, KDK, NC, scale, HAS_DC_LAST: gl.constexpr,
                           L: gl.constexpr, B: gl.constexpr, N_QK: gl.constexpr,
                           N_HV: gl.constexpr, N_KEEP: gl.constexpr, NBUF: gl.constexpr,
                           num_warps: gl.constexpr):
    # 1-D grid as _dkv_once_kernel's (chunk_tile_pid(pid, 2, L // B, NC)): role (dK, dV)
    # fastest, then the key/value tile, then chunk·b·head
    role, pid_kv, c, bh, g_base = _tile_pid(L, B, NC, 2)

    keep = gl.allocate_shared_memory(v_desc.dtype, [N_KEEP] + v_desc.block_type.shape,
                                     v_desc.layout)
    ring = gl.allocate_shared_memory(v_desc.dtype, [NBUF] + v_desc.block_type.shape,
                                     v_desc.layout)
    bar_keep = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_keep, count=1)
    bars = _ring_barriers(NBUF)
    if role == 0:
        _once_tile(v_desc, dh_desc, q_desc, k_desc, dc_desc, dk_desc, keep, ring, bar_keep,
                   bars, B_vec, I_vec, A_vec, KDK, pid_kv, c, bh, g_base, NC, scale,
                   HAS_DC_LAST, L, B, N_HV, N_QK, NBUF, 1, num_warps)
    else:
        _once_tile(k_desc, q_desc, dh_desc, k_desc, dc_desc, dv_desc, keep, ring, bar_keep,
                   bars, B_vec, I_vec, A_vec, KDK, pid_kv, c, bh, g_base, NC, scale,
                   HAS_DC_LAST, L, B, N_QK, N_HV, NBUF, 0, num_warps)
    mbarrier.invalidate(bar_keep)
    _invalidate_ring(bars, NBUF)


def applies_dkv_once(cfg: dict, q, k, v, dC_st, dh, *, L: int, is_exp: bool,
                     normalize: bool) -> bool:
    """Whether :func:`parallel_bw_dkv_once_gluon` may replace ``_dkv_once_kernel``:
    mLSTMsig without the normaliser, one 16-bit dtype for q, k, v, dh and dC_st, L 256,
    d_qk 256, d_hv 512, ``bw_config``'s ONCE_DKV (rule B10) in its L-256 tiles (DKV_B_LQ,
    DKV_B_LKV, DKV_B_DQK, DKV_B_DHV 128, 8 warps) with its ``GLUON`` flag on, contiguous
    16-byte aligned rows (TMA), Triton compiling for an sm_90 target."""
    if is_exp or normalize or L != L_ONCE or not (cfg.get("GLUON") and cfg.get("ONCE_DKV")):
        return False
    if cfg.get("FUSED_DKV"):
        return False
    if q.shape[-1] != D_QK or k.shape[-1] != D_QK or v.shape[-1] != D_HV or dh.shape[-1] != D_HV:
        return False
    tiles = tuple(cfg[key] for key in ("DKV_B_LQ", "DKV_B_LKV", "DKV_B_DQK", "DKV_B_DHV"))
    if tiles != (B_T,) * 4 or cfg["DKV_num_warps"] != NUM_WARPS:
        return False
    if tuple(dC_st.shape[-2:]) != (D_QK, D_HV) or not dC_st.is_contiguous():
        return False
    return gluon_takes(q, k, v, dh, dC_st, blocks=(B_T, B_T, B_T))


def parallel_bw_dkv_once_gluon(q, k, v, b_vec, i_vec, a_vec, dC_st, dh, *, L: int,
                               has_dc_last: bool):
    """(dk, dv in q's dtype, the fp32 row sums k·dk (BNH, N_c·L)) as ``_dkv_once_kernel``
    computes them under rule B10 at L 256 (where :func:`applies_dkv_once`).

    q, k (BNH, S, 256), v, dh (BNH, S, 512) contiguous, one 16-bit dtype; b_vec, i_vec,
    a_vec (BNH, N_c·L) fp32 (the gate kernel's b, ī and a; ī -inf beyond S); dC_st
    (BNH, N_c+1, 256, 512) in q's dtype (dC_k at index k, read as the (BNH·(N_c+1), 256, 512)
    view); ``has_dc_last`` False: dC_N = 0 and the last chunk's inter-chunk loads are
    skipped (its term ā ⊙ 0 is kept). Scale d_qk ** -0.5; no normaliser (paper eqs. 22-23).
    """
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    kdk = torch.empty((BNH, NC * L), device=q.device, dtype=torch.float32)
    blk = [1, B_T, B_T]
    launch(
        _dkv_once_gluon_kernel, (2 * (L // B_T) * NC * BNH,), gluon_descriptor(q, blk), gluon_descriptor(k, blk), gluon_descriptor(v, blk),
        gluon_descriptor(dh, blk), gluon_descriptor(dC_st.view(-1, d_qk, d_hv), blk),
        gluon_descriptor(dk, blk), gluon_descriptor(dv, blk),
        b_vec, i_vec, a_vec, kdk, NC, d_qk ** -0.5,
        HAS_DC_LAST=has_dc_last, L=L, B=B_T, N_QK=d_qk // B_T, N_HV=d_hv // B_T,
        N_KEEP=N_KEEP, NBUF=NBUF, num_warps=NUM_WARPS)
    return dk, dv, kdk
