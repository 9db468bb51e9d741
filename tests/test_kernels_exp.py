"""mLSTMexp Triton kernels (xl_chunk, and limit_chunk through tfla.mlstm_exp) on the CPU.

The Triton kernels run in triton's interpreter (TRITON_INTERPRET=1, set per test with
monkeypatch; tfla.triton.chunkwise.kernels() re-imports the kernel modules to match)
and are compared with the float64 PyTorch reference tfla.reference.mlstm_chunkwise on the
same inputs: the output h, the last state (C, n, m) and all gradients (dq, dk, dv, di,
df, dC0) under the convention of docs/tfla-kernels.md 1.5 (normaliser and max states
constant, a gradient on the last C included).

Inputs are float32 (the interpreter's tl.dot is wrong for bfloat16 operands, so bf16 is
checked on the GPU by benchmarks/bench_exp.py). Unless a test says otherwise, q and k
share a positive component (q·k > 0) so that the normaliser |q̂·n| never cancels and the
float32 kernels can be held to ~1e-5 (with random signs some rows are ill-conditioned:
test_random_sign_inputs_are_as_accurate_as_the_float32_reference covers those).
Tolerances: docs/tfla-verification.md 5.2 gives relF <= 1e-5 and max-normalised <= 5e-5 for
an fp32 kernel with exact dots; df is measured against the scale of its summands (5.1).
"""

from __future__ import annotations

import math

import pytest
import torch

import tfla
from tfla.reference import mlstm_chunkwise

from gate_regimes import VERIFICATION_REGIMES as REGIMES
NAMES = ("h", "C_last", "n_last", "m_last", "dq", "dk", "dv", "di", "df", "dC0")


def make_case(seed, B=1, NH=2, S=45, d_qk=16, d_hv=24, regime="std", positive_qk=True,
              dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    i_mu, i_sd, f_mu, f_sd = REGIMES[regime]
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    shift = 0.6 if positive_qk else 0.0
    q = (rn(B, NH, S, d_qk) + shift).to(dtype)
    k = (rn(B, NH, S, d_qk) + shift).to(dtype)
    v = rn(B, NH, S, d_hv).to(dtype)
    i = rn(B, NH, S) * i_sd + i_mu
    f = rn(B, NH, S) * f_sd + f_mu
    init = (rn(B, NH, d_qk, d_hv), rn(B, NH, d_qk).abs() + 0.5, rn(B, NH))
    dh = rn(B, NH, S, d_hv).double()
    dC = rn(B, NH, d_qk, d_hv).double()
    return (q, k, v, i, f), init, dh, dC


def run(fn, inputs, init, dh, dC, *, cast=None):
    """h, last state and gradients of <h, dh> + <C_last, dC> (dC None: no last-state loss)."""
    xs = [(x.to(cast) if cast else x).detach().clone().requires_grad_(True) for x in inputs]
    st = None
    if init is not None:
        st = [(x.to(cast) if cast else x).detach().clone().requires_grad_(True) for x in init]
    h, last = fn(*xs, initial_state=tuple(st) if st else None, return_last_state=True)
    loss = (h.double() * dh).sum()
    if dC is not None:
        loss = loss + (last[0].double() * dC).sum()
    loss.backward()
    out = [h, *last] + [x.grad for x in xs]
    out.append(st[0].grad if st else None)
    return out


def reference(inputs, init, dh, dC, *, variant="exp", normalize=True, dtype=torch.float64):
    return run(lambda *a, **kw: mlstm_chunkwise(*a, variant=variant, chunk_size=16,
                                               normalize=normalize, **kw),
               inputs, init, dh, dC, cast=dtype)


def df_scale(inputs, ref, dC):
    """docs/tfla-verification.md 5.1: max(max|df|, max_t σ(-f̃_t)·[Σ_{u>=t}(|q_u||dq_u| +
    |k_u||dk_u|) + |T|])."""
    q, k, _, _, f = (x.double() for x in inputs)
    dq, dk, df = ref[4].double(), ref[5].double(), ref[8].double()
    per_t = q.norm(dim=-1) * dq.norm(dim=-1) + k.norm(dim=-1) * dk.norm(dim=-1)
    rev = torch.flip(torch.cumsum(torch.flip(per_t, (-1,)), -1), (-1,))
    T = (ref[1].double() * dC).sum((-2, -1)).abs()[..., None] if dC is not None else 0.0
    return max(df.abs().max().item(), (torch.sigmoid(-f) * (rev + T)).max().item())


def errors(out, ref, inputs, dC):
    """name -> (relF, max-normalised) of every output that both have (df: vs its scale)."""
    res = {}
    for name, a, r in zip(NAMES, out, ref):
        if a is None or r is None:
            continue
        d = (a.double() - r.double())
        if name == "df":
            res[name] = (d.norm().item() / r.double().norm().item(),
                         d.abs().max().item() / df_scale(inputs, ref, dC))
        elif name == "m_last" or r.abs().max() == 0:
            res[name] = (d.abs().max().item(), d.abs().max().item())   # absolute
        else:
            res[name] = (d.norm().item() / r.double().norm().item(),
                         d.abs().max().item() / r.double().abs().max().item())
    return res


def assert_close(errs, relF=1e-5, maxnorm=5e-5, df=2e-5):
    bad = {}
    for name, (rf, mx) in errs.items():
        if name == "df":
            ok = mx <= df
        else:
            ok = rf <= relF and mx <= maxnorm
        if not ok or not (math.isfinite(rf) and math.isfinite(mx)):
            bad[name] = (rf, mx)
    assert not bad, f"errors above tolerance: {bad}"


def xl(chunk_size):
    return lambda *a, **kw: tfla.mlstm_exp(*a, chunk_size=chunk_size, **kw)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("chunk_size", [16, 32])
def test_xl_chunk_matches_float64_reference_in_each_gate_regime(interpret, regime, chunk_size):
    inputs, init, dh, dC = make_case(1, regime=regime)
    ref = reference(inputs, init, dh, dC)
    out = run(xl(chunk_size), inputs, init, dh, dC)
    assert_close(errors(out, ref, inputs, dC))


@pytest.mark.parametrize("S,chunk_size,d_qk,d_hv", [
    (100, 128, 80, 72),   # two 64-row tiles per chunk, two d_qk blocks (atomic row sums), ragged
    (70, 32, 24, 40),     # three chunks, the last one ragged
    (1, 16, 16, 16),      # a single step
    (130, 64, 16, 16),    # just past two chunks
])
def test_xl_chunk_handles_ragged_sequences_and_head_dims(interpret, S, chunk_size, d_qk, d_hv):
    inputs, init, dh, dC = make_case(2, S=S, d_qk=d_qk, d_hv=d_hv, NH=1)
    ref = reference(inputs, init, dh, dC)
    out = run(xl(chunk_size), inputs, init, dh, dC)
    assert_close(errors(out, ref, inputs, dC))


def test_xl_chunk_without_initial_state_or_last_state_gradient(interpret):
    inputs, _, dh, _ = make_case(3, S=50)
    ref = reference(inputs, None, dh, None)
    out = run(xl(32), inputs, None, dh, None)
    assert out[-1] is None
    assert_close(errors(out, ref, inputs, None))


def test_chunk_longer_than_the_sequence_gives_the_reference(interpret):
    inputs, init, dh, dC = make_case(4, S=20)
    ref = reference(inputs, init, dh, dC)
    out = run(xl(1024), inputs, init, dh, dC)
    assert_close(errors(out, ref, inputs, dC))


def test_random_sign_inputs_are_as_accurate_as_the_float32_reference(interpret):
    """With random q, k the normaliser cancels on some rows (ill-conditioned h); the kernel
    must then be within a small factor of the float32 PyTorch reference's own error."""
    for regime in ("std", "large_positive_input_gate", "wide_input_gate"):
        inputs, init, dh, dC = make_case(5, regime=regime, positive_qk=False, S=60)
        ref = reference(inputs, init, dh, dC)
        ref32 = reference(inputs, init, dh, dC, dtype=torch.float32)
        out = run(xl(32), inputs, init, dh, dC)
        e_out = errors(out, ref, inputs, dC)
        e_32 = errors(ref32, ref, inputs, dC)
        for name in ("h", "dq", "dk", "dv", "di", "df"):
            budget = 10 * e_32[name][0] + 1e-5
            assert e_out[name][0] <= budget, (regime, name, e_out[name], e_32[name])


def test_limit_chunk_and_xl_chunk_agree(interpret):
    inputs, init, dh, dC = make_case(6, S=90, regime="wide_input_gate")
    lim = run(lambda *a, **kw: tfla.mlstm_exp(*a, chunk_size=32, algorithm="limit_chunk", **kw),
              inputs, init, dh, dC)
    out = run(xl(64), inputs, init, dh, dC)
    assert_close(errors(out, lim, inputs, dC))


def test_last_state_continues_the_sequence(interpret):
    """Two calls with the state passed on equal one call (docs/tfla-kernels.md 1.3)."""
    (q, k, v, i, f), init, _, _ = make_case(7, S=80)
    h, (C, n, m) = tfla.mlstm_exp(q, k, v, i, f, chunk_size=32, initial_state=init,
                                  return_last_state=True)
    h1, st1 = tfla.mlstm_exp(q[:, :, :37], k[:, :, :37], v[:, :, :37], i[:, :, :37], f[:, :, :37],
                             chunk_size=32, initial_state=init, return_last_state=True)
    h2, (C2, n2, m2) = tfla.mlstm_exp(q[:, :, 37:], k[:, :, 37:], v[:, :, 37:], i[:, :, 37:],
                                      f[:, :, 37:], chunk_size=32, initial_state=st1,
                                      return_last_state=True)
    assert m.shape == (1, 2, 1) and C.dtype == torch.float32
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(C2, C, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(n2, n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m2, m, rtol=0, atol=1e-5)


def test_loss_on_the_last_state_alone(interpret):
    """Only C_S enters the loss (dh = 0): dq is zero, and df is dominated by the term
    σ(-f̃_t)·⟨dC_last, C_S⟩ that the peer omits (docs/tfla-kernels.md 3.4, docs/tfla-verification.md
    pitfall 2); all gradients must still match the reference."""
    inputs, init, dh, dC = make_case(8, S=40)
    dh = torch.zeros_like(dh)
    ref = reference(inputs, init, dh, dC)
    out = run(xl(16), inputs, init, dh, dC)
    T_term = torch.sigmoid(-inputs[4].double()) * (ref[1].double() * dC).sum((-2, -1))[..., None]
    assert T_term.abs().max() > 0.1 * ref[8].abs().max()
    assert out[4].abs().max() == 0
    assert_close(errors(out, ref, inputs, dC))


def test_gradients_hold_the_normaliser_constant(interpret):
    """The kernels' gradients are those of the reference with n_out and m detached, not full
    autograd (docs/tfla-kernels.md 1.5, docs/tfla-verification.md pitfall 1): the two differ, and
    ours matches the former."""
    inputs, _, dh, _ = make_case(9, S=30)
    out = run(xl(16), inputs, None, dh, None)
    full = run(lambda *a, **kw: mlstm_chunkwise(*a, variant="exp", chunk_size=16,
                                               detach_normalizer=False, **kw),
               inputs, None, dh, None, cast=torch.float64)
    conv = reference(inputs, None, dh, None)
    diff_full = (out[4].double() - full[4]).abs().max() / full[4].abs().max()
    diff_conv = (out[4].double() - conv[4]).abs().max() / conv[4].abs().max()
    assert diff_full > 1e-3
    assert diff_conv < 5e-5


def test_float16_inputs_give_float16_outputs_and_gradients(interpret):
    inputs, init, dh, dC = make_case(10, S=50, dtype=torch.float16)
    ref = reference(inputs, init, dh, dC)
    out = run(xl(32), inputs, init, dh, dC)
    assert out[0].dtype == torch.float16
    assert [g.dtype for g in out[4:9]] == [torch.float16] * 3 + [torch.float32] * 2
    assert out[1].dtype == torch.float32
    assert_close(errors(out, ref, inputs, dC), relF=5e-3, maxnorm=2e-2, df=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_float16_gates_with_open_input_gates_overflow_only_where_the_true_value_does(
        interpret, dtype):
    """ĩ ~ N(30, 5) in float16 gates, random-sign q, k: the normaliser |q̂·n| nearly cancels in
    some rows (exp(-m) ~ 1e-12 gives it no floor), so true gradients exceed float16's
    65504. Every gate-derived quantity and di, df are computed in float32 and rounded once
    on return: a non-finite value may sit only where the float64 reference, rounded to
    the dtype the tensor is returned in, overflows too, with the same sign."""
    inputs, init, dh, dC = make_case(4, S=200, d_qk=48, d_hv=96,
                                     regime="large_positive_input_gate", positive_qk=False)
    q, k, v, i, f = inputs
    inputs = (q.to(dtype), k.to(dtype), v.to(dtype), i.half(), f.half())
    dh, dC = dh * 64, dC * 64      # a loss 64 times larger: some of di, df, dq, dk past 65504
    ref = reference(inputs, init, dh, dC)
    out = run(xl(128), inputs, init, dh, dC)
    overflow = 0
    for name, a, r in zip(NAMES, out, ref):
        rounded = r.detach().to(a.dtype)
        assert torch.equal(torch.isfinite(a), torch.isfinite(rounded)), name
        assert torch.equal(a[torch.isinf(a)], rounded[torch.isinf(a)]), name
        overflow += int(torch.isinf(rounded).sum())
    assert overflow > 0     # the case reaches float16's range


def test_cpu_tensors_without_interpreter_run_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (q, k, v, i, f), init, _, _ = make_case(11, S=33)
    h = tfla.mlstm_exp(q, k, v, i, f, chunk_size=16, initial_state=init)
    ref = mlstm_chunkwise(q, k, v, i, f, variant="exp", chunk_size=16, initial_state=init)
    assert torch.equal(h, ref)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(algorithm="tiled"), "algorithm"),
    (dict(chunk_size=48), "chunk_size"),
    (dict(chunk_size=8), "chunk_size"),
    (dict(eps=-1.0), "eps"),
    (dict(algorithm="limit_chunk", chunk_size=256), "xl_chunk"),
])
def test_invalid_arguments_raise_value_error(kwargs, needle):
    (q, k, v, i, f), _, _, _ = make_case(12, S=8)
    with pytest.raises(ValueError, match=needle):
        tfla.mlstm_exp(q, k, v, i, f, **kwargs)


def test_mismatched_shapes_raise_value_error():
    (q, k, v, i, f), _, _, _ = make_case(13, S=8)
    with pytest.raises(ValueError, match="k"):
        tfla.mlstm_exp(q, k[:, :, :5], v, i, f)
    with pytest.raises(ValueError, match="initial_state"):
        tfla.mlstm_exp(q, k, v, i, f, initial_state=(torch.zeros(1, 2, 3, 3),))


def test_recurrent_state_blocks_grow_with_the_grid():
    """The recurrent kernels take the largest state blocks that still give half the SMs a
    program (docs/kernels.md, rule S1): Figure-4 sizes on 132 SMs."""
    from tfla.triton.chunkwise_recurrent import state_blocks

    assert state_blocks(128, 256, BNH=128, n_sms=132)[:3] == (128, 128, 8)   # 256 programs
    assert state_blocks(128, 256, BNH=32, n_sms=132)[:3] == (64, 128, 8)     # 64 -> 128
    # 16 programs at 128 x 128; halving the larger side (d_qk on a tie) until >= 66
    assert state_blocks(256, 512, BNH=2, n_sms=132)[:3] == (32, 64, 2)
    assert state_blocks(128, 256, BNH=128, n_sms=132, dtype=torch.float32)[:2] == (64, 64)
    assert state_blocks(80, 24, BNH=1, n_sms=0)[:2] == (128, 32)             # interpreter: no bound
    # shorter steps (limit_chunk L 64) halve both sides: 128 x 128 (64 programs) -> 64 x 64
    assert state_blocks(128, 256, BNH=32, n_sms=132, step=64)[:3] == (64, 64, 4)
    assert state_blocks(128, 256, BNH=64, n_sms=132, step=64)[:2] == (128, 128)
    assert state_blocks(128, 256, BNH=16, n_sms=132, step=64)[:2] == (64, 64)
