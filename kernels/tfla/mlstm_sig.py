"""mLSTMsig: the mLSTM with sigmoid input gate, TFLA ``xl_chunk`` kernels (public function).

Paper: Beck, Poeppel, Lippe, Hochreiter, "Tiled Flash Linear Attention", NeurIPS 2025,
Sec. 3 (chunkwise form), Sec. 4 (TFLA tiling), Sec. 4.2 / eqs. 22-23 (mLSTMsig).
Conventions (scale, gates, states, gradients): docs/tfla-kernels.md Section 1.
Kernel design, dispatch and tuning rules: docs/kernels.md.
"""

from __future__ import annotations

from tfla.checks import (check_choice, check_chunk_size, check_initial_state, check_kernel_dtype,
                         check_qkvif)

__all__ = ["mlstm_sig"]

EPS = 1e-6
MAX_HEAD_DIM = 1024


def mlstm_sig(q, k, v, i, f, *, chunk_size="auto", algorithm="xl_chunk", normalize=False,
              initial_state=None, return_last_state=False):
    """mLSTMsig cell output h̃ for a whole sequence (differentiable).

    Computes, per (batch, head) and step t (docs/tfla-kernels.md 2.2, paper eqs. 22-23):
    C_t = σ(f̃_t) C_{t-1} + σ(ĩ_t) k_t v_tᵀ, h_t = C_tᵀ q_t / sqrt(d_qk); with
    ``normalize=True`` also n_t = σ(f̃_t) n_{t-1} + σ(ĩ_t) k_t and
    h_t = C_tᵀ q̂_t / (max(|n_tᵀ q̂_t|, 1) + 1e-6). It is evaluated in the chunkwise form
    (Sec. 3) with chunk size L = ``chunk_size``, by the paper's two-level TFLA Triton kernels
    (shared with mLSTMexp, ``tfla/triton/chunkwise*.py``; docs/kernels.md), except
    calls without the normaliser that :func:`tfla.triton.sig_walk_fw.walk_config` takes
    (L 64, 16-bit, d_qk <= 128, d_hv <= 256, 1.2 or more programs per SM): without gradients
    those run a forward walk that keeps the chunk state on chip (measured faster there on the
    H200; same h up to rounding); with gradients and ``chunk_size="auto"`` the walk is the
    forward and stores the chunk states of L 128 for the two-level backward (rule W6).

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); bfloat16, float16 or float32 on CUDA
            (any floating dtype on the CPU); any S >= 1, 1 <= d_qk, d_hv <= 1024.
        i, f: (B, NH, S) input- and forget-gate pre-activations (float32 recommended).
        chunk_size: L, a power of two >= 16 (need not divide S), or "auto" (default): the
            measured rule of :func:`tfla.plan` picks L per mode (gradients or not), head
            dimensions and dtype (docs/kernels.md, "Tuning rules"); ``tfla.plan`` also
            names the algorithm a call runs (the two-level kernels or the forward walk).
        algorithm: "xl_chunk" (these kernels) or "limit_chunk" (tfla.limit_chunk).
        normalize: divide by the normaliser (the peer's default); False is the paper's mLSTMsig.
        initial_state: None, C0 (B, NH, d_qk, d_hv), or (C0, n0[, m0]); m0 is ignored.
        return_last_state: also return (C_S (B, NH, d_qk, d_hv), n_S (B, NH, d_qk)), float32.

    Returns:
        h (B, NH, S, d_hv) in q's dtype, or (h, (C_S, n_S)).

    Gradients (docs/tfla-kernels.md 1.5): dq, dk, dv (q's dtype), di, df (their dtypes), dC0; n_out is a
    constant of the backward; a gradient on C_S enters all of them (df with ⟨dC_S, C_S⟩).

    Device: CUDA tensors run the Triton kernels; CPU tensors run
    :func:`tfla.reference.mlstm_chunkwise`, or the Triton kernels in Triton's interpreter
    when the environment has TRITON_INTERPRET=1.

    Raises:
        ValueError: bad shapes, ranks, dtypes or devices (tfla.checks), a chunk_size that is
            not a power of two >= 16, an unknown algorithm, a head dimension above 1024.
    """
    check_choice("algorithm", algorithm, ("xl_chunk", "limit_chunk"))
    from tfla.plan import resolve_chunk

    dims = check_qkvif(q, k, v, i, f)
    from tfla.ops import apply, kernels_run, needs_grad

    grad = needs_grad(q, k, v, i, f, initial_state)
    if algorithm == "limit_chunk":
        from tfla.limit_chunk import mlstm_limit_chunk

        L = resolve_chunk(chunk_size, "sig", d_qk=dims.d_qk, d_hv=dims.d_hv, grad=grad,
                          dtype=q.dtype, algorithm=algorithm)
        return mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=L,
                                 normalize=normalize, initial_state=initial_state,
                                 return_last_state=return_last_state)
    if chunk_size != "auto":
        check_chunk_size(chunk_size, minimum=16, power_of_two=True)
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize: got {normalize!r}; allowed: True or False")
    if not isinstance(return_last_state, bool):
        raise ValueError(f"return_last_state: got {return_last_state!r}; allowed: True or False")
    C0, n0, _ = check_initial_state(initial_state, dims, q.device, variant="sig")
    for name, d in (("d_qk", dims.d_qk), ("d_hv", dims.d_hv)):
        if d > MAX_HEAD_DIM:
            raise ValueError(f"q/v: got {name}={d}; allowed: 1 <= {name} <= {MAX_HEAD_DIM}")

    if not kernels_run(q):
        from tfla.reference import mlstm_chunkwise

        L = resolve_chunk(chunk_size, "sig", d_qk=dims.d_qk, d_hv=dims.d_hv, grad=grad,
                          dtype=q.dtype)
        return mlstm_chunkwise(q, k, v, i, f, variant="sig", chunk_size=L,
                               normalize=normalize, eps=EPS, initial_state=initial_state,
                               return_last_state=return_last_state)
    check_kernel_dtype(q)
    return apply(q, k, v, i, f, C0, n0, None, variant="sig", chunk_size=chunk_size,
                 algorithm="xl_chunk", normalize=normalize, eps=EPS,
                 return_last=return_last_state, grad=grad)

