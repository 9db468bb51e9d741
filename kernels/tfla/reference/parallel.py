"""Fully parallel, stabilised mLSTM reference (docs/tfla-kernels.md 2.3)."""

from __future__ import annotations

import torch

from tfla.reference._common import log_gates, pack_last_state, prepare


def mlstm_parallel(q, k, v, i, f, *, variant="sig", normalize=None, eps=1e-6,
                   initial_state=None, return_last_state=False, detach_normalizer=True):
    """mLSTM in its fully parallel (attention-like) form, O(S^2) memory.

    Paper Sec. 2 (parallel form, eqs. 5-8) with the initial state as "column 0": the
    decay matrix D̃_tj = F_tj + ī_j (j <= t), D̃_t0 = F_t0 + m_0, m_t = max over the row
    (mLSTMexp), F built as a column cumsum of the masked gate matrix (docs/tfla-kernels.md 2.3).
    Same arguments, returns and errors as :func:`tfla.reference.mlstm_recurrent`.
    """
    dims, out_dtype, cd, normalize, eps, (q, k, v, i, f), (C0, n0, m0), _ = prepare(
        q, k, v, i, f, variant=variant, normalize=normalize, eps=eps, initial_state=initial_state)
    B, NH, S, d_qk, d_hv = dims
    scale = d_qk ** -0.5
    ig, logf = log_gates(i, f, variant)
    t_idx = torch.arange(S, device=q.device)
    below = t_idx[:, None] > t_idx[None, :]          # strictly lower: s > j
    causal = t_idx[:, None] >= t_idx[None, :]        # j <= t
    # F[t, j] = sum_{j < s <= t} logf_s  (column cumsum of the strictly lower gate matrix)
    Fm = torch.cumsum(torch.where(below, logf[..., :, None], torch.zeros((), dtype=cd,
                                                                         device=q.device)), dim=-2)
    F0 = torch.cumsum(logf, dim=-1)                  # F_{t0} = sum_{s <= t} logf_s
    neg_inf = torch.tensor(float("-inf"), dtype=cd, device=q.device)
    Dt = torch.where(causal, Fm + ig[..., None, :], neg_inf)      # (B, NH, S, S)
    if variant == "exp":
        Dt0 = F0 + m0[..., None]
        m = torch.maximum(Dt0, Dt.max(dim=-1).values)
        if detach_normalizer:
            m = m.detach()
        D = torch.exp(Dt - m[..., None])
        D0 = torch.exp(Dt0 - m)
    else:
        m = None
        D = torch.exp(Dt)
        D0 = torch.exp(F0)
    qs = q * scale
    Sbar = (qs @ k.transpose(-1, -2)) * D
    num = Sbar @ v + D0[..., None] * (qs @ C0)
    if normalize:
        den = Sbar.sum(-1) + D0 * (qs * n0[..., None, :]).sum(-1)
        floor = torch.exp(-m) if variant == "exp" else torch.ones_like(den)
        n_out = torch.maximum(den.abs(), floor)
        if detach_normalizer:
            n_out = n_out.detach()
        h = num / (n_out + eps)[..., None]
    else:
        h = num
    h = h.to(out_dtype)
    if not return_last_state:
        return h
    w = D[..., -1, :]                                  # weights of the last row (B, NH, S)
    C_S = torch.einsum("bhj,bhjd,bhje->bhde", w, k, v) + D0[..., -1, None, None] * C0
    n_S = torch.einsum("bhj,bhjd->bhd", w, k) + D0[..., -1, None] * n0
    m_S = m[..., -1] if m is not None else None
    return h, pack_last_state(C_S, n_S, m_S, variant)
