"""The one-level ``limit_chunk`` mLSTM kernels (mLSTMexp and mLSTMsig), forward and backward.

Paper Sec. 5 / App. E ("limit_chunk": one level of sequence parallelism over chunks, the
FLA-style baseline), docs/tfla-tiling.md 4.9. The recurrent kernels materialise the
chunk states C_k, n_k, m_k at every chunk boundary; the parallel kernels hold each chunk's
whole L x L gate and score matrices on chip (forward: one program per chunk and d_hv
block; backward: one program per chunk computing dQ, dK and dV). Registers bound L to
16..128; longer chunks need the two-level ``xl_chunk`` kernels.
"""

from __future__ import annotations

from tfla.checks import (check_chunk_size, check_choice, check_eps, check_initial_state,
                         check_kernel_dtype, check_qkvif)

MAX_CHUNK = 128
MIN_CHUNK = 16


def mlstm_limit_chunk(q, k, v, i, f, *, variant="sig", chunk_size=64, normalize=False, eps=1e-6,
                      initial_state=None, return_last_state=False):
    """mLSTM with the one-level limit_chunk kernels.

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); float16, bfloat16 or float32 (one dtype).
        i, f: (B, NH, S) input- and forget-gate pre-activations ĩ, f̃, any float dtype
            (computed in float32 inside; their gradients come back in their own dtype).
        variant: "sig" (mLSTMsig, paper eqs. 22-23) or "exp" (mLSTMexp, eqs. 1-4 with the
            max-state stabilisation of App. D.1).
        chunk_size: L, a power of two from 16 to 128. Sequences shorter than L run with the
            smallest power of two >= max(S, 16) (the result is the same, docs/tfla-kernels.md 2.4).
        normalize: mLSTMsig only: divide by max(|q̂·n|, 1) + eps (the peer's default) or not
            (the paper's mLSTMsig). mLSTMexp always normalises; the flag is ignored there.
        eps: added to the normaliser outside the max (docs/tfla-kernels.md 1.2).
        initial_state: None, C0 or (C0, n0[, m0]) with C0 (B, NH, d_qk, d_hv), n0 (B, NH, d_qk),
            m0 (B, NH) or (B, NH, 1); m0 is ignored for mLSTMsig.
        return_last_state: also return the state after step S.

    Returns:
        h (B, NH, S, d_hv) in the dtype of q; with return_last_state, (h, (C, n, m)) for
        mLSTMexp (C float32 (B, NH, d_qk, d_hv), n (B, NH, d_qk), m (B, NH, 1)) or (h, (C, n))
        for mLSTMsig. Differentiable w.r.t. q, k, v, i, f and C0 with the convention of
        docs/tfla-kernels.md 1.5 (normaliser and max states constant).

    On CPU tensors this runs the PyTorch chunkwise reference, unless TRITON_INTERPRET=1
    (then the Triton kernels in the interpreter).

    Raises:
        ValueError: bad shapes, ranks, dtypes or devices (tfla.checks); variant not
            "sig"/"exp"; chunk_size not a power of two in 16..128 (larger: use xl_chunk);
            eps negative or not finite; a malformed initial_state.
    """
    check_choice("variant", variant, ("sig", "exp"))
    dims = check_qkvif(q, k, v, i, f)
    eps = check_eps(eps)
    L = check_chunk_size(chunk_size, minimum=MIN_CHUNK, power_of_two=True)
    if L > MAX_CHUNK:
        raise ValueError(
            f"chunk_size: got {L}; allowed for algorithm='limit_chunk': a power of two from "
            f"{MIN_CHUNK} to {MAX_CHUNK} (the whole L x L chunk must fit on chip); "
            "use algorithm='xl_chunk' for larger chunks")
    if variant == "sig":
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize: got {normalize!r}; allowed: True or False")
    else:
        normalize = True
    C0, n0, m0 = check_initial_state(initial_state, dims, q.device, variant=variant)
    from tfla.ops import apply, kernels_run, needs_grad

    if not kernels_run(q):
        from tfla.reference import mlstm_chunkwise
        return mlstm_chunkwise(q, k, v, i, f, variant=variant, chunk_size=L,
                               normalize=normalize, eps=eps, initial_state=initial_state,
                               return_last_state=return_last_state)
    check_kernel_dtype(q)
    return apply(q, k, v, i, f, C0, n0, m0, variant=variant, chunk_size=L,
                 algorithm="limit_chunk", normalize=normalize, eps=eps,
                 return_last=return_last_state, grad=needs_grad(q, k, v, i, f, initial_state))
