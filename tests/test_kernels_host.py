"""The kernels' host side: the integer helpers every launcher calls, and that no launcher
calls Triton's constexpr functions from Python, which cost microseconds per call (a call of
``tfla.mlstm_sig`` fwd+bwd launches about ten kernels; docs/kernels.md, "Host time")."""

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
