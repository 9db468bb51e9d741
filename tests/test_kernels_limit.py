"""limit_chunk Triton kernels (mLSTMexp and mLSTMsig) on the CPU, in triton's interpreter.

Same method as tests/test_kernels_exp.py (float64 reference tfla.reference.mlstm_chunkwise,
convention of docs/tfla-kernels.md 1.5, float32 inputs with a positive q·k component,
tolerances of docs/tfla-verification.md 5.2): h, the last state and dq, dk, dv, di, df, dC0 for both
variants, mLSTMsig with and without the normaliser, every chunk size 16..128, ragged sequences.
"""

from __future__ import annotations

import math

import pytest
import torch

import tfla
from tfla.limit_chunk import mlstm_limit_chunk
from tfla.reference import mlstm_chunkwise

from gate_regimes import VERIFICATION_REGIMES

REGIMES = {name: VERIFICATION_REGIMES[name] for name in (
    "std", "large_positive_input_gate", "strongly_negative_input_gate", "strong_forgetting")}
VARIANTS = [("exp", True), ("sig", False), ("sig", True)]


def make_case(seed, B=1, NH=2, S=45, d_qk=16, d_hv=24, regime="std"):
    g = torch.Generator().manual_seed(seed)
    i_mu, i_sd, f_mu, f_sd = REGIMES[regime]
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q = rn(B, NH, S, d_qk) + 0.6
    k = rn(B, NH, S, d_qk) + 0.6
    v = rn(B, NH, S, d_hv)
    i = rn(B, NH, S) * i_sd + i_mu
    f = rn(B, NH, S) * f_sd + f_mu
    init = (rn(B, NH, d_qk, d_hv), rn(B, NH, d_qk).abs() + 0.5, rn(B, NH))
    return (q, k, v, i, f), init, rn(B, NH, S, d_hv).double(), rn(B, NH, d_qk, d_hv).double()


def run(fn, inputs, init, dh, dC, cast=None):
    """[h, C_last, dq, dk, dv, di, df, dC0] of <h, dh> + <C_last, dC>."""
    xs = [(x.to(cast) if cast else x).detach().clone().requires_grad_(True) for x in inputs]
    st = [(x.to(cast) if cast else x).detach().clone().requires_grad_(True) for x in init]
    h, last = fn(*xs, initial_state=tuple(st), return_last_state=True)
    ((h.double() * dh).sum() + (last[0].double() * dC).sum()).backward()
    return [h, last[0]] + [x.grad for x in xs] + [st[0].grad]


def df_scale(inputs, ref, dC):
    """docs/tfla-verification.md 5.1: max(max|df|, max_t σ(-f̃_t)·[Σ_{u>=t}(|q_u||dq_u| +
    |k_u||dk_u|) + |T|])."""
    q, k, _, _, f = (x.double() for x in inputs)
    per_t = q.norm(dim=-1) * ref[2].norm(dim=-1) + k.norm(dim=-1) * ref[3].norm(dim=-1)
    rev = torch.flip(torch.cumsum(torch.flip(per_t, (-1,)), -1), (-1,))
    T = (ref[1].double() * dC).sum((-2, -1)).abs()[..., None]
    return max(ref[6].abs().max().item(), (torch.sigmoid(-f) * (rev + T)).max().item())


def assert_matches(out, ref, inputs, dC, relF=1e-5, maxnorm=5e-5, df_tol=2e-5):
    names = ("h", "C_last", "dq", "dk", "dv", "di", "df", "dC0")
    bad = {}
    for name, a, r in zip(names, out, ref):
        d = a.double() - r.double()
        if name == "df":
            err = d.abs().max().item() / df_scale(inputs, ref, dC)
            ok = err <= df_tol
        else:
            err = (d.norm() / r.norm()).item(), (d.abs().max() / r.abs().max()).item()
            ok = err[0] <= relF and err[1] <= maxnorm
        if not ok or not all(math.isfinite(e) for e in (err if isinstance(err, tuple) else (err,))):
            bad[name] = err
    assert not bad, f"errors above tolerance: {bad}"


def limit(variant, normalize, chunk_size):
    return lambda *a, **kw: mlstm_limit_chunk(*a, variant=variant, normalize=normalize,
                                              chunk_size=chunk_size, **kw)


def reference(variant, normalize):
    return lambda *a, **kw: mlstm_chunkwise(*a, variant=variant, normalize=normalize,
                                            chunk_size=16, **kw)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("variant,normalize", VARIANTS)
def test_limit_chunk_matches_float64_reference(interpret, variant, normalize, regime):
    inputs, init, dh, dC = make_case(1, regime=regime)
    ref = run(reference(variant, normalize), inputs, init, dh, dC, cast=torch.float64)
    out = run(limit(variant, normalize, 16), inputs, init, dh, dC)
    assert_matches(out, ref, inputs, dC)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
@pytest.mark.parametrize("variant,normalize", [("exp", True), ("sig", False)])
def test_limit_chunk_every_chunk_size_on_a_ragged_sequence(interpret, variant, normalize,
                                                          chunk_size):
    inputs, init, dh, dC = make_case(2, NH=1, S=150, d_qk=24, d_hv=40)
    ref = run(reference(variant, normalize), inputs, init, dh, dC, cast=torch.float64)
    out = run(limit(variant, normalize, chunk_size), inputs, init, dh, dC)
    assert_matches(out, ref, inputs, dC)


@pytest.mark.parametrize("chunk_size", [256, 48, 8, 12.0])
def test_limit_chunk_rejects_chunk_sizes_outside_16_to_128(chunk_size):
    (q, k, v, i, f), _, _, _ = make_case(3, S=8)
    with pytest.raises(ValueError, match="chunk_size") as info:
        mlstm_limit_chunk(q, k, v, i, f, chunk_size=chunk_size)
    if chunk_size == 256:
        assert "xl_chunk" in str(info.value)


def test_limit_chunk_rejects_unknown_variant():
    (q, k, v, i, f), _, _, _ = make_case(3, S=8)
    with pytest.raises(ValueError, match="variant"):
        mlstm_limit_chunk(q, k, v, i, f, variant="tanh")


def test_mlstm_sig_limit_chunk_runs_these_kernels(interpret):
    (q, k, v, i, f), init, _, _ = make_case(4, S=40)
    a = tfla.mlstm_sig(q, k, v, i, f, chunk_size=32, algorithm="limit_chunk", normalize=True,
                       initial_state=init[:2])
    b = mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=32, normalize=True,
                          initial_state=init[:2])
    assert torch.equal(a, b)


def test_sig_ignores_the_max_state_of_the_initial_state(interpret):
    (q, k, v, i, f), init, _, _ = make_case(5, S=40)
    with_m = mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=16, initial_state=init)
    without = mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=16,
                                initial_state=init[:2])
    assert torch.equal(with_m, without)


def test_last_state_layout_per_variant(interpret):
    (q, k, v, i, f), _, _, _ = make_case(6, S=20)
    _, exp_state = mlstm_limit_chunk(q, k, v, i, f, variant="exp", return_last_state=True)
    _, sig_state = mlstm_limit_chunk(q, k, v, i, f, variant="sig", return_last_state=True)
    assert [tuple(x.shape) for x in exp_state] == [(1, 2, 16, 24), (1, 2, 16), (1, 2, 1)]
    assert [tuple(x.shape) for x in sig_state] == [(1, 2, 16, 24), (1, 2, 16)]
    _, ref_state = mlstm_chunkwise(q, k, v, i, f, variant="exp", chunk_size=16,
                                   return_last_state=True)
    for a, r in zip(exp_state, ref_state):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_without_interpreter_run_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (q, k, v, i, f), init, _, _ = make_case(7, S=33)
    h = mlstm_limit_chunk(q, k, v, i, f, variant="sig", chunk_size=16, normalize=False,
                          initial_state=init)
    ref = mlstm_chunkwise(q, k, v, i, f, variant="sig", chunk_size=16, normalize=False,
                          initial_state=init)
    assert torch.equal(h, ref)
