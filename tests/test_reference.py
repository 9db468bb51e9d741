"""The PyTorch references agree with each other in float64 (docs/tfla-verification.md 5.1).

Identities: recurrent == parallel == chunkwise for h and the last state, for both
variants, every chunk size (L > S and L not dividing S included) and several gate regimes;
their autograd gradients (kernel convention: n_out and m detached) agree too, and
satisfy dī = k·dk; two halves with the state passed equal one run; bad input raises
ValueError naming the argument. Tolerances: the float64 differences measured in
docs/tfla-verification.md 5.1 are <= 2e-12 (large input gates); we allow 1e-9 max-normalised.
"""

import pytest
import torch

from tfla.reference import mlstm_chunkwise, mlstm_parallel, mlstm_recurrent

F64 = torch.float64
TOL = 1e-9

from gate_regimes import VERIFICATION_REGIMES as REGIMES
CONFIGS = [("sig", False), ("sig", True), ("exp", None)]


def maxnorm(x, ref):
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def make_inputs(B=2, NH=2, S=37, d_qk=8, d_hv=12, regime="std", seed=0, initial=False,
                requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    im, isd, fm, fsd = REGIMES[regime]
    q = torch.randn(B, NH, S, d_qk, generator=g, dtype=F64)
    k = torch.randn(B, NH, S, d_qk, generator=g, dtype=F64)
    v = torch.randn(B, NH, S, d_hv, generator=g, dtype=F64)
    i = im + isd * torch.randn(B, NH, S, generator=g, dtype=F64)
    f = fm + fsd * torch.randn(B, NH, S, generator=g, dtype=F64)
    xs = [q, k, v, i, f]
    state = None
    if initial:
        state = [torch.randn(B, NH, d_qk, d_hv, generator=g, dtype=F64),
                 torch.randn(B, NH, d_qk, generator=g, dtype=F64).abs(),
                 torch.randn(B, NH, generator=g, dtype=F64)]
    if requires_grad:
        for x in xs:
            x.requires_grad_(True)
        if state is not None:
            state[0].requires_grad_(True)
    return xs, (tuple(state) if state is not None else None)


@pytest.mark.parametrize("variant,normalize", CONFIGS)
@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("initial", [False, True])
def test_recurrent_parallel_chunkwise_agree_on_output_and_last_state(variant, normalize, regime,
                                                                    initial):
    (q, k, v, i, f), state = make_inputs(regime=regime, initial=initial)
    kw = dict(variant=variant, normalize=normalize, eps=0.0, initial_state=state,
              return_last_state=True)
    h_r, s_r = mlstm_recurrent(q, k, v, i, f, **kw)
    h_p, s_p = mlstm_parallel(q, k, v, i, f, **kw)
    assert torch.isfinite(h_r).all()
    assert maxnorm(h_p, h_r) < TOL
    for a, b in zip(s_p, s_r):
        assert maxnorm(a, b) < TOL
    for L in (1, 4, 16, 32, 64):            # 37 is not a multiple of any; 64 > S
        h_c, s_c = mlstm_chunkwise(q, k, v, i, f, chunk_size=L, **kw)
        assert maxnorm(h_c, h_r) < TOL, L
        for a, b in zip(s_c, s_r):
            assert maxnorm(a, b) < TOL, L


@pytest.mark.parametrize("S", [1, 16])
def test_short_sequences_agree(S):
    (q, k, v, i, f), _ = make_inputs(S=S)
    for variant, normalize in CONFIGS:
        h_r = mlstm_recurrent(q, k, v, i, f, variant=variant, normalize=normalize)
        for L in (4, 16, 64):
            h_c = mlstm_chunkwise(q, k, v, i, f, variant=variant, normalize=normalize,
                                  chunk_size=L)
            assert maxnorm(h_c, h_r) < TOL
        assert maxnorm(mlstm_parallel(q, k, v, i, f, variant=variant, normalize=normalize),
                       h_r) < TOL


def _grads(fn, variant, normalize, regime, initial, last_state_loss, **extra):
    (q, k, v, i, f), state = make_inputs(S=21, regime=regime, initial=initial, requires_grad=True,
                                         seed=3)
    g = torch.Generator().manual_seed(7)
    h, last = fn(q, k, v, i, f, variant=variant, normalize=normalize, initial_state=state,
                 return_last_state=True, **extra)
    dh = torch.randn(h.shape, generator=g, dtype=F64)
    loss = (h * dh).sum()
    if last_state_loss:
        dC = torch.randn(last[0].shape, generator=g, dtype=F64)
        loss = loss + (last[0] * dC).sum()
    inputs = [q, k, v, i, f] + ([state[0]] if initial else [])
    return torch.autograd.grad(loss, inputs), (q, k, i)


@pytest.mark.parametrize("variant,normalize", CONFIGS)
@pytest.mark.parametrize("regime", ["std", "strongly_negative_input_gate", "large_positive_input_gate"])
@pytest.mark.parametrize("initial,last_state_loss", [(False, False), (True, True)])
def test_reference_gradients_agree(variant, normalize, regime, initial, last_state_loss):
    args = (variant, normalize, regime, initial, last_state_loss)
    g_r, _ = _grads(mlstm_recurrent, *args)
    g_p, _ = _grads(mlstm_parallel, *args)
    for L in (4, 8, 32):
        g_c, _ = _grads(mlstm_chunkwise, *args, chunk_size=L)
        for name, a, b in zip(["dq", "dk", "dv", "di", "df", "dC0"], g_c, g_r):
            assert maxnorm(a, b) < 1e-8, (name, L)
    for name, a, b in zip(["dq", "dk", "dv", "di", "df", "dC0"], g_p, g_r):
        assert maxnorm(a, b) < 1e-8, name


@pytest.mark.parametrize("variant,normalize", CONFIGS)
def test_input_gate_gradient_equals_k_dot_dk(variant, normalize):
    """dī_t = k_t·dk_t (docs/tfla-kernels.md 3.4); for sig dĩ = dī·σ(−ĩ)."""
    (dq, dk, dv, di, df), (q, k, i) = _grads(mlstm_chunkwise, variant, normalize, "std", False,
                                             False, chunk_size=8)
    dibar = (k * dk).sum(-1)
    expected = dibar * torch.sigmoid(-i) if variant == "sig" else dibar
    assert maxnorm(di, expected.detach()) < 1e-10


def test_detaching_the_normalizer_changes_exp_gradients():
    """Negative control: the convention gradient differs from full autograd (docs/tfla-kernels.md
    1.5)."""
    a, _ = _grads(mlstm_parallel, "exp", None, "std", False, False)
    b, _ = _grads(mlstm_parallel, "exp", None, "std", False, False, detach_normalizer=False)
    assert max(maxnorm(x, y) for x, y in zip(a, b)) > 1e-3


@pytest.mark.parametrize("variant,normalize", CONFIGS)
def test_two_halves_with_state_passed_equal_one_run(variant, normalize):
    (q, k, v, i, f), _ = make_inputs(S=40, regime="wide_input_gate" if variant == "exp" else "std")
    kw = dict(variant=variant, normalize=normalize, chunk_size=8, return_last_state=True)
    h, last = mlstm_chunkwise(q, k, v, i, f, **kw)
    cut = 19
    h1, s1 = mlstm_chunkwise(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], i[:, :, :cut],
                             f[:, :, :cut], **kw)
    h2, s2 = mlstm_chunkwise(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], i[:, :, cut:],
                             f[:, :, cut:], initial_state=s1, **kw)
    assert maxnorm(torch.cat([h1, h2], dim=2), h) < 1e-6      # eps enters through m (docs/tfla-kernels.md 2.5)
    assert maxnorm(s2[0], last[0]) < TOL


def test_low_precision_inputs_return_input_dtype_and_fp32_states():
    (q, k, v, i, f), _ = make_inputs()
    xs = [x.to(torch.bfloat16) for x in (q, k, v)] + [i.float(), f.float()]
    h, (C, n) = mlstm_chunkwise(*xs, chunk_size=16, return_last_state=True)
    assert h.dtype == torch.bfloat16 and C.dtype == torch.float32 and n.dtype == torch.float32
    ref = mlstm_recurrent(*[x.double() for x in xs])
    assert maxnorm(h.double(), ref) < 1e-2


def _base():
    (q, k, v, i, f), _ = make_inputs(S=8)
    return dict(q=q, k=k, v=v, i=i, f=f)


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(2, 2, 8)), r"^q: got rank 3"),
    (dict(k=torch.zeros(2, 2, 8, 9, dtype=F64)), r"^k: got shape \(2, 2, 8, 9\)"),
    (dict(v=torch.zeros(2, 2, 7, 12, dtype=F64)), r"^v: got shape \(2, 2, 7, 12\)"),
    (dict(i=torch.zeros(2, 2, 9, dtype=F64)), r"^i: got shape \(2, 2, 9\)"),
    (dict(f=torch.zeros(2, 2, 8, dtype=torch.int64)), r"^f: got dtype torch.int64.*floating"),
    (dict(k=torch.zeros(2, 2, 8, 8, dtype=torch.float32)), r"^k: got dtype torch.float32"),
    (dict(v=[1.0]), r"^v: got list"),
    (dict(q=torch.zeros(2, 2, 0, 8, dtype=F64)), r"^q: got sequence length S=0"),
    (dict(v=torch.zeros(2, 2, 8, 12, dtype=F64, device="meta")),
     r"^v: got device meta but q is on cpu"),
])
def test_bad_inputs_raise_value_error_naming_the_argument(change, match):
    kw = _base()
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        mlstm_chunkwise(kw["q"], kw["k"], kw["v"], kw["i"], kw["f"], chunk_size=4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(variant="tanh"), r"^variant: got 'tanh'; allowed: 'sig', 'exp'"),
    (dict(variant="exp", normalize=False), r"^normalize: got False with variant='exp'"),
    (dict(chunk_size=0), r"^chunk_size: got 0; allowed: >= 1"),
    (dict(eps=-1.0), r"^eps: got -1.0"),
    (dict(initial_state=(torch.zeros(2, 2, 8, 3, dtype=F64),)), r"^initial_state\[0\]: got shape"),
    (dict(initial_state=(torch.zeros(2, 2, 8, 12, dtype=F64), torch.zeros(2, 2, 5, dtype=F64))),
     r"^initial_state\[1\]: got shape \(2, 2, 5\)"),
    (dict(initial_state="C"), r"^initial_state: got str"),
])
def test_bad_options_raise_value_error_naming_the_argument(kwargs, match):
    kw = _base()
    with pytest.raises(ValueError, match=match):
        mlstm_chunkwise(kw["q"], kw["k"], kw["v"], kw["i"], kw["f"], **{"chunk_size": 4, **kwargs})
