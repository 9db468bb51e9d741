"""Recurrent (step-by-step) mLSTM reference: the ground truth of docs/tfla-kernels.md 2.2."""

from __future__ import annotations

import torch

from tfla.reference._common import log_gates, pack_last_state, prepare


def mlstm_recurrent(q, k, v, i, f, *, variant="sig", normalize=None, eps=1e-6,
                    initial_state=None, return_last_state=False, detach_normalizer=True):
    """mLSTM by its recurrence, one time step at a time (paper Sec. 2, eqs. 1-4 / 22-23).

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); i, f: (B, NH, S) gate pre-activations.
            Any floating dtype and device; computed in float64 for float64 inputs, else float32.
        variant: "sig" (mLSTMsig: sigmoid input gate, no max state) or "exp" (mLSTMexp).
        normalize: sig: divide by max(|n·q̂|, 1) + eps (None means False); exp: None or True.
        eps: added to the normaliser outside the max (docs/tfla-kernels.md 1.2).
        initial_state: None, C0, or (C0, n0[, m0]) (docs/tfla-kernels.md 1.3); absent parts
            are zeros (m0 = 0).
        return_last_state: also return (C_S, n_S) (sig) or (C_S, n_S, m_S of shape (B, NH, 1))
            (exp), stabilised, in the compute dtype.
        detach_normalizer: treat n_out and the max state as constants under autograd
            (the kernels' gradient convention, docs/tfla-kernels.md 1.5 / 3.1).

    Returns:
        h (B, NH, S, d_hv) in q's dtype, or (h, last_state).

    Raises:
        ValueError: bad shapes, ranks, dtypes, devices, variant, normalize, eps or
            initial_state (tfla.checks).
    """
    dims, out_dtype, cd, normalize, eps, (q, k, v, i, f), (C, n, m), _ = prepare(
        q, k, v, i, f, variant=variant, normalize=normalize, eps=eps, initial_state=initial_state)
    B, NH, S, d_qk, d_hv = dims
    scale = d_qk ** -0.5
    ig, logf = log_gates(i, f, variant)
    hs = []
    for t in range(S):
        qt = q[:, :, t] * scale
        kt, vt = k[:, :, t], v[:, :, t]
        if variant == "exp":
            m_new = torch.maximum(logf[:, :, t] + m, ig[:, :, t])
            if detach_normalizer:
                m_new = m_new.detach()
            fw = torch.exp(logf[:, :, t] + m - m_new)
            iw = torch.exp(ig[:, :, t] - m_new)
            m = m_new
        else:
            fw = torch.exp(logf[:, :, t])
            iw = torch.exp(ig[:, :, t])
        C = fw[..., None, None] * C + iw[..., None, None] * (kt[..., :, None] * vt[..., None, :])
        n = fw[..., None] * n + iw[..., None] * kt
        num = torch.einsum("bhd,bhde->bhe", qt, C)
        if normalize:
            den = (qt * n).sum(-1)
            floor = torch.exp(-m) if variant == "exp" else torch.ones_like(den)
            n_out = torch.maximum(den.abs(), floor)
            if detach_normalizer:
                n_out = n_out.detach()
            num = num / (n_out + eps)[..., None]
        hs.append(num)
    h = torch.stack(hs, dim=2).to(out_dtype)
    if return_last_state:
        return h, pack_last_state(C, n, m, variant)
    return h
