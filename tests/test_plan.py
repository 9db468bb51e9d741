"""chunk_size="auto" and tfla.plan: the rule, what a call runs, and that "auto" runs it."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"   # read by triton when the kernel modules are imported

import tfla  # noqa: E402
from tfla.plan import auto_chunk, resolve_chunk  # noqa: E402
from tfla.triton.tuning import Tuning, use_tuning  # noqa: E402


def _qv(B=1, NH=2, S=100, d_qk=16, d_hv=32, dtype=torch.float32, device="cpu"):
    return (torch.empty(B, NH, S, d_qk, dtype=dtype, device=device),
            torch.empty(B, NH, S, d_hv, dtype=dtype, device=device))


@pytest.mark.parametrize("variant,d_qk,d_hv,dtype", [
    ("sig", 64, 128, torch.bfloat16), ("sig", 128, 256, torch.float16),
    ("sig", 256, 256, torch.bfloat16), ("sig", 128, 512, torch.bfloat16),
    ("sig", 256, 512, torch.float32), ("exp", 256, 512, torch.bfloat16),
    ("exp", 128, 256, torch.bfloat16), ("sig", 192, 384, torch.bfloat16),
    ("sig", 160, 320, torch.bfloat16), ("sig", 256, 480, torch.float16),
])
def test_auto_chunk_rule(variant, d_qk, d_hv, dtype):
    """The two-level kernels run at L 128 in both modes (mLSTMsig without gradients first
    tries the walk at L 64, test below), except the next test's heads."""
    assert auto_chunk(variant, d_qk=d_qk, d_hv=d_hv, grad=True, dtype=dtype) == 128
    assert auto_chunk(variant, d_qk=d_qk, d_hv=d_hv, grad=False, dtype=dtype) == 128


@pytest.mark.parametrize("d_qk,d_hv", [(256, 512)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_chunk_at_figure5_heads(d_qk, d_hv, dtype):
    """Rule C2: mLSTMsig in 16-bit at d_qk 256 / d_hv 512 exactly (head dimensions that pad
    up to them run at L 128, previous test) runs the two-level kernels at L 256, with and
    without gradients, and the plan of a long enough sequence says so."""
    assert auto_chunk("sig", d_qk=d_qk, d_hv=d_hv, grad=True, dtype=dtype) == 256
    assert auto_chunk("sig", d_qk=d_qk, d_hv=d_hv, grad=False, dtype=dtype) == 256
    for S, L in ((1024, 256), (100, 128)):       # a shorter sequence: the chunk it fits
        q = torch.empty(2, 4, S, d_qk, dtype=dtype, device="meta")
        v = torch.empty(2, 4, S, d_hv, dtype=dtype, device="meta")
        for grad in (True, False):
            assert tfla.plan("sig", q, v, grad=grad, device="cpu") == tfla.Plan(L, "two_level")
        assert tfla.plan("sig", q, v, chunk_size=128, device="cpu").chunk_size == 128


def test_resolve_chunk_validates_and_passes_ints():
    assert resolve_chunk(32, "sig", d_qk=16, d_hv=16, grad=True, dtype=torch.float32) == 32
    assert resolve_chunk("auto", "sig", d_qk=16, d_hv=16, grad=True, dtype=torch.float32,
                         algorithm="limit_chunk") == 64
    for bad in (48, 8, "fast", 64.0):
        with pytest.raises(ValueError, match="chunk_size"):
            resolve_chunk(bad, "sig", d_qk=16, d_hv=16, grad=True, dtype=torch.float32)


def test_plan_on_the_cpu_is_the_reference(monkeypatch):
    from tfla.triton import common
    monkeypatch.setattr(common, "interpret_mode", lambda: False)
    q, v = _qv()
    p = tfla.plan("sig", q, v, grad=True)
    assert (p.chunk_size, p.algorithm) == (128, "reference")


def test_plan_names_the_walk_and_the_training_walk(monkeypatch):
    """In the interpreter (no SM bound) a 16-bit mLSTMsig call without the normaliser takes
    the walk at L 64: without gradients alone, with gradients under "auto" as the forward of
    the two-level backward at L 128 (``walk_two_level``); with the normaliser or a given
    chunk size the two-level kernels; the chunk is clamped to the sequence."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, v = _qv(dtype=torch.bfloat16)
    assert tfla.plan("sig", q, v, grad=False) == tfla.Plan(64, "walk")
    assert tfla.plan("sig", q, v, grad=True) == tfla.Plan(128, "walk_two_level")
    assert tfla.plan("sig", q, v, grad=True, chunk_size=128) == tfla.Plan(128, "two_level")
    assert tfla.plan("sig", q, v, grad=True, normalize=True) == tfla.Plan(128, "two_level")
    assert tfla.plan("sig", q.float(), v.float(), grad=True) == tfla.Plan(128, "two_level")
    with use_tuning(Tuning(walk={"train": False})):
        assert tfla.plan("sig", q, v, grad=True) == tfla.Plan(128, "two_level")
    with use_tuning(Tuning(recompute_states=True)):
        assert tfla.plan("sig", q, v, grad=True) == tfla.Plan(128, "two_level")
    assert tfla.plan("sig", q, v, grad=False, normalize=True) == tfla.Plan(128, "two_level")
    assert tfla.plan("sig", q, v, grad=False, chunk_size=32) == tfla.Plan(32, "two_level")
    assert tfla.plan("exp", q, v, grad=False) == tfla.Plan(128, "two_level")
    q, v = _qv(S=20, dtype=torch.bfloat16)
    assert tfla.plan("sig", q, v, grad=True, chunk_size=256) == tfla.Plan(32, "two_level")
    assert tfla.plan("sig", q, v, algorithm="limit_chunk") == tfla.Plan(32, "limit_chunk")
    with pytest.raises(ValueError, match="variant"):
        tfla.plan("lin", q, v)


@pytest.mark.parametrize("variant", ["sig", "exp"])
def test_auto_runs_the_planned_chunk(variant, monkeypatch):
    """chunk_size="auto" (the default) gives the same h and gradients as the planned size,
    bit for bit (float32 in the interpreter: L 128, clamped to the sequence: 128)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(0)
    B, NH, S, dq, dv = 1, 2, 150, 16, 24
    xs = [torch.randn(B, NH, S, dq, generator=g), torch.randn(B, NH, S, dq, generator=g),
          torch.randn(B, NH, S, dv, generator=g), torch.randn(B, NH, S, generator=g),
          torch.randn(B, NH, S, generator=g) + 2]
    fn = tfla.mlstm_sig if variant == "sig" else tfla.mlstm_exp
    p = tfla.plan(variant, xs[0], xs[2], grad=True)
    outs = []
    for kw in ({}, {"chunk_size": p.chunk_size}):
        leaves = [x.clone().requires_grad_(True) for x in xs]
        h = fn(*leaves, **kw)
        h.sum().backward()
        outs.append([h.detach()] + [x.grad for x in leaves])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
