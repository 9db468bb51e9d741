"""mLSTMsig: the mLSTM with sigmoid input gate, TFLA ``xl_chunk`` kernels (public function).

Paper: Beck, Poeppel, Lippe, Hochreiter, "Tiled Flash Linear Attention", NeurIPS 2025,
Sec. 3 (chunkwise form), Sec. 4 (TFLA tiling), Sec. 4.2 / eqs. 22-23 (mLSTMsig).
Conventions (scale, gates, states, gradients): docs/tfla-kernels.md Section 1.
Kernel design and measurements: docs/kernels-sig-notes.md.
"""

from __future__ import annotations

import torch

from tfla.checks import (check_choice, check_chunk_size, check_initial_state, check_kernel_dtype,
                         check_qkvif)

__all__ = ["mlstm_sig"]

EPS = 1e-6
MAX_HEAD_DIM = 1024


def mlstm_sig(q, k, v, i, f, *, chunk_size=128, algorithm="xl_chunk", normalize=False,
              initial_state=None, return_last_state=False):
    """mLSTMsig cell output h̃ for a whole sequence (differentiable).

    Computes, per (batch, head) and step t (docs/tfla-kernels.md 2.2, paper eqs. 22-23):
    C_t = σ(f̃_t) C_{t-1} + σ(ĩ_t) k_t v_tᵀ, h_t = C_tᵀ q_t / sqrt(d_qk); with
    ``normalize=True`` also n_t = σ(f̃_t) n_{t-1} + σ(ĩ_t) k_t and
    h_t = C_tᵀ q̂_t / (max(|n_tᵀ q̂_t|, 1) + 1e-6). It is evaluated in the chunkwise form
    (Sec. 3) with chunk size L = ``chunk_size``, by the paper's two-level TFLA Triton kernels
    (shared with mLSTMexp); ``TFLA_SIG_IMPL=walk`` forces the forward-only "walk" that keeps
    the chunk recurrence on chip, kept as the measured baseline
    (``tfla.triton.common.choose_sig_impl``, docs/kernels-sig-notes.md).

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); bfloat16, float16 or float32 on CUDA
            (any floating dtype on the CPU); any S >= 1, 1 <= d_qk, d_hv <= 1024.
        i, f: (B, NH, S) input- and forget-gate pre-activations (float32 recommended).
        chunk_size: L, a power of two >= 16 (need not divide S).
        algorithm: "xl_chunk" (these kernels) or "limit_chunk" (tfla.limit_chunk).
        normalize: divide by the normaliser (the peer's default); False is the paper's mLSTMsig.
        initial_state: None, C0 (B, NH, d_qk, d_hv), or (C0, n0[, m0]); m0 is ignored.
        return_last_state: also return (C_S (B, NH, d_qk, d_hv), n_S (B, NH, d_qk)), float32.

    Returns:
        h (B, NH, S, d_hv) in q's dtype, or (h, (C_S, n_S)).

    Gradients (docs 1.5): dq, dk, dv (q's dtype), di, df (their dtypes), dC0; n_out is a
    constant of the backward; a gradient on C_S enters all of them (df with ⟨dC_S, C_S⟩).
    Calls that need gradients always run the tiled kernels (the walk has no backward).

    Device: CUDA tensors run the Triton kernels; CPU tensors run
    :func:`tfla.reference.mlstm_chunkwise`, or the Triton kernels in Triton's interpreter
    when the environment has TRITON_INTERPRET=1.

    Raises:
        ValueError: bad shapes, ranks, dtypes or devices (tfla.checks), a chunk_size that is
            not a power of two >= 16, an unknown algorithm, a head dimension above 1024;
            TFLA_SIG_IMPL not "tiled"/"walk", or "walk" forced on a call that needs gradients.
    """
    check_choice("algorithm", algorithm, ("xl_chunk", "limit_chunk"))
    if algorithm == "limit_chunk":
        from tfla.limit_chunk import mlstm_limit_chunk

        return mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=chunk_size,
                                 normalize=normalize, initial_state=initial_state,
                                 return_last_state=return_last_state)
    dims = check_qkvif(q, k, v, i, f)
    check_chunk_size(chunk_size, minimum=16, power_of_two=True)
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize: got {normalize!r}; allowed: True or False")
    if not isinstance(return_last_state, bool):
        raise ValueError(f"return_last_state: got {return_last_state!r}; allowed: True or False")
    C0, n0, _ = check_initial_state(initial_state, dims, q.device, variant="sig")
    for name, d in (("d_qk", dims.d_qk), ("d_hv", dims.d_hv)):
        if d > MAX_HEAD_DIM:
            raise ValueError(f"q/v: got {name}={d}; allowed: 1 <= {name} <= {MAX_HEAD_DIM}")

    from tfla.triton.common import _fix_interpreter_index, interpret_mode

    if q.device.type != "cuda" and not interpret_mode():
        from tfla.reference import mlstm_chunkwise

        return mlstm_chunkwise(q, k, v, i, f, variant="sig", chunk_size=chunk_size,
                               normalize=normalize, eps=EPS, initial_state=initial_state,
                               return_last_state=return_last_state)
    check_kernel_dtype(q)
    from tfla.triton.common import IMPL_ENV, choose_sig_impl

    B, NH, S, d_qk = q.shape
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, i, f, C0))
    impl = choose_sig_impl(B, NH, S, d_qk, v.shape[-1], chunk_size, q.dtype, q.device, needs_grad)
    if impl == "tiled":
        from tfla.triton.chunkwise import Config, effective_chunk, run

        cfg = Config.make(variant="sig", normalize=normalize, eps=EPS,
                          L=effective_chunk(S, chunk_size), limit=False)
        return run(q, k, v, i, f, C0, n0, None, cfg, return_last_state)
    if needs_grad:
        raise ValueError(f"{IMPL_ENV}=walk: the walk is a forward-only algorithm (no backward); "
                         "unset it, or call under torch.no_grad()")
    if interpret_mode():
        _fix_interpreter_index()
    h, C_S, n_S = _walk_forward(q, k, v, i, f, C0, n0, chunk_size, normalize, return_last_state)
    if return_last_state:
        return h, (C_S, n_S)
    return h


def _dot_settings(dtype):
    """(operand dtype of tl.dot, input_precision). fp32 inputs: "tf32x3" (three TF32 products,
    close to fp32 accuracy; plain TF32 costs ~1e-3, docs/tfla-kernels.md 4.10, and "ieee"
    compiles to scalar FMAs that take minutes to build). Triton 3.6's CPU interpreter
    multiplies bfloat16 operands wrongly (numpy has no bfloat16), so there bf16 operands are
    multiplied in fp32."""
    from tfla.triton.common import interpret_mode, tl_dtype

    if dtype == torch.bfloat16 and interpret_mode():
        return tl_dtype(torch.float32), "ieee"
    return tl_dtype(dtype), ("tf32x3" if dtype == torch.float32 else "tf32")


def _walk_forward(q, k, v, i, f, C0, n0, L, normalize, return_last):
    """The walk's forward (no backward: :func:`choose_sig_impl` takes it only for calls that
    need no gradient): gate prep, segment states where the grid is small, then one program
    per (d_hv block, segment, b·head) walks its chunks with C on chip
    (tfla/triton/sig_walk_fwd.py). Returns h (B, NH, S, d_hv), C_S, n_S (float32; None
    unless ``return_last``)."""
    from tfla.triton.common import choose_config, sig_gate_prep
    from tfla.triton.sig_walk_fwd import walk_forward
    from tfla.triton.sig_walk_segments import walk_segment_states

    B, NH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    BH = B * NH
    q3 = q.reshape(BH, S, d_qk).contiguous()
    k3 = k.reshape(BH, S, d_qk).contiguous()
    v3 = v.reshape(BH, S, d_hv).contiguous()
    i2 = i.reshape(BH, S).contiguous()
    f2 = f.reshape(BH, S).contiguous()
    dot_dt, dot_prec = _dot_settings(q.dtype)
    cfg = choose_config(B, NH, S, d_qk, d_hv, L, q.dtype, q.device)
    track_n = normalize or return_last
    C0f = C0.reshape(BH, d_qk, d_hv).float().contiguous() if C0 is not None else None
    n0f = n0.reshape(BH, d_qk).float().contiguous() if (n0 is not None and track_n) else None
    gi, gb = sig_gate_prep(i2, f2, L)
    if cfg.n_seg > 1:
        CS, NS = walk_segment_states(k3, v3, i2, f2, C0f, n0f, cfg, with_n=track_n,
                                   dot_dt=dot_dt, dot_prec=dot_prec)
    else:
        CS = C0f.unsqueeze(1) if C0f is not None else None
        NS = None
        if track_n and (C0f is not None or n0f is not None):
            NS = (n0f if n0f is not None else q3.new_zeros((BH, d_qk), dtype=torch.float32)
                  ).unsqueeze(1)
            if CS is None:
                CS = q3.new_zeros((BH, 1, d_qk, d_hv), dtype=torch.float32)
    h, _, (CL, NL) = walk_forward(
        q3, k3, v3, gb, gi, CS, NS, cfg, normalize=normalize, eps=EPS, write_last=return_last,
        track_n=track_n, dot_dt=dot_dt, dot_prec=dot_prec, h_dtype=q.dtype)
    h = h.reshape(B, NH, S, d_hv)
    if return_last:
        return h, CL.reshape(B, NH, d_qk, d_hv), NL.reshape(B, NH, d_qk)
    return h, None, None
