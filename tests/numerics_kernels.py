"""Deliberately flawed mLSTMsig kernels for the numerics tests (custom backend,
``function: tests/numerics_kernels.py:<name>``). Each is the float64 reference
(``tfla.reference.mlstm_parallel``, mLSTMsig, normalize False) computed in float32 and
returned in q's dtype, with one flaw."""

from __future__ import annotations

import torch


def _exact(q, k, v, i, f):
    from tfla.reference import mlstm_parallel

    h = mlstm_parallel(q.float(), k.float(), v.float(), i.float(), f.float(), variant="sig",
                       normalize=False, detach_normalizer=True)
    return h


def scaled(q, k, v, i, f, factor=1.0):
    """The exact output times ``factor`` (1.01: a 1 % wrong kernel)."""
    return (_exact(q, k, v, i, f) * factor).to(q.dtype)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


def dk_off(q, k, v, i, f, factor=1.05):
    """Exact output and gradients, except dk times ``factor`` (5 % wrong in dk only)."""
    return _exact(q, _ScaleGrad.apply(k, factor), v, i, f).to(q.dtype)


class _UnstableForgetGrad(torch.autograd.Function):
    """Identity on f; the backward rescales through ~1 / sigma(f)^4.5 and back, in float32:
    exp(-4.5 min(f, 0)) overflows to inf for f < -19.7, and inf / inf = NaN. Exact
    otherwise (the factor is 1 for open gates)."""

    @staticmethod
    def forward(ctx, f):
        ctx.save_for_backward(f)
        return f.view_as(f)

    @staticmethod
    def backward(ctx, g):
        (f,) = ctx.saved_tensors
        f32 = f.float()
        up = torch.exp(-4.5 * f32.clamp(max=0.0))   # overflows when the forget gate is strongly closed
        return ((g.float() * up) / up).to(g.dtype)


def unstable(q, k, v, i, f):
    """Exact forward; the backward of f is NaN where f << -20 (strongly closed forget gates)."""
    return _exact(q, k, v, i, _UnstableForgetGrad.apply(f)).to(q.dtype)


def aborting(q, k, v, i, f):
    """Exact, except that it aborts the process (as a kernel hitting a device assertion)
    when a forget gate is below -15."""
    import os

    if float(f.detach().min()) < -15.0:
        os.abort()
    return _exact(q, k, v, i, f).to(q.dtype)


class _NoisyForgetGrad(torch.autograd.Function):
    """Identity on f; the backward adds ``amplitude * u`` to df, u uniform in [-1, 1]
    (seeded, max |u| = 1 exactly): a kernel whose df carries absolute noise."""

    @staticmethod
    def forward(ctx, f, amplitude, seed):
        ctx.amplitude, ctx.seed = amplitude, seed
        return f.view_as(f)

    @staticmethod
    def backward(ctx, g):
        gen = torch.Generator().manual_seed(ctx.seed)
        u = torch.rand(g.shape, generator=gen, dtype=torch.float64) * 2 - 1
        u = u / u.abs().max()
        return (g.double() + ctx.amplitude * u.to(g.device)).to(g.dtype), None, None


def df_noise(q, k, v, i, f, amplitude=0.0, seed=0):
    """Exact output and gradients, except df plus noise of absolute size ``amplitude``
    (max |noise| = amplitude)."""
    return _exact(q, k, v, i, _NoisyForgetGrad.apply(f, float(amplitude), int(seed))).to(q.dtype)
