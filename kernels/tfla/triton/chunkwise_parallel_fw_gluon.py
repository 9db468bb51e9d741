"""The H kernel of mLSTMsig at Figure 5's heads in Gluon (tuning rule H8, docs/kernels.md).

The same products as ``_parallel_fw_kernel`` under rule H7 (L 256, a 128-row query tile
against 64-row key/value tiles, the whole d_qk, d_hv blocks of 256, 8 warps; paper Table 1,
row H; docs/tfla-kernels.md 2.4), in the same order, with the memory traffic scheduled by
hand: Triton 3.6 runs H7's tiles in one pipeline stage (two do not fit shared memory), so
every tile load is waited for before its product. Here the tiles go through TMA into two
key and two value buffers with an mbarrier each, and Hopper's asynchronous warpgroup MMA
(wgmma) runs while the next tiles arrive:

- prologue: Q and the four 64-row d_qk slices of C_{k-1} load at once (the slices into the
  four key/value buffers), Q̄ C_{k-1} is summed slice by slice as they arrive, then the first
  two key and value tiles load into the freed buffers;
- key/value tile j: S = Q K_jᵀ (wgmma from shared memory), the gate matrix in registers
  (mLSTMsig: S · scale · exp(b_r - b_s + ī_s), causal), then H += S̄ V_j (wgmma with S̄ in
  registers) left running while tile j + 1's S is formed; K_{j+2} loads as soon as S_j is
  done, V_{j+1} once H's product with V_{j-1} is;
- H leaves through the Q buffer and a TMA store.

h is the same as ``_parallel_fw_kernel``'s bit for bit (checked on the GPU; the CPU tests
compile it for sm_90, Triton's interpreter cannot run Gluon). Where the rule does not hold
(mLSTMexp, the normaliser, 32-bit inputs, other heads or chunk sizes, tiles a ``Tuning``
overrides, addresses TMA cannot take, Triton's interpreter, a GPU other than sm_90)
``parallel_fw`` runs ``_parallel_fw_kernel``.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from tfla.triton.common import cdiv, gluon_descriptor, gluon_takes, launch

#: the tiles the kernel is written for (rule H7's): query and key/value rows, d_qk, d_hv
#: block, d_qk rows of C_{k-1} per slice, warps
B_LQ, B_LKV, D_QK, B_DHV, B_CS, NUM_WARPS = 128, 64, 256, 256, 64, 8


@gluon.jit
def _parallel_fw_gluon_kernel(q_desc, k_desc, v_desc, c_desc, h_desc, B_vec, I_vec, NC, scale,
                              L: gl.constexpr, B_LQ: gl.constexpr, B_LKV: gl.constexpr,
                              D_QK: gl.constexpr, B_DHV: gl.constexpr, N_DHV: gl.constexpr,
                              B_CS: gl.constexpr, num_warps: gl.constexpr):
    # 1-D grid as _parallel_fw_kernel's: (d_hv block) fastest, then query tile, then
    # chunk·b·head. Descriptors over (BNH, S, d) and C_st's (BNH·(N_c+1), d_qk, d_hv) view:
    # their bounds give zeros past S, d_qk and d_hv and drop the stores there.
    gl.static_assert(B_DHV == D_QK)      # H leaves through the Q buffer
    pid = gl.program_id(0)
    N_Q: gl.constexpr = L // B_LQ
    pid_v = pid % N_DHV
    pid_q = (pid // N_DHV) % N_Q
    cbh = pid // (N_DHV * N_Q)
    c = cbh % NC
    bh = cbh // NC
    S_pad = NC * L
    v0 = pid_v * B_DHV
    r0 = c * L + pid_q * B_LQ
    kv0 = c * L
    g_base = bh.to(gl.int64) * S_pad + c * L

    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, B_DHV, 16])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, B_LKV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    kbuf = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    vbuf = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    bar_q = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bar_k = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    bar_v = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_q, count=1)
    for i in gl.static_range(2):
        mbarrier.init(bar_k.index(i), count=1)
        mbarrier.init(bar_v.index(i), count=1)

    # prologue: Q, and C_{k-1}'s d_qk slices 0, 1 into the key buffers, 2, 3 into the value
    # buffers (each barrier's phase 0)
    c_row = bh * (NC + 1) + c
    mbarrier.expect(bar_q, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh, r0, 0], bar_q, q_smem)
    for i in gl.static_range(2):
        mbarrier.expect(bar_k.index(i), c_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(c_desc, [c_row, i * B_CS, v0], bar_k.index(i),
                                        kbuf.index(i))
        mbarrier.expect(bar_v.index(i), c_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(c_desc, [c_row, (2 + i) * B_CS, v0], bar_v.index(i),
                                        vbuf.index(i))
    rows_a = pid_q * B_LQ + gl.arange(0, B_LQ, layout=gl.SliceLayout(1, acc_layout))
    row_scale = gl.exp(gl.load(B_vec + g_base + rows_a)) * scale          # b̄ · scale
    rows_s = pid_q * B_LQ + gl.arange(0, B_LQ, layout=gl.SliceLayout(1, s_layout))
    b_q = gl.load(B_vec + g_base + rows_s)

    # inter-chunk part Q C_{k-1}, rows scaled by b̄ · scale afterwards
    q2 = q_smem.reshape([B_LQ, D_QK])
    acc = gl.zeros((B_LQ, B_DHV), dtype=gl.float32, layout=acc_layout)
    mbarrier.wait(bar_q, 0)
    for i in gl.static_range(2):
        mbarrier.wait(bar_k.index(i), 0)
        acc = warpgroup_mma(q2.slice(i * B_CS, B_CS, dim=1),
                            kbuf.index(i).reshape([B_CS, B_DHV]), acc, is_async=True)
    for i in gl.static_range(2):
        mbarrier.wait(bar_v.index(i), 0)
        acc = warpgroup_mma(q2.slice((2 + i) * B_CS, B_CS, dim=1),
                            vbuf.index(i).reshape([B_CS, B_DHV]), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    acc = acc * row_scale[:, None]

    # key/value tiles 0 and 1 into the freed buffers (phase 1 of each barrier)
    n_kv = (pid_q + 1) * (B_LQ // B_LKV)
    for i in gl.static_range(2):
        mbarrier.expect(bar_k.index(i), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [bh, kv0 + i * B_LKV, 0], bar_k.index(i),
                                        kbuf.index(i))
        mbarrier.expect(bar_v.index(i), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [bh, kv0 + i * B_LKV, v0], bar_v.index(i),
                                        vbuf.index(i))

    # intra-chunk part over the key/value tiles on or below the diagonal
    for j in range(n_kv):
        st = j % 2
        phase = (1 + j // 2) & 1
        mbarrier.wait(bar_k.index(st), phase)
        s = warpgroup_mma(q2, kbuf.index(st).reshape([B_LKV, D_QK]).permute((1, 0)),
                          gl.zeros((B_LQ, B_LKV), dtype=gl.float32, layout=s_layout),
                          use_acc=False, is_async=True)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
        # S_j done: K_{j+2} into its buffer; H's product with V_{j-1} done: V_{j+1}
        if j + 2 < n_kv:
            mbarrier.expect(bar_k.index(st), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [bh, kv0 + (j + 2) * B_LKV, 0],
                                            bar_k.index(st), kbuf.index(st))
        if j >= 1:
            if j + 1 < n_kv:
                sn = (j + 1) % 2
                mbarrier.expect(bar_v.index(sn), v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(v_desc, [bh, kv0 + (j + 1) * B_LKV, v0],
                                                bar_v.index(sn), vbuf.index(sn))
        cols = j * B_LKV + gl.arange(0, B_LKV, layout=gl.SliceLayout(0, s_layout))
        b_kv = gl.load(B_vec + g_base + cols)
        i_kv = gl.load(I_vec + g_base + cols)                       # ī, -inf beyond S
        d_log = b_q[:, None] - b_kv[None, :] + i_kv[None, :]        # b_r - b_s first
        d_log = gl.where(rows_s[:, None] >= cols[None, :], d_log, float("-inf"))
        s_bar = s * scale * gl.exp(d_log)
        p = gl.convert_layout(s_bar.to(q_desc.dtype), p_layout)
        mbarrier.wait(bar_v.index(st), phase)
        acc = warpgroup_mma(p, vbuf.index(st).reshape([B_LKV, B_DHV]), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.invalidate(bar_q)
    for i in gl.static_range(2):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
    q_smem.reshape([B_LQ, B_DHV]).store(acc.to(h_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(h_desc, [bh, r0, v0], q_smem)
    tma.store_wait(pendings=0)


def applies(cfg: dict, q, k, v, C_st, *, L: int, is_exp: bool, normalize: bool,
            limit: bool) -> bool:
    """Whether ``parallel_fw`` runs :func:`parallel_fw_gluon` (rule H8, docs/kernels.md):
    mLSTMsig without the normaliser, xl_chunk, 16-bit q, k, v (and chunk states), L 256,
    d_qk 256, d_hv > 256, ``fw_config``'s H7 tiles with its ``GLUON`` flag on, 16-byte
    aligned rows (TMA), Triton compiling (not interpreting) for an sm_90 target."""
    if is_exp or normalize or limit or L != 256 or not cfg.get("GLUON"):
        return False
    d_qk, d_hv = q.shape[-1], v.shape[-1]
    if not (d_qk == D_QK and d_hv > 256):
        return False
    if (cfg["B_LQ"], cfg["B_LKV"], cfg["B_DQK"], cfg["B_DHV"], cfg["num_warps"]) != (
            B_LQ, B_LKV, D_QK, B_DHV, NUM_WARPS):
        return False
    return gluon_takes(q, k, v, C_st, blocks=(B_LQ, B_LKV, D_QK, B_DHV))


def parallel_fw_gluon(q, k, v, b_vec, i_vec, C_st, *, L: int) -> torch.Tensor:
    """h (BNH, S, d_hv) in q's dtype: the H kernel under rule H8 (where :func:`applies`).

    q, k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous 16-bit; b_vec, i_vec (BNH, N_c·L) fp32
    (the gate kernel's b and ī, ī -inf beyond S); C_st (BNH, N_c+1, d_qk, d_hv) in q's dtype
    (C_{k-1} at index k). No normaliser (mLSTMsig's default, paper eqs. 22-23).
    """
    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    h = torch.empty((BNH, S, d_hv), device=q.device, dtype=q.dtype)
    n_dhv = cdiv(d_hv, B_DHV)
    grid = (n_dhv * (L // B_LQ) * NC * BNH,)
    launch(
        _parallel_fw_gluon_kernel, grid, gluon_descriptor(q, [1, B_LQ, D_QK]), gluon_descriptor(k, [1, B_LKV, D_QK]),
        gluon_descriptor(v, [1, B_LKV, B_DHV]),
        gluon_descriptor(C_st.view(-1, d_qk, d_hv), [1, B_CS, B_DHV]),
        gluon_descriptor(h, [1, B_LQ, B_DHV]),
        b_vec, i_vec, NC, d_qk ** -0.5,
        L=L, B_LQ=B_LQ, B_LKV=B_LKV, D_QK=D_QK, B_DHV=B_DHV, N_DHV=n_dhv, B_CS=B_CS,
        num_warps=NUM_WARPS)
    return h
