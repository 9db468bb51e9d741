"""The kernels' host side: the integer helpers every launcher calls, that no launcher
calls Triton's constexpr functions from Python, which cost microseconds per call (a call of
``tfla.mlstm_sig`` fwd+bwd launches about ten kernels; docs/kernels.md, "Host time"), and
the launches and torch operations of one call, bounded so that host work cannot creep
back."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

# as every kernel test module: Triton reads the switch when it is first imported, and a
# module collected before the others must not fix it the other way for them
os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402

from tfla.triton.common import cdiv, pow2  # noqa: E402

KERNELS = Path(__file__).resolve().parents[1] / "kernels" / "tfla"
#: Triton functions that are constexpr functions in Triton 3.6: fine inside a kernel,
#: slow from host code
CONSTEXPR_FUNCTIONS = {"cdiv", "next_power_of_2"}


@pytest.mark.parametrize("x", [*range(0, 70), 127, 128, 129, 4095, 4096, 4097, 65536, 10**6])
def test_pow2_and_cdiv_match_triton(x):
    assert pow2(x) == max(1, triton.next_power_of_2(max(x, 1)))
    assert pow2(x) >= max(x, 1) and pow2(x) & (pow2(x) - 1) == 0
    for b in (1, 3, 16, 64, 128, 256):
        assert cdiv(x, b) == triton.cdiv(x, b)


def _is_kernel(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def host_calls_of_triton_constexpr_functions(source: str) -> list[int]:
    """Lines where code outside a ``@triton.jit`` / ``@gluon.jit`` function calls
    ``triton.cdiv`` or ``triton.next_power_of_2``."""
    tree = ast.parse(source)
    in_kernel = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and _is_kernel(node):
            in_kernel.update(id(n) for n in ast.walk(node))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and id(node) not in in_kernel
            and isinstance(node.func, ast.Attribute) and node.func.attr in CONSTEXPR_FUNCTIONS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "triton"]


def test_the_finder_sees_host_calls_and_not_kernel_ones():
    source = ("import triton\n@triton.jit\ndef k(x):\n    n = triton.cdiv(x, 2)\n"
              "def launch(S):\n    return triton.cdiv(S, 64), triton.next_power_of_2(S)\n")
    assert host_calls_of_triton_constexpr_functions(source) == [6, 6]


def test_no_launcher_calls_a_triton_constexpr_function():
    found = {str(p.relative_to(KERNELS)): lines for p in sorted(KERNELS.rglob("*.py"))
             if (lines := host_calls_of_triton_constexpr_functions(p.read_text()))}
    assert not found, f"use tfla.triton.common.cdiv / pow2 in host code: {found}"


# ---------------------------------------------------------------- host work per call

def host_work(variant: str, mode: str, dtype, *, states: bool = False) -> tuple[int, int]:
    """(kernel launches, torch operations) of one call of ``tfla.mlstm_<variant>`` at tiny
    shapes (B 1, NH 2, S 40, d_qk 16, d_hv 32, "auto"): ``mode`` "fwd" (no gradients) or
    "fwdbw" (forward and ``.backward()``). Launches are counted and not run (the host work
    of a launch without its kernel); torch operations are the ATen operators the call's
    Python issues, counted by ``torch.profiler`` at the top level (an operator inside
    another counts with it) without the registered operators themselves."""
    from collections import Counter

    import torch
    import triton.runtime.interpreter as interp
    from torch.profiler import ProfilerActivity, profile

    import tfla

    g = torch.Generator().manual_seed(0)
    B, NH, S, d_qk, d_hv = 1, 2, 40, 16, 32
    xs = [torch.randn(B, NH, S, d_qk, generator=g).to(dtype),
          torch.randn(B, NH, S, d_qk, generator=g).to(dtype),
          torch.randn(B, NH, S, d_hv, generator=g).to(dtype),
          torch.randn(B, NH, S, generator=g), torch.randn(B, NH, S, generator=g) + 2]
    dh = torch.ones(B, NH, S, d_hv, dtype=dtype)
    fn = tfla.mlstm_sig if variant == "sig" else tfla.mlstm_exp
    kw = {}
    if states:
        kw = dict(initial_state=torch.zeros(B, NH, d_qk, d_hv), return_last_state=True)

    def call():
        if mode == "fwd":
            with torch.no_grad():
                return fn(*xs, **kw)
        leaves = [x.clone().requires_grad_(True) for x in xs]
        out = fn(*leaves, **kw)
        (out[0] if states else out).backward(dh)

    call()                                   # first call: plan, configurations, compilation
    launches = Counter()
    run = interp.InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1

    interp.InterpretedFunction.run = counted
    try:
        if mode == "fwdbw":                  # the inputs' copies are the test's, not the call's
            leaves = [x.clone().requires_grad_(True) for x in xs]

            def call():                      # noqa: F811
                out = fn(*leaves, **kw)
                (out[0] if states else out).backward(dh)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
    finally:
        interp.InterpretedFunction.run = run
    ops = [e for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return sum(launches.values()), len(ops)


#: (launches, torch operations) per call at most, as the launchers reach them now: a change
#: that adds host work per call must raise these on purpose (docs/kernels.md, "Host time").
#: bfloat16 in Triton's interpreter adds the float32 copies of q, k, v (and casts back),
#: which a GPU call does not make.
HOST_WORK = {
    ("sig", "fwd", "float32"): (3, 18), ("sig", "fwdbw", "float32"): (7, 50),
    ("exp", "fwd", "float32"): (3, 20), ("exp", "fwdbw", "float32"): (7, 51),
    ("sig", "fwd", "bfloat16"): (2, 15), ("sig", "fwdbw", "bfloat16"): (7, 62),
}


@pytest.mark.parametrize("variant,mode,dtype", sorted(HOST_WORK))
def test_host_work_per_call_does_not_creep_back(variant, mode, dtype):
    import torch

    launches, ops = host_work(variant, mode, getattr(torch, dtype))
    most_launches, most_ops = HOST_WORK[(variant, mode, dtype)]
    assert launches == most_launches, f"{launches} launches (the plan's kernels: {most_launches})"
    assert 0 < ops <= most_ops, f"{ops} torch operations per call (at most {most_ops})"
