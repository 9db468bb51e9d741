"""The chunk-gates kernel compiles for sm_90 at every chunk size and gate dtype the public
functions accept (no GPU needed: ``triton.compile`` with a ``GPUTarget``).

Regression: ``tfla.mlstm_exp(..., chunk_size=256)`` with bfloat16 or float16 gate
pre-activations failed on Hopper with ``PassManager::run failed``
(TritonGPURemoveLayoutConversions) in the chunk-gates kernel at 1 warp, and at chunk 1024
at 4 warps; float32 gates compiled. ``gates_num_warps`` now gives each thread at most four
gate values.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tfla.triton import chunkwise_recurrent as cr  # noqa: E402

SM90 = GPUTarget("cuda", 90, 128)
CHUNKS = (16, 32, 64, 128, 256, 512, 1024)
GATE_DTYPES = ("fp32", "bf16", "fp16")


def _compile_gates(gate_dtype: str, L: int, is_exp: bool, num_warps: int) -> None:
    ptrs = ("I", "F", "B_vec", "A_vec", "I_vec", "MI_vec", "G_ch", "AMAX_ch")
    signature = {p: ("*" + gate_dtype if p in ("I", "F") else "*fp32") for p in ptrs}
    signature.update(S="i32", NC="i32", L="constexpr", IS_EXP="constexpr")
    # the launcher specialises 16-byte aligned pointers and S divisible by 16: compile so too
    attrs = {(k,): [["tt.divisibility", 16]] for k in range(10)}
    src = ASTSource(fn=cr._gates_kernel, signature=signature,
                    constexprs={"L": L, "IS_EXP": is_exp}, attrs=attrs)
    triton.compile(src, target=SM90, options={"num_warps": num_warps})


@pytest.mark.parametrize("gate_dtype", GATE_DTYPES)
@pytest.mark.parametrize("is_exp", [True, False], ids=["exp", "sig"])
def test_chunk_gates_compiles_for_sm90_at_every_chunk_size(gate_dtype, is_exp):
    for L in CHUNKS:
        _compile_gates(gate_dtype, L, is_exp, cr.gates_num_warps(L))


def test_regression_exp_chunk256_bf16_gates_compile():
    """The reported case: mLSTMexp, chunk 256, bfloat16 gates, at the warps launched."""
    _compile_gates("bf16", 256, True, cr.gates_num_warps(256))


def test_the_old_launch_configuration_fails_so_the_test_can_fail():
    """The old rule (1 warp below L 512) at chunk 256 with 16-bit gates does not compile:
    the test above would catch a return to it."""
    with pytest.raises(Exception, match="PassManager"):
        _compile_gates("bf16", 256, True, 1)


def test_gates_num_warps_keeps_at_most_four_values_per_thread():
    for L in CHUNKS:
        w = cr.gates_num_warps(L)
        assert 1 <= w <= 8
        assert L / (32 * w) <= 4
