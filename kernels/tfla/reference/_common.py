"""Helpers shared by the PyTorch references (argument handling, gates, states)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tfla.checks import Dims, check_choice, check_eps, check_initial_state, check_qkvif

VARIANTS = ("sig", "exp")


def prepare(q, k, v, i, f, *, variant, normalize, eps, initial_state):
    """Validate and upcast the inputs of a reference.

    Returns (dims, out_dtype, cd, normalize, eps, (q, k, v, i, f) in the compute dtype,
    (C0, n0, m0) in the compute dtype with zeros where not given, has_initial).
    The compute dtype ``cd`` is float64 for float64 inputs and float32 otherwise.
    """
    check_choice("variant", variant, VARIANTS)
    dims = check_qkvif(q, k, v, i, f)
    if normalize is None:
        normalize = variant == "exp"
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize: got {normalize!r}; allowed: True, False or None")
    if variant == "exp" and not normalize:
        raise ValueError("normalize: got False with variant='exp'; allowed: None or True "
                         "(mLSTMexp always divides by its normaliser)")
    eps = check_eps(eps)
    C0, n0, m0 = check_initial_state(initial_state, dims, q.device, variant=variant)
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, NH, S, d_qk, d_hv = dims
    has_initial = C0 is not None
    C0 = C0.to(cd) if C0 is not None else q.new_zeros((B, NH, d_qk, d_hv), dtype=cd)
    n0 = n0.to(cd) if n0 is not None else q.new_zeros((B, NH, d_qk), dtype=cd)
    m0 = m0.to(cd) if m0 is not None else q.new_zeros((B, NH), dtype=cd)
    tensors = tuple(x.to(cd) for x in (q, k, v, i, f))
    return dims, q.dtype, cd, normalize, eps, tensors, (C0, n0, m0), has_initial


def log_gates(i, f, variant):
    """(log input gate ī, log forget gate f̄), docs/tfla-kernels.md 2.1 (stable log-sigmoid)."""
    logf = F.logsigmoid(f)
    ig = F.logsigmoid(i) if variant == "sig" else i
    return ig, logf


def pack_last_state(C, n, m, variant):
    """Last state as the peer returns it: (C, n) for sig, (C, n, m (B, NH, 1)) for exp."""
    if variant == "sig":
        return (C, n)
    return (C, n, m.unsqueeze(-1))
