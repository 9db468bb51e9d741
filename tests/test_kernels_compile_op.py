"""The registered operators (``tfla/ops.py``): a training step through ``tfla.mlstm_sig`` /
``tfla.mlstm_exp`` compiles with ``torch.compile(fullgraph=True)`` (no graph break) and
gives the eager results bit for bit; ``torch.library.opcheck`` holds for both operators,
with and without states (docs/kernels.md, "Registered operators"). Triton's interpreter,
tiny shapes; ``benchmarks/compile_check.py`` checks CUDA graphs (``reduce-overhead``) on a
GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"   # read by triton when the kernel modules are imported

import tfla  # noqa: E402
import tfla.ops  # noqa: E402,F401  (registers the operators)

B, NH, S, D_QK, D_HV = 1, 2, 40, 16, 32


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, NH, S, D_QK, generator=g), torch.randn(B, NH, S, D_QK, generator=g),
          torch.randn(B, NH, S, D_HV, generator=g), torch.randn(B, NH, S, generator=g),
          torch.randn(B, NH, S, generator=g) + 2]
    C0 = torch.randn(B, NH, D_QK, D_HV, generator=g)
    return [x.to(dtype) for x in xs[:3]] + xs[3:], C0


def _loss_fn(variant, states, **kw):
    fn = tfla.mlstm_sig if variant == "sig" else tfla.mlstm_exp

    def loss(q, k, v, i, f, C0):
        if not states:
            return fn(q, k, v, i, f, **kw).float().square().sum()
        h, last = fn(q, k, v, i, f, initial_state=C0, return_last_state=True, **kw)
        return h.float().square().sum() + 0.5 * last[0].square().sum()

    return loss


def _step(loss, xs, C0):
    """loss and the gradients of every input (the training step: forward, then backward)."""
    leaves = [x.clone().requires_grad_(True) for x in (*xs, C0)]
    value = loss(*leaves)
    value.backward()
    return [value.detach()] + [x.grad for x in leaves]


def _same(eager, compiled):
    assert len(eager) == len(compiled)
    for j, (a, b) in enumerate(zip(eager, compiled)):
        assert (a is None) == (b is None), j
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), f"output {j} differs"


@pytest.mark.parametrize("variant,states,dtype,kw", [
    ("sig", True, torch.float32, {"chunk_size": 32}),
    ("sig", False, torch.bfloat16, {}),                 # "auto": the walk, two-level backward
    ("exp", True, torch.float32, {"chunk_size": 32}),
    ("exp", False, torch.float32, {"algorithm": "limit_chunk", "chunk_size": 16}),
])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_training_step_equals_eager(variant, states, dtype, kw, backend):
    torch._dynamo.reset()
    xs, C0 = _inputs(dtype)
    loss = _loss_fn(variant, states, **kw)
    eager = _step(loss, xs, C0)
    compiled = _step(torch.compile(loss, fullgraph=True, backend=backend), xs, C0)
    _same(eager, compiled)


@pytest.mark.parametrize("variant", ["sig", "exp"])
def test_no_graph_break_and_one_operator_each_way(variant):
    """Dynamo sees one graph; it holds the forward operator (the backward operator is
    AOTAutograd's, not Dynamo's)."""
    torch._dynamo.reset()
    xs, C0 = _inputs()
    leaves = [x.clone().requires_grad_(True) for x in (*xs, C0)]
    explained = torch._dynamo.explain(_loss_fn(variant, True, chunk_size=32))(*leaves)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    code = "\n".join(g.code for g in explained.graphs)
    assert code.count("tfla.mlstm_fwd") == 1 and "mlstm_bwd" not in code


def test_inductor_training_step_equals_eager():
    """Inductor on the CPU compiles the code around the operators; the operators' own
    results are the eager ones bit for bit (the loss, fused by inductor, to round-off)."""
    torch._dynamo.reset()
    xs, C0 = _inputs()
    loss = _loss_fn("sig", True, chunk_size=32)
    eager = _step(loss, xs, C0)
    try:
        compiled = _step(torch.compile(loss, fullgraph=True, backend="inductor"), xs, C0)
    except Exception as exc:    # no C++ compiler for inductor's CPU code
        if "InductorError" in type(exc).__name__ or "CppCompileError" in repr(exc):
            pytest.skip(f"inductor cannot compile on this CPU: {type(exc).__name__}")
        raise
    assert torch.allclose(eager[0], compiled[0], rtol=1e-5)
    for a, b in zip(eager[1:], compiled[1:]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _fwd_args(variant, states, *, chunk_size=32, algorithm="xl_chunk", dtype=torch.float32,
              grad=True):
    xs, C0 = _inputs(dtype, seed=1)
    xs = [x.requires_grad_(grad) for x in xs]
    n0 = torch.randn(B, NH, D_QK).abs() if states else None
    m0 = torch.zeros(B, NH) if (states and variant == "exp") else None
    C0 = C0.requires_grad_(grad) if states else None
    return (*xs, C0, n0, m0, variant, chunk_size, algorithm, variant == "exp", 1e-6, states,
            grad, 0)


@pytest.mark.parametrize("variant,states,kw", [
    ("sig", False, {}), ("sig", True, {}), ("exp", False, {}), ("exp", True, {}),
    ("sig", False, {"chunk_size": 0, "dtype": torch.bfloat16}),               # walk_two_level
    ("sig", True, {"chunk_size": 0, "dtype": torch.bfloat16, "grad": False}),  # walk
    ("exp", True, {"chunk_size": 16, "algorithm": "limit_chunk"}),
])
def test_opcheck_forward_operator(variant, states, kw):
    torch.library.opcheck(torch.ops.tfla.mlstm_fwd.default, _fwd_args(variant, states, **kw))


@pytest.mark.parametrize("variant,states", [("sig", True), ("exp", False)])
def test_opcheck_backward_operator(variant, states):
    args = _fwd_args(variant, states, grad=False)
    outs = torch.ops.tfla.mlstm_fwd(*args[:-2], True, 0)
    front = 1 + (3 if variant == "exp" else 2) * states
    q, k, v, i, f, C0, n0, m0 = args[:8]
    dh = torch.randn_like(outs[0])
    dC = torch.randn_like(outs[1]) if states else None
    bwd_args = (dh, dC, q, k, v, i, f, C0, n0, m0, outs[1] if states else None, outs[front:],
                *args[8:14], 0, states)
    torch.library.opcheck(torch.ops.tfla.mlstm_bwd.default, bwd_args)
    grads = torch.ops.tfla.mlstm_bwd(*bwd_args)
    assert [g.shape for g in grads] == [x.shape for x in (q, k, v, i, f)] + ([C0.shape] if states else [])


def test_public_signature_unchanged():
    """The operators sit under the public functions; their keyword arguments stay."""
    import inspect

    assert list(inspect.signature(tfla.mlstm_sig).parameters) == [
        "q", "k", "v", "i", "f", "chunk_size", "algorithm", "normalize", "initial_state",
        "return_last_state"]
    assert list(inspect.signature(tfla.mlstm_exp).parameters) == [
        "q", "k", "v", "i", "f", "chunk_size", "algorithm", "eps", "initial_state",
        "return_last_state"]
