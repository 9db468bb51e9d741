"""Chunkwise mLSTM reference: the form every TFLA kernel implements (docs/tfla-kernels.md 2.4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as Fn

from tfla.checks import check_chunk_size
from tfla.reference._common import log_gates, pack_last_state, prepare


def mlstm_chunkwise(q, k, v, i, f, *, variant="sig", chunk_size=64, normalize=None, eps=1e-6,
                    initial_state=None, return_last_state=False, detach_normalizer=True):
    """mLSTM in chunkwise form: inter-chunk state recurrence plus parallel intra-chunk part.

    Paper Sec. 3 / App. B (eqs. 9-11 chunk gates, 39-43 recurrence, 44-56 intra and
    combination), docs/tfla-kernels.md 2.4. Any chunk_size >= 1; S need not be a multiple
    of it: the last chunk is padded with neutral steps (q = k = v = 0, f̄ = 0, ī = -inf;
    docs/tfla-tiling.md 4.7). Other arguments, returns and errors as
    :func:`tfla.reference.mlstm_recurrent`; also raises ValueError for a chunk_size that is not an
    int >= 1.
    """
    dims, out_dtype, cd, normalize, eps, (q, k, v, i, f), (C, n, m), _ = prepare(
        q, k, v, i, f, variant=variant, normalize=normalize, eps=eps, initial_state=initial_state)
    check_chunk_size(chunk_size, minimum=1)
    B, NH, S, d_qk, d_hv = dims
    L = chunk_size
    Nc = math.ceil(S / L)
    pad = Nc * L - S
    scale = d_qk ** -0.5
    ig, logf = log_gates(i, f, variant)
    if pad:
        q = Fn.pad(q, (0, 0, 0, pad))
        k = Fn.pad(k, (0, 0, 0, pad))
        v = Fn.pad(v, (0, 0, 0, pad))
        logf = Fn.pad(logf, (0, pad), value=0.0)
        ig = Fn.pad(ig, (0, pad), value=float("-inf"))
    q = q.reshape(B, NH, Nc, L, d_qk) * scale
    k = k.reshape(B, NH, Nc, L, d_qk)
    v = v.reshape(B, NH, Nc, L, d_hv)
    logf = logf.reshape(B, NH, Nc, L)
    ig = ig.reshape(B, NH, Nc, L)

    b = torch.cumsum(logf, dim=-1)                                  # inclusive
    g = b[..., -1]                                                  # (B, NH, Nc)
    shifted = torch.cat([logf[..., 1:], torch.zeros_like(logf[..., :1])], dim=-1)
    a = torch.flip(torch.cumsum(torch.flip(shifted, (-1,)), dim=-1), (-1,)) + ig  # exclusive rev

    # inter-chunk recurrence: states before each chunk
    C_prev, n_prev, m_prev = [], [], []
    for c in range(Nc):
        C_prev.append(C)
        n_prev.append(n)
        m_prev.append(m)
        if variant == "exp":
            m_new = torch.maximum(g[..., c] + m, a[..., c, :].max(dim=-1).values)
            if detach_normalizer:
                m_new = m_new.detach()
            gbar = torch.exp(g[..., c] + m - m_new)
            abar = torch.exp(a[..., c, :] - m_new[..., None])
            m = m_new
        else:
            gbar = torch.exp(g[..., c])
            abar = torch.exp(a[..., c, :])
        Kbar = abar[..., None] * k[..., c, :, :]
        C = gbar[..., None, None] * C + Kbar.transpose(-1, -2) @ v[..., c, :, :]
        n = gbar[..., None] * n + Kbar.sum(dim=-2)
    C_prev = torch.stack(C_prev, dim=2)                             # (B, NH, Nc, d_qk, d_hv)
    n_prev = torch.stack(n_prev, dim=2)                             # (B, NH, Nc, d_qk)
    m_prev = torch.stack(m_prev, dim=2)                             # (B, NH, Nc)

    # intra-chunk decay matrix D̃_rs = sum_{s < u <= r} f̄_u + ī_s for s <= r
    r_idx = torch.arange(L, device=q.device)
    below = r_idx[:, None] > r_idx[None, :]
    causal = r_idx[:, None] >= r_idx[None, :]
    zero = torch.zeros((), dtype=cd, device=q.device)
    neg_inf = torch.tensor(float("-inf"), dtype=cd, device=q.device)
    Floc = torch.cumsum(torch.where(below, logf[..., :, None], zero), dim=-2)
    Dt = torch.where(causal, Floc + ig[..., None, :], neg_inf)     # (B, NH, Nc, L, L)
    if variant == "exp":
        m_intra = Dt.max(dim=-1).values
        m_comb = torch.maximum(b + m_prev[..., None], m_intra)
        if detach_normalizer:
            m_comb = m_comb.detach()
        D = torch.exp(Dt - m_comb[..., None])
        bbar = torch.exp(b + m_prev[..., None] - m_comb)
    else:
        m_comb = None
        D = torch.exp(Dt)
        bbar = torch.exp(b)
    Sbar = (q @ k.transpose(-1, -2)) * D
    Qbar = bbar[..., None] * q
    num = Qbar @ C_prev + Sbar @ v
    if normalize:
        den = (Qbar * n_prev[..., None, :]).sum(-1) + Sbar.sum(-1)
        floor = torch.exp(-m_comb) if variant == "exp" else torch.ones_like(den)
        n_out = torch.maximum(den.abs(), floor)
        if detach_normalizer:
            n_out = n_out.detach()
        num = num / (n_out + eps)[..., None]
    h = num.reshape(B, NH, Nc * L, d_hv)[:, :, :S].to(out_dtype)
    if return_last_state:
        return h, pack_last_state(C, n, m, variant)
    return h
