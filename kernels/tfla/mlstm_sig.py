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
    (Sec. 3) with chunk size L = ``chunk_size``, by TFLA Triton kernels: the paper's two-level
    "tiled" kernels (shared with mLSTMexp) or, where it measured faster, the "walk" that
    keeps the chunk recurrence on chip (``tfla.triton.common.choose_sig_impl``,
    docs/kernels-sig-notes.md).

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

    Device: CUDA tensors run the Triton kernels; CPU tensors run
    :func:`tfla.reference.mlstm_chunkwise`, or the Triton kernels in Triton's interpreter
    when the environment has TRITON_INTERPRET=1.

    Raises:
        ValueError: bad shapes, ranks, dtypes or devices (tfla.checks), a chunk_size that is
            not a power of two >= 16, an unknown algorithm, a head dimension above 1024.
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
    from tfla.triton.common import choose_sig_impl

    B, NH, S, d_qk = q.shape
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, i, f, C0))
    impl = choose_sig_impl(B, NH, S, d_qk, v.shape[-1], chunk_size, q.dtype, q.device, needs_grad)
    if impl == "tiled":
        from tfla.triton.exp_chunkwise import Config, effective_chunk, run

        cfg = Config.make(variant="sig", normalize=normalize, eps=EPS,
                          L=effective_chunk(S, chunk_size), limit=False)
        return run(q, k, v, i, f, C0, n0, None, cfg, return_last_state)
    if interpret_mode():
        _fix_interpreter_index()
    h, C_S, n_S = _MLSTMSigXL.apply(q, k, v, i, f, C0, n0, chunk_size, normalize,
                                    return_last_state)
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


class _MLSTMSigXL(torch.autograd.Function):
    """Forward: gate prep, segment states (if any), fused H kernel. Backward (default
    "chunk", tfla/triton/sig_bwd_chunk.py): chunk states C_{k-1} and dC_k materialised in the
    input dtype by two walks, then chunk-parallel dQ/dK and dV kernels; or ("walk", env
    TFLA_SIG_BWD=walk) segment state gradients and the fused dQ and dK/dV walks. Then the gate
    gradients (docs 3.4)."""

    @staticmethod
    def forward(ctx, q, k, v, i, f, C0, n0, L, normalize, return_last):
        from tfla.triton.common import choose_config, sig_gate_prep
        from tfla.triton.sig_fwd_parallel import sig_fwd_parallel
        from tfla.triton.sig_fwd_recurrent import sig_fwd_recurrent

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
            CS, NS = sig_fwd_recurrent(k3, v3, i2, f2, C0f, n0f, cfg, with_n=track_n,
                                       dot_dt=dot_dt, dot_prec=dot_prec)
        else:
            CS = C0f.unsqueeze(1) if C0f is not None else None
            NS = None
            if track_n and (C0f is not None or n0f is not None):
                NS = (n0f if n0f is not None else q3.new_zeros((BH, d_qk), dtype=torch.float32)
                      ).unsqueeze(1)
                if CS is None:
                    CS = q3.new_zeros((BH, 1, d_qk, d_hv), dtype=torch.float32)
        h, n_out, (CL, NL) = sig_fwd_parallel(
            q3, k3, v3, gb, gi, CS, NS, cfg, normalize=normalize, eps=EPS, write_last=return_last,
            track_n=track_n, dot_dt=dot_dt, dot_prec=dot_prec, h_dtype=q.dtype)
        ctx.save_for_backward(q3, k3, v3, i2, f2, gb, gi, n_out, CS, CL)
        ctx.cfg = cfg
        ctx.meta = (B, NH, S, d_qk, d_hv, normalize, C0 is not None, i.dtype, f.dtype,
                    C0.dtype if C0 is not None else None)
        ctx.set_materialize_grads(False)
        h = h.reshape(B, NH, S, d_hv)
        if return_last:
            return h, CL.reshape(B, NH, d_qk, d_hv), NL.reshape(B, NH, d_qk)
        return h, None, None

    @staticmethod
    def backward(ctx, dh, dC_S, dn_S):
        from tfla.triton.sig_bwd_parallel import sig_bwd_parallel
        from tfla.triton.sig_bwd_recurrent import sig_bwd_recurrent

        q3, k3, v3, i2, f2, gb, gi, n_out, CS, CL = ctx.saved_tensors
        B, NH, S, d_qk, d_hv, normalize, has_C0, i_dtype, f_dtype, C0_dtype = ctx.meta
        cfg = ctx.cfg
        BH = B * NH
        dot_dt, dot_prec = _dot_settings(q3.dtype)
        if dh is None:
            dh3 = q3.new_zeros((BH, S, d_hv))
        else:
            dh3 = dh.reshape(BH, S, d_hv).to(q3.dtype).contiguous()
        dCL = dC_S.reshape(BH, d_qk, d_hv).float().contiguous() if dC_S is not None else None
        if cfg.bwd == "chunk":
            from tfla.triton.sig_bwd_chunk import sig_bwd_chunk

            C0f = CS[:, 0].contiguous() if CS is not None else None
            dq, dk, dv, qdq, kdk, dC0 = sig_bwd_chunk(
                q3, k3, v3, dh3, gb, gi, n_out, C0f, dCL, cfg, normalize=normalize, eps=EPS,
                want_dC0=has_C0 and ctx.needs_input_grad[5], dot_dt=dot_dt, dot_prec=dot_prec)
        elif cfg.n_seg > 1:
            DCS = sig_bwd_recurrent(q3, dh3, f2, n_out, dCL, cfg, normalize=normalize, eps=EPS,
                                    dot_dt=dot_dt, dot_prec=dot_prec)
        else:
            DCS = dCL.unsqueeze(1) if dCL is not None else None
        if cfg.bwd != "chunk":
            dq, dk, dv, qdq, kdk, dC0 = sig_bwd_parallel(
                q3, k3, v3, dh3, gb, gi, n_out, CS, DCS, cfg, normalize=normalize, eps=EPS,
                want_dC0=has_C0 and ctx.needs_input_grad[5], dot_dt=dot_dt, dot_prec=dot_prec)
        # gate gradients (docs 3.4): dī = k·dk, df̄_t = Σ_{u>=t}(q·dq − k·dk) + ⟨dC_S, C_S⟩
        # float64 for the sequence-long reverse cumsum (its partial sums are much larger
        # than their differences, docs 3.4); the arrays are only (B*NH, S)
        x = qdq.double() - kdk.double()
        dfbar = torch.flip(torch.cumsum(torch.flip(x, (-1,)), dim=-1), (-1,))
        if dCL is not None:
            dfbar = dfbar + (dCL.double() * CL.double()).sum(dim=(-1, -2))[:, None]
        di = (kdk * torch.sigmoid(-i2.float())).to(i_dtype).reshape(B, NH, S)
        df = (dfbar * torch.sigmoid(-f2.double())).to(f_dtype).reshape(B, NH, S)
        dC0_out = dC0.reshape(B, NH, d_qk, d_hv).to(C0_dtype) if dC0 is not None else None
        return (dq.reshape(B, NH, S, d_qk), dk.reshape(B, NH, S, d_qk), dv.reshape(B, NH, S, d_hv),
                di, df, dC0_out, None, None, None, None)
