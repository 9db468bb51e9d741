"""mLSTMexp (mLSTM with exponential input gate): the public function.

``xl_chunk`` runs our Triton TFLA kernels (two levels of sequence parallelism: over
chunks and over query/key tiles inside a chunk, paper Sec. 3-4); ``limit_chunk`` the
one-level kernels of :mod:`tfla.limit_chunk`.
"""

from __future__ import annotations

from tfla.checks import (check_chunk_size, check_choice, check_eps, check_initial_state,
                         check_kernel_dtype, check_qkvif)

ALGORITHMS = ("xl_chunk", "limit_chunk")


def mlstm_exp(q, k, v, i, f, *, chunk_size="auto", algorithm="xl_chunk", eps=1e-6,
              initial_state=None, return_last_state=False):
    """mLSTM with exponential input gate (mLSTMexp), chunkwise with max-state stabilisation.

    Implements paper eqs. 1-4 (recurrent form) in the chunkwise form of Sec. 3 / App. B
    (eqs. 36-56 forward, 57-78 backward) with the stabilisation of App. D.1, as
    docs/tfla-kernels.md 2.4 and 3 pin it: scale d_qk^-1/2 on the query side,
    h_t = num_t / (max(|q̂_t·n_t|, exp(-m_t)) + eps), states stabilised by m, m_0 = 0.

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); one dtype, float16, bfloat16 or float32
            (tl.dot in that dtype, exact fp32 dots for float32; accumulation, gates and
            states in float32). Any S >= 1; d_qk and d_hv need not be equal or powers of two.
        i, f: (B, NH, S) pre-activations ĩ (used as log input gate ī = ĩ) and f̃ (forget gate
            σ(f̃), used as log σ(f̃)); any float dtype, computed in float32.
        chunk_size: L, a power of two >= 16 (xl_chunk: any such L; limit_chunk: 16..128),
            or "auto" (default): the measured rule of :func:`tfla.plan` (docs/kernels.md,
            "Tuning rules").
        algorithm: "xl_chunk" (TFLA) or "limit_chunk" (one-level baseline).
        eps: added to the normaliser outside the max (docs/tfla-kernels.md 1.2), default 1e-6.
        initial_state: None, C0 or (C0, n0[, m0]): C0 (B, NH, d_qk, d_hv), n0 (B, NH, d_qk),
            m0 (B, NH) or (B, NH, 1), stabilised states as returned by return_last_state.
        return_last_state: also return the state (C, n, m) after step S.

    Returns:
        h (B, NH, S, d_hv) in q's dtype, or (h, (C, n, m)) with C (B, NH, d_qk, d_hv),
        n (B, NH, d_qk), m (B, NH, 1), float32. Gradients (torch autograd) w.r.t. q, k, v,
        i, f and C0 follow docs/tfla-kernels.md 1.5: the normaliser and the max states are
        constants, a gradient on the last C is used, dn0 and dm0 are zeros.

    On CPU tensors this runs :func:`tfla.reference.mlstm_chunkwise` (any float dtype),
    unless TRITON_INTERPRET=1, when the Triton kernels run in the interpreter.

    Raises:
        ValueError: bad shapes, ranks, dtypes or devices (tfla.checks); an unknown
            algorithm; chunk_size not a power of two >= 16 (limit_chunk: > 128); eps < 0
            or not finite; a malformed initial_state.
    """
    check_choice("algorithm", algorithm, ALGORITHMS)
    from tfla.plan import resolve_chunk

    dims = check_qkvif(q, k, v, i, f)
    if algorithm == "limit_chunk":
        from tfla.limit_chunk import mlstm_limit_chunk

        L = resolve_chunk(chunk_size, "exp", d_qk=dims.d_qk, d_hv=dims.d_hv, grad=True,
                          dtype=q.dtype, algorithm=algorithm)
        return mlstm_limit_chunk(q, k, v, i, f, variant="exp", chunk_size=L,
                                 normalize=True, eps=eps, initial_state=initial_state,
                                 return_last_state=return_last_state)
    eps = check_eps(eps)
    if chunk_size != "auto":
        check_chunk_size(chunk_size, minimum=16, power_of_two=True)
    C0, n0, m0 = check_initial_state(initial_state, dims, q.device, variant="exp")
    from tfla.ops import apply, kernels_run, needs_grad

    if not kernels_run(q):
        from tfla.reference import mlstm_chunkwise

        L = resolve_chunk(chunk_size, "exp", d_qk=dims.d_qk, d_hv=dims.d_hv, grad=True,
                          dtype=q.dtype)
        return mlstm_chunkwise(q, k, v, i, f, variant="exp", chunk_size=L, eps=eps,
                               initial_state=initial_state, return_last_state=return_last_state)
    check_kernel_dtype(q)
    return apply(q, k, v, i, f, C0, n0, m0, variant="exp", chunk_size=chunk_size,
                 algorithm="xl_chunk", normalize=True, eps=eps, return_last=return_last_state,
                 grad=needs_grad(q, k, v, i, f, initial_state))
