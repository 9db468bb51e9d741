"""The mLSTMsig Triton kernels, run in Triton's CPU interpreter, against float64 references.

Every case runs ``tfla.mlstm_sig`` (forward and backward through its registered operators)
with TRITON_INTERPRET=1 and compares h, the last state and all input gradients (dq, dk,
dv, di, df, dC0) with autograd of ``tfla.reference.mlstm_recurrent`` in float64 on the same
(rounded) inputs, including a gradient on the last state. Tolerances: the kernels multiply
fp32 operands exactly in the interpreter, so fp32 errors are round-off (docs/tfla-verification.md
5.2 expects ~1e-6; we allow 2e-5 max-normalised, df 1e-4 against its summand scale); fp16
5e-3; bf16 3e-2 (bf16 operands are multiplied in fp32 there, the rounding of q/k/v and of h
stays).
"""

import os
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"   # read by triton when the kernel modules are imported

import tfla  # noqa: E402
from tfla.reference import mlstm_chunkwise, mlstm_recurrent  # noqa: E402
from tfla.triton.tuning import Tuning, use_tuning  # noqa: E402

from gate_regimes import VERIFICATION_REGIMES  # noqa: E402


pytestmark = pytest.mark.usefixtures("interpret")   # tests/conftest.py


def maxnorm(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def run_case(*, B=1, NH=2, S=45, d_qk=16, d_hv=32, L=16, normalize=False, initial=False,
             dtype=torch.float32, i_mean=0.0, i_std=1.0, f_mean=2.0, f_std=1.5, seed=0,
             last_state_grad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, NH, S, d_qk, generator=g).to(dtype)
    k = torch.randn(B, NH, S, d_qk, generator=g).to(dtype)
    v = torch.randn(B, NH, S, d_hv, generator=g).to(dtype)
    i = i_mean + i_std * torch.randn(B, NH, S, generator=g)
    f = f_mean + f_std * torch.randn(B, NH, S, generator=g)
    state = None
    if initial:
        state = (torch.randn(B, NH, d_qk, d_hv, generator=g),
                 torch.randn(B, NH, d_qk, generator=g).abs())
    xs = [x.clone().requires_grad_(True) for x in (q, k, v, i, f)]
    leaves = xs + ([state[0].clone().requires_grad_(True)] if initial else [])
    init = (leaves[5], state[1]) if initial else None
    h, (C, n) = tfla.mlstm_sig(*xs, chunk_size=L, normalize=normalize, initial_state=init,
                               return_last_state=True)
    dh = torch.randn(h.shape, generator=g)
    dC = torch.randn(C.shape, generator=g) if last_state_grad else torch.zeros(C.shape)
    grads = torch.autograd.grad([h, C], leaves, [dh.to(h.dtype), dC])

    xr = [x.detach().double().requires_grad_() for x in leaves]
    init_r = (xr[5], state[1].double()) if initial else None
    hr, (Cr, nr) = mlstm_recurrent(*xr[:5], variant="sig", normalize=normalize,
                                   initial_state=init_r, return_last_state=True)
    grads_r = torch.autograd.grad([hr, Cr], xr, [dh.double(), dC.double()])
    out = {"h": maxnorm(h, hr.detach()), "C": maxnorm(C, Cr.detach()), "n": maxnorm(n, nr.detach())}
    names = ["dq", "dk", "dv", "di", "df", "dC0"]
    for name, a, b in zip(names, grads, grads_r):
        assert torch.isfinite(a).all(), name
        out[name] = maxnorm(a, b)
    # df against its summand scale (docs/tfla-verification.md 5.1): sigma(-f) * sum_{u>=t}(|q||dq| +
    # |k||dk|) + |T|
    qd = xr[0].detach().norm(dim=-1) * grads_r[0].norm(dim=-1)
    kd = xr[1].detach().norm(dim=-1) * grads_r[1].norm(dim=-1)
    scale = torch.sigmoid(-xr[4].detach()) * (torch.flip(torch.cumsum(torch.flip(qd + kd, (-1,)), -1), (-1,))
                                              + (dC.double() * Cr.detach()).sum((-1, -2))[..., None].abs())
    out["df"] = ((grads[4].double() - grads_r[4]).abs().max() /
                 torch.maximum(grads_r[4].abs().max(), scale.max())).item()
    assert h.dtype == dtype and C.dtype == torch.float32
    return out


def check(errs, tol, tol_df=None):
    bad = {k: v for k, v in errs.items() if not v < (tol_df if k == "df" and tol_df else tol)}
    assert not bad, f"over tolerance {tol}: {bad} (all: {errs})"


@pytest.mark.parametrize("L,S,d_qk,d_hv,normalize,initial", [
    (16, 45, 16, 32, False, False),    # S not a multiple of L, d_qk != d_hv
    (16, 45, 16, 32, True, True),      # normalised, initial state in
    (32, 70, 32, 16, False, True),     # d_qk > d_hv
    (64, 40, 16, 24, True, False),     # L > S, d_hv not a power of two
    (16, 1, 16, 16, False, True),      # S = 1
])
def test_kernels_match_float64_reference(L, S, d_qk, d_hv, normalize, initial):
    check(run_case(L=L, S=S, d_qk=d_qk, d_hv=d_hv, normalize=normalize, initial=initial), 2e-5,
          1e-4)


@pytest.mark.parametrize("fused_dkv", [False, True])
@pytest.mark.parametrize("L,S", [(16, 45), (16, 10)])
def test_backward_skips_zero_and_unneeded_states(fused_dkv, L, S):
    """Rule B6: without C0 and without the last state the backward skips dC_0, dQ's
    inter-chunk product at chunk 0 and dK/dV's at the last chunk (S 10 < L: one chunk, the
    state-gradient walk takes no step); with a C0 that needs no gradient only dC_0 is
    skipped. Every gradient equals the float64 recurrence, and a C0 without requires_grad
    gives the same dq, dk, dv, di, df as one with it."""
    g = torch.Generator().manual_seed(21)
    q, k = torch.randn(2, 1, 2, S, 16, generator=g)
    v = torch.randn(1, 2, S, 32, generator=g)
    i = torch.randn(1, 2, S, generator=g)
    f = 2.0 + torch.randn(1, 2, S, generator=g)
    C0 = torch.randn(1, 2, 16, 32, generator=g)
    n0 = torch.zeros(1, 2, 16)
    dh = torch.randn(1, 2, S, 32, generator=g)
    tuning = Tuning(bw={"FUSED_DKV": fused_dkv})
    for init in (None, "no_grad", "grad"):
        xr = [x.double().requires_grad_() for x in (q, k, v, i, f, C0)]
        state_r = (xr[5], n0.double()) if init else None
        hr = mlstm_recurrent(*xr[:5], variant="sig", initial_state=state_r)
        leaves_r = xr if init == "grad" else xr[:5]
        grads_r = torch.autograd.grad(hr, leaves_r, dh.double())
        xs = [x.clone().requires_grad_() for x in (q, k, v, i, f)]
        c0 = C0.clone().requires_grad_(init == "grad")
        with use_tuning(tuning):
            h = tfla.mlstm_sig(*xs, chunk_size=L, initial_state=(c0, n0) if init else None)
        leaves = xs + ([c0] if init == "grad" else [])
        grads = torch.autograd.grad(h, leaves, dh)
        assert maxnorm(h, hr.detach()) < 2e-5, init
        for name, a, b in zip(("dq", "dk", "dv", "di", "df", "dC0"), grads, grads_r):
            assert torch.isfinite(a).all() and maxnorm(a, b) < 1e-4, (init, name, maxnorm(a, b))
        if init == "no_grad":
            no_grad = grads
        if init == "grad":
            for a, b in zip(no_grad, grads[:5]):
                assert torch.allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("regime", [
    dict(i_mean=-30.0, i_std=5.0),                 # strongly negative input gate
    dict(i_mean=30.0, i_std=5.0),                  # strongly positive input gate
    dict(f_mean=-8.0, f_std=2.0),                  # strong forgetting
    dict(f_mean=8.0, f_std=1.0, i_std=25.0),       # weak forgetting, wide input gate
])
@pytest.mark.parametrize("normalize", [False, True])
def test_kernels_match_reference_in_extreme_gate_regimes(regime, normalize):
    check(run_case(S=40, normalize=normalize, initial=True, **regime), 2e-5, 1e-4)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs(dtype, tol):
    check(run_case(S=40, L=16, dtype=dtype, normalize=True), tol)


def test_state_passed_between_calls_equals_one_call():
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 2, 50, 16, generator=g)
    v = torch.randn(1, 2, 50, 32, generator=g)
    i, f = torch.randn(2, 1, 2, 50, generator=g)
    h, (C, n) = tfla.mlstm_sig(q, k, v, i, f + 2, chunk_size=16, normalize=True,
                               return_last_state=True)
    cut = 23
    sl = lambda x, a, b: x[:, :, a:b]
    h1, s1 = tfla.mlstm_sig(*(sl(x, 0, cut) for x in (q, k, v, i, f + 2)), chunk_size=16,
                            normalize=True, return_last_state=True)
    h2, s2 = tfla.mlstm_sig(*(sl(x, cut, 50) for x in (q, k, v, i, f + 2)), chunk_size=16,
                            normalize=True, initial_state=s1, return_last_state=True)
    assert maxnorm(torch.cat([h1, h2], dim=2), h.double()) < 1e-5
    assert maxnorm(s2[0], C.double()) < 1e-5 and maxnorm(s2[1], n.double()) < 1e-5


def test_cpu_without_interpreter_runs_the_chunkwise_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, 2, 30, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 30, 12, generator=g, dtype=torch.float64)
    i, f = torch.randn(2, 1, 2, 30, generator=g, dtype=torch.float64)
    h = tfla.mlstm_sig(q, k, v, i, f, chunk_size=16)      # float64 is fine on this path
    ref = mlstm_chunkwise(q, k, v, i, f, variant="sig", chunk_size=16, normalize=False)
    assert torch.equal(h, ref)


def test_limit_chunk_dispatches_to_tfla_limit_chunk(monkeypatch):
    calls = []
    fake = type(sys)("tfla.limit_chunk")
    fake.mlstm_limit_chunk = lambda *a, **kw: calls.append((a, kw)) or "sentinel"
    monkeypatch.setitem(sys.modules, "tfla.limit_chunk", fake)
    x = torch.zeros(1, 1, 4, 8)
    out = tfla.mlstm_sig(x, x, x, x[..., 0], x[..., 0], chunk_size=32, algorithm="limit_chunk",
                         normalize=True, return_last_state=True)
    assert out == "sentinel"
    assert calls[0][1] == dict(variant="sig", chunk_size=32, normalize=True, initial_state=None,
                               return_last_state=True)


def _inputs(S=8, d_qk=16, d_hv=16, dtype=torch.float32):
    return (torch.zeros(1, 1, S, d_qk, dtype=dtype), torch.zeros(1, 1, S, d_qk, dtype=dtype),
            torch.zeros(1, 1, S, d_hv, dtype=dtype), torch.zeros(1, 1, S), torch.zeros(1, 1, S))


@pytest.mark.parametrize("kwargs,match", [
    (dict(chunk_size=8), r"^chunk_size: got 8; allowed: >= 16"),
    (dict(chunk_size=48), r"^chunk_size: got 48; allowed: a power of two >= 16"),
    (dict(chunk_size=64.0), r"^chunk_size: got float 64.0"),
    (dict(algorithm="fast"), r"^algorithm: got 'fast'; allowed: 'xl_chunk', 'limit_chunk'"),
    (dict(normalize="yes"), r"^normalize: got 'yes'"),
    (dict(initial_state=torch.zeros(1, 1, 16, 3)), r"^initial_state\[0\]: got shape \(1, 1, 16, 3\)"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tfla.mlstm_sig(*_inputs(), **kwargs)


def test_bad_tensors_raise_value_error():
    q, k, v, i, f = _inputs()
    with pytest.raises(ValueError, match=r"^v: got shape \(1, 1, 7, 16\)"):
        tfla.mlstm_sig(q, k, v[:, :, :7], i, f)
    with pytest.raises(ValueError, match=r"^q: got dtype torch.int32"):
        tfla.mlstm_sig(q.int(), k, v, i, f)
    with pytest.raises(ValueError, match=r"^q/v: got d_hv=2048"):
        tfla.mlstm_sig(*_inputs(d_hv=2048))
    with pytest.raises(ValueError, match=r"^q: got dtype torch.float64; allowed for the Triton"):
        tfla.mlstm_sig(*_inputs(dtype=torch.float64))


def test_forward_only_and_training_calls_agree():
    """A call without gradients and one with them run the same kernels and give the same h
    (float32 round-off), against the float64 recurrence."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1, 2, 70, 16, generator=g)
    v = torch.randn(1, 2, 70, 32, generator=g)
    i, f = torch.randn(2, 1, 2, 70, generator=g)
    with torch.no_grad():
        h_fwd = tfla.mlstm_sig(q, k, v, i, f - 3, chunk_size=32)
    qg = q.clone().requires_grad_(True)
    h_train = tfla.mlstm_sig(qg, k, v, i, f - 3, chunk_size=32)
    ref = mlstm_recurrent(*(x.double() for x in (q, k, v, i, f - 3)), variant="sig")
    assert maxnorm(h_fwd, ref) < 2e-5 and maxnorm(h_train.detach(), ref) < 2e-5
    assert torch.equal(h_fwd, h_train.detach())


def test_forward_walk_takes_exactly_the_calls_of_its_rule(monkeypatch):
    """The forward walk (tfla/triton/sig_walk_fw.py) runs for calls without gradients and
    without the normaliser, at L 64 in 16-bit dtypes (walk_config); every other call runs the
    parallel kernels. Where it runs, h and the last state match float64 as the other kernels
    do."""
    from tfla.triton import sig_walk_fw

    calls = []
    real = sig_walk_fw.sig_walk_fw
    monkeypatch.setattr(sig_walk_fw, "sig_walk_fw",
                        lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 1, 2, 150, 16, generator=g)).half()
    v = torch.randn(1, 2, 150, 32, generator=g).half()
    i, f = torch.randn(2, 1, 2, 150, generator=g)
    ref = mlstm_recurrent(*(x.double() for x in (q, k, v, i, f + 2)), variant="sig")

    def n_walks(**kw):
        calls.clear()
        x = dict(q=q, k=k, v=v, chunk_size=64) | kw
        grad = x.pop("grad", False)
        qq = x.pop("q").clone().requires_grad_(grad)
        with torch.set_grad_enabled(True):
            out = tfla.mlstm_sig(qq, x.pop("k"), x.pop("v"), i, f + 2, **x)
        return len(calls), out

    n, h = n_walks()
    assert n == 1 and calls[0]["L"] == 64 and maxnorm(h, ref) < 5e-3
    assert n_walks(grad=True)[0] == 0
    n, (h_last, (C_S, n_S)) = n_walks(return_last_state=True)
    _, (C_ref, n_ref) = mlstm_recurrent(*(x.double() for x in (q, k, v, i, f + 2)),
                                        variant="sig", return_last_state=True)
    assert n == 1 and maxnorm(h_last, ref) < 5e-3
    assert maxnorm(C_S, C_ref) < 5e-3 and maxnorm(n_S, n_ref) < 5e-3
    # with gradients under "auto", the walk is the forward and stores the chunk states of
    # the backward's L 128 after every second chunk of 64
    n, h_train = n_walks(grad=True, chunk_size="auto")
    assert n == 1 and calls[0]["L"] == 64 and calls[0]["states_every"] == 2
    assert maxnorm(h_train.detach(), ref) < 5e-3
    with use_tuning(Tuning(walk={"train": False})):
        assert n_walks(grad=True, chunk_size="auto")[0] == 0
        assert n_walks(chunk_size="auto")[0] == 1
    assert n_walks(grad=True, chunk_size="auto", normalize=True)[0] == 0
    assert n_walks(normalize=True)[0] == 0
    assert n_walks(chunk_size=128)[0] == 0
    assert n_walks(q=q.float(), k=k.float(), v=v.float())[0] == 0
    with use_tuning(Tuning(walk={"enabled": False})):
        assert n_walks()[0] == 0


def test_walk_config_rule():
    """walk_config: L 64, 16-bit, d_qk <= 128, d_hv <= 256, at least 1.2 programs per SM for
    the whole sequence (W4); a register cap of 240 at d_qk > 64 without the last state."""
    from tfla.triton.sig_walk_fw import walk_config

    bf16 = torch.bfloat16
    small = walk_config(64, 64, 128, 512, bf16, n_sms=132)
    assert small["B_DHV"] == 128 and small["num_warps"] == 4 and small["num_stages"] == 2
    assert small["maxnreg"] is None
    fig4 = walk_config(64, 128, 256, 128, bf16, n_sms=132)
    assert fig4["B_DHV"] == 64 and fig4["maxnreg"] == 240            # the measured register cap
    assert walk_config(64, 128, 256, 128, bf16, n_sms=132, with_last=True)["maxnreg"] is None
    assert walk_config(64, 64, 128, 158, bf16, n_sms=132) is None       # 158 programs < 158.4
    assert walk_config(64, 64, 128, 159, bf16, n_sms=132)["segments"] == 1
    assert walk_config(64, 128, 256, 64, bf16, n_sms=132) is not None    # 256 programs
    # 80/160 at B 4, 16 heads (S 16384): 3 x 64 = 192 programs, 1.45 per SM: the whole walk,
    # not two segments (W4, measured 0.775 against 1.068 ms)
    assert walk_config(64, 80, 160, 64, bf16, n_sms=132, S=16384)["segments"] == 1
    assert walk_config(64, 64, 128, 150, bf16, n_sms=132, S=16384)["segments"] == 2
    assert walk_config(64, 64, 128, 150, bf16, n_sms=132, S=16384,
                       tuning=Tuning(walk={"MIN_PROGRAMS_PER_SM": 1.0}))["segments"] == 1
    assert walk_config(64, 64, 128, 150, bf16, n_sms=132, S=16384,
                       tuning=Tuning(walk={"SEGMENT_TARGET_PER_SM": 3.0}))["segments"] == 4
    assert walk_config(64, 64, 128, 200, bf16, n_sms=0) is not None     # interpreter: no bound
    assert walk_config(128, 64, 128, 512, bf16, n_sms=132) is None
    assert walk_config(64, 256, 512, 512, bf16, n_sms=132) is None
    assert walk_config(64, 64, 128, 512, torch.float32, n_sms=132) is None


def test_walk_segments_rule():
    """Under 1.2 programs per SM the walk runs over sequence segments (rule W7): the smallest
    power of two that reaches 1.5 programs per SM, at most 16, where it divides the chunks (in steps of
    the training walk's R) into segments of at least 8 chunks; not with the last state;
    SEGMENTS in the Tuning sets the count whatever the grid. The segment-state pass splits
    each segment until its grid has 2 programs per SM (W8), in sub-segments of at least 4 of
    its chunks; SEGMENT_SPLIT sets the split."""
    from tfla.triton.sig_walk_fw import segment_split, walk_config, walk_segments

    bf16 = torch.bfloat16
    # Figure 4's heads (d_hv 256 in blocks of 64) on 132 SMs: B 1 (S 65536) and B 2 (S 32768)
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536)["segments"] == 4
    assert walk_config(64, 128, 256, 32, bf16, n_sms=132, S=32768)["segments"] == 2
    assert walk_config(64, 128, 256, 32, bf16, n_sms=132, S=32768, train=True,
                       states_every=2)["segments"] == 2
    assert walk_config(64, 128, 256, 128, bf16, n_sms=132, S=8192)["segments"] == 1
    # W8: 4 x 3 x 16 = 192 pass programs -> 2 sub-segments; 4 x 1 x 32 = 128 -> 4
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536)["segment_split"] == 2
    assert walk_config(64, 128, 256, 32, bf16, n_sms=132, S=32768)["segment_split"] == 4
    assert walk_config(64, 128, 256, 128, bf16, n_sms=132, S=8192)["segment_split"] == 1
    assert segment_split(1, 264, S=64 * 64, L=64, segments=4) == 2   # 16 of 64 -> 8 of 128: 2 x 4
    assert segment_split(1, 264, S=64 * 48, L=64, segments=4) == 1   # 12 -> 6 of 128: 3 < 4
    assert segment_split(1, 264, S=64 * 36, L=64, segments=4) == 1   # 9 of 64 (odd): 9 % 2
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536,
                       tuning=Tuning(walk={"SEGMENT_SPLIT": 8}))["segment_split"] == 8
    for key, bad in (("SEGMENT_SPLIT", 0), ("SEGMENT_SPLIT", "2"), ("SEGMENT_B_DHV", 48),
                     ("SEGMENT_B_DHV", 8), ("SEGMENT_B_DHV", True)):
        with pytest.raises(ValueError, match=key):
            walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536,
                        tuning=Tuning(walk={key: bad}))
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536, with_last=True) is None
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132) is None          # S unknown
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536 - 64 * 3) is None  # 1021 chunks
    assert walk_config(64, 128, 256, 32, bf16, n_sms=132, S=64 * 8) is None   # segments < 8 chunks
    assert walk_segments(2, 198, S=1 << 20, L=64) is None                   # 16 segments: 32 < 198
    assert walk_segments(16, 198, S=1 << 20, L=64) == 16
    assert walk_segments(16, 198, S=1 << 20, L=64, states_every=2) == 16
    assert walk_segments(300, 198, S=100, L=64) == 1
    forced = Tuning(walk={"SEGMENTS": 4})
    assert walk_config(64, 16, 24, 2, bf16, n_sms=0, tuning=forced, S=500)["segments"] == 4
    assert walk_config(64, 16, 24, 2, bf16, n_sms=0, tuning=forced, S=500, train=True,
                       states_every=2)["segments"] == 4
    assert walk_config(64, 16, 24, 2, bf16, n_sms=0, tuning=forced, S=300) is None   # 5 chunks
    assert walk_config(64, 16, 24, 2, bf16, n_sms=0, tuning=forced, S=500, with_last=True) is None
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="SEGMENTS"):
            walk_config(64, 16, 24, 2, bf16, tuning=Tuning(walk={"SEGMENTS": bad}), S=500)
        with pytest.raises(ValueError, match="SEGMENT_STAGES"):
            walk_config(64, 16, 24, 2, bf16, S=500,
                        tuning=Tuning(walk={"SEGMENTS": 4, "SEGMENT_STAGES": bad}))
    # the pass's pipeline stages: 4 by default (W8), the Tuning's where it sets them
    assert walk_config(64, 128, 256, 16, bf16, n_sms=132, S=65536)["segment_stages"] == 4
    assert walk_config(64, 16, 24, 2, bf16, n_sms=0, S=500, tuning=Tuning(
        walk={"SEGMENTS": 4, "SEGMENT_STAGES": 2}))["segment_stages"] == 2


@pytest.mark.parametrize("regime", sorted(VERIFICATION_REGIMES))
@pytest.mark.parametrize("S,segments,split", [(500, 4, 1), (1024, 2, 2)])
def test_segmented_walk_matches_float64_in_every_gate_regime(monkeypatch, regime, S, segments,
                                                             split):
    """The walk over sequence segments (rule W7; forced by the Tuning, as the interpreter has
    no SM bound), its segment-state pass in ``split`` sub-segments (W8): h without
    gradients, and h with dq, dk, dv, di, df, dC0 as the forward of the two-level backward,
    against the float64 recurrence from an initial state, in every gate regime; S 500 ends
    in a partial chunk inside the last segment. Its start states
    come from the segments before it, so an error in them shows in the later segments' h
    and in every gradient that flows through the stored chunk states."""
    from tfla.triton import sig_walk_fw

    seen = []
    real = sig_walk_fw.sig_walk_fw
    monkeypatch.setattr(sig_walk_fw, "sig_walk_fw", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    i_mean, i_std, f_mean, f_std = VERIFICATION_REGIMES[regime]
    g = torch.Generator().manual_seed(8)
    q, k = torch.randn(2, 1, 2, S, 16, generator=g).bfloat16()
    v = torch.randn(1, 2, S, 24, generator=g).bfloat16()
    i = i_mean + i_std * torch.randn(1, 2, S, generator=g)
    f = f_mean + f_std * torch.randn(1, 2, S, generator=g)
    C0 = torch.randn(1, 2, 16, 24, generator=g)
    n0 = torch.zeros(1, 2, 16)
    dh = torch.randn(1, 2, S, 24, generator=g)
    xr = [x.double().requires_grad_() for x in (q, k, v, i, f, C0)]
    hr = mlstm_recurrent(*xr[:5], variant="sig", initial_state=(xr[5], n0.double()))
    grads_r = torch.autograd.grad(hr, xr, dh.double())
    with use_tuning(Tuning(walk={"SEGMENTS": segments, "SEGMENT_SPLIT": split})):
        with torch.no_grad():
            assert tfla.plan("sig", q, v, grad=False) == tfla.Plan(64, "walk_segments", segments)
            h_fwd = tfla.mlstm_sig(q, k, v, i, f, initial_state=(C0, n0))
        xs = [x.clone().requires_grad_() for x in (q, k, v, i, f, C0)]
        assert tfla.plan("sig", xs[0], xs[2], grad=True) == \
            tfla.Plan(128, "walk_segments_two_level", segments)
        h = tfla.mlstm_sig(*xs[:5], initial_state=(xs[5], n0))
        grads = torch.autograd.grad(h, xs, dh.bfloat16())
    assert [(kw["segments"], kw["segment_split"], kw.get("states_every", 0)) for kw in seen] \
        == [(segments, split, 0), (segments, split, 2)]
    assert maxnorm(h_fwd, hr.detach()) < 3e-2 and maxnorm(h, hr.detach()) < 3e-2
    for name, a, b in zip(("dq", "dk", "dv", "di", "df", "dC0"), grads, grads_r):
        assert torch.isfinite(a).all() and maxnorm(a, b) < 3e-2, (name, maxnorm(a, b))


def test_segmented_walk_equals_the_whole_walk_to_round_off():
    """In float32 the segmented walk (start states folded from the earlier segments' states
    from zero) gives the whole walk's h and chunk states to round-off, with slowly decaying
    forget gates (σ ≈ 0.993) so that every segment's start state carries its predecessors',
    also with the segment-state pass in sub-segments and its own d_hv block (W8), and with the
    caller's gates at 2L for the pass; a segment count or a split that does not divide the
    chunks raises ValueError."""
    from tfla.triton.sig_walk_fw import sig_walk_fw

    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 2, 500, 16, generator=g)
    v = torch.randn(2, 500, 24, generator=g)
    i = torch.randn(2, 500, generator=g)
    f = 5.0 + torch.randn(2, 500, generator=g)
    C0 = torch.randn(2, 16, 24, generator=g)
    kw = dict(L=64, B_DHV=16, num_warps=4, num_stages=1, states_every=2)
    h1, _, _, C1 = sig_walk_fw(q, k, v, i, f, C0, **kw)
    h4, _, _, C4 = sig_walk_fw(q, k, v, i, f, C0, **kw, segments=4)
    assert C1.abs()[:, 2:].amin() < C1.abs().max() and C1[:, 1:].abs().max() > 1.0
    assert maxnorm(h4, h1.double()) < 1e-5 and maxnorm(C4, C1.double()) < 1e-5
    # 2 segments of 4 chunks: the pass walks 2 chunks of 128 per segment, one per sub-segment
    h2, _, _, C2 = sig_walk_fw(q, k, v, i, f, C0, **kw, segments=2, segment_split=2,
                               segment_b_dhv=32, segment_stages=2)
    assert maxnorm(h2, h1.double()) < 1e-5 and maxnorm(C2, C1.double()) < 1e-5
    # the caller's gates at 2L (the training walk's backward chunk) serve the pass: the same
    # h and states, one gate kernel fewer
    from tfla.triton import chunkwise_recurrent as rec

    calls = []
    real = rec.chunk_gates
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rec, "chunk_gates", lambda *a, **k: calls.append(k["L"]) or real(*a, **k))
        hg, _, _, Cg = sig_walk_fw(q, k, v, i, f, C0, **kw, segments=4,
                                   gates_2l=real(i, f, L=128, is_exp=False))
    assert calls == [64] and torch.equal(hg, h4) and torch.equal(Cg, C4)
    with pytest.raises(ValueError, match="segments=8"):
        sig_walk_fw(q, k, v, i, f, C0, **kw, segments=8)
    with pytest.raises(ValueError, match="segment_split=4"):
        sig_walk_fw(q, k, v, i, f, C0, **kw, segments=2, segment_split=4)
    with pytest.raises(ValueError, match="segment_b_dhv=8"):
        sig_walk_fw(q, k, v, i, f, C0, **kw, segments=2, segment_b_dhv=8)


@pytest.mark.parametrize("L,S,d_qk,d_hv", [
    (64, 150, 16, 32),      # fw_config: d_qk <= 64 -> 64-row query tiles, 32-row key tiles
    (128, 200, 32, 128),    # + state_blocks(sig_forward): 32 x 128 state blocks, 4 warps
    (128, 140, 96, 256),    # fw_config: d_qk <= 128, d_hv >= 256 -> 128 x 64 tiles, d_hv 256
    (128, 140, 160, 256),   # fw_config: 128 < d_qk <= 256 at L 128 -> 128 x 128 tiles, d_qk 256
])
def test_tiled_sig_tile_configs_in_half_precision(L, S, d_qk, d_hv):
    """The 16-bit tile configurations that the sig variant of the tiled kernels chooses
    (chunkwise_parallel_fw.fw_config, chunkwise_recurrent.state_blocks; with TMA tiles, the
    16-bit default) against float64."""
    check(run_case(S=S, L=L, d_qk=d_qk, d_hv=d_hv, dtype=torch.float16, initial=True), 5e-3)


def test_forward_walk_at_wide_heads_matches_float64(monkeypatch):
    """The walk's d_qk > 64 configuration (64-wide d_hv blocks, the register cap; d_qk 96 pads
    to a 128-wide tile), on a ragged sequence from an initial state, without and with the last
    state, against the float64 recurrence."""
    from tfla.triton import sig_walk_fw

    seen = []
    real = sig_walk_fw.sig_walk_fw
    monkeypatch.setattr(sig_walk_fw, "sig_walk_fw", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 1, 2, 100, 96, generator=g).half()
    v = torch.randn(1, 2, 100, 128, generator=g).half()
    i, f = torch.randn(2, 1, 2, 100, generator=g)
    C0, n0 = torch.randn(1, 2, 96, 128, generator=g), torch.randn(1, 2, 96, generator=g).abs()
    ref, (C_ref, n_ref) = mlstm_recurrent(*(x.double() for x in (q, k, v, i, f - 2)), variant="sig",
                                          initial_state=(C0.double(), n0.double()),
                                          return_last_state=True)
    with torch.no_grad():
        h = tfla.mlstm_sig(q, k, v, i, f - 2, chunk_size=64, initial_state=(C0, n0))
        h2, (C_S, n_S) = tfla.mlstm_sig(q, k, v, i, f - 2, chunk_size=64, initial_state=(C0, n0),
                                        return_last_state=True)
    assert [kw["maxnreg"] for kw in seen] == [240, None] and seen[0]["B_DHV"] == 64
    assert maxnorm(h, ref) < 5e-3 and maxnorm(h2, ref) < 5e-3
    assert maxnorm(C_S, C_ref) < 5e-3 and maxnorm(n_S, n_ref) < 5e-3


@pytest.mark.parametrize("regime", sorted(VERIFICATION_REGIMES))
@pytest.mark.parametrize("S", [150, 200, 40])
def test_training_walk_matches_float64_in_every_gate_regime(monkeypatch, regime, S):
    """A call with gradients under chunk_size="auto" runs the forward walk at L 64, which
    stores the chunk states of the backward's L (128; at S 40, L 64) after every second
    chunk (every chunk at S 40), then the two-level backward: h, the last state and every
    gradient against the float64 recurrence, in every gate regime (saturating forget gates,
    huge and tiny input gates), from an initial state, with a gradient on the last state, on
    sequences that end in a partial chunk: S 150 ends inside the third chunk of 64, so the
    last stored state comes after the loop; S 200 after an even number of chunks; S 40 is
    shorter than one chunk. bfloat16 (float32's exponent range): in float16 the input
    gates of the strongly negative regime (σ(ĩ) ~ 1e-13) underflow in ā ⊙ V on every path.
    """
    from tfla.triton import sig_walk_fw

    seen = []
    real = sig_walk_fw.sig_walk_fw
    monkeypatch.setattr(sig_walk_fw, "sig_walk_fw", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    i_mean, i_std, f_mean, f_std = VERIFICATION_REGIMES[regime]
    errs = run_case(S=S, L="auto", d_qk=16, d_hv=24, dtype=torch.bfloat16, initial=True,
                    i_mean=i_mean, i_std=i_std, f_mean=f_mean, f_std=f_std, seed=5)
    assert [(kw["L"], kw["states_every"], kw["with_last"]) for kw in seen] == \
        [(64, 1 if S <= 64 else 2, True)]
    check(errs, 3e-2)


@pytest.mark.parametrize("d_qk", [48, 96])
def test_training_walk_without_the_last_state_matches_float64(d_qk):
    """The training walk without the last state and without an initial state: h and dq, dk,
    dv, di, df against the float64 recurrence, as the two-level forward at the same L gives
    them; at d_qk 96 in the walk's register-capped configuration (64-wide d_hv blocks)."""
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 1, 2, 150, d_qk, generator=g).half()
    v = torch.randn(1, 2, 150, 64, generator=g).half()
    i, f = torch.randn(2, 1, 2, 150, generator=g)
    f = f + 1.0
    dh = torch.randn(1, 2, 150, 64, generator=g)
    xr = [x.double().requires_grad_() for x in (q, k, v, i, f)]
    hr = mlstm_recurrent(*xr, variant="sig")
    grads_r = torch.autograd.grad(hr, xr, dh.double())
    for chunk in ("auto", 128):
        xs = [x.clone().requires_grad_() for x in (q, k, v, i, f)]
        assert tfla.plan("sig", xs[0], xs[2], chunk_size=chunk, grad=True).algorithm == \
            ("walk_two_level" if chunk == "auto" else "two_level")
        h = tfla.mlstm_sig(*xs, chunk_size=chunk)
        grads = torch.autograd.grad(h, xs, dh.half())
        assert maxnorm(h, hr.detach()) < 5e-3, chunk
        for name, a, b in zip(("dq", "dk", "dv", "di", "df"), grads, grads_r):
            assert torch.isfinite(a).all() and maxnorm(a, b) < 1e-2, (chunk, name, maxnorm(a, b))
