"""The model counts the algorithm that ran: an mLSTMsig walk keeps its chunk states on chip
(tflabench.model.plan_counts_kwargs, measure.counts_for_plan, model_vs_measured)."""

from __future__ import annotations

import pytest

from tflabench.backends import get_backend
from tflabench.backends.base import Shape
from tflabench.run.measure import counts_for_plan
from tflabench.model import WALK_ALGORITHMS, counts_for_case, plan_counts_kwargs
from tflabench.analysis.model_vs_measured import roofline_placement

SHAPE = dict(B=8, NH=16, S=8192, d_qk=128, d_hv=256)


def test_walk_forward_bytes_are_qkv_gates_and_h_once_and_flops_unchanged():
    chunked = counts_for_case("mlstm_sig", "fwd", L=64, **SHAPE)
    walked = counts_for_case("mlstm_sig", "fwd", L=64, states_on_chip=True, **SHAPE)
    B, NH, T, dq, dv = (SHAPE[k] for k in ("B", "NH", "S", "d_qk", "d_hv"))
    assert walked.flops == chunked.flops
    assert walked.bytes == pytest.approx(B * NH * T * ((2 * dq + dv) * 2 + 2 * 2 + dv * 2))
    assert walked.bytes < chunked.bytes


def test_walk_changes_only_the_forward_of_a_training_step():
    chunked = counts_for_case("mlstm_sig", "fwdbw", L=64, **SHAPE)
    walked = counts_for_case("mlstm_sig", "fwdbw", L=64, states_on_chip=True, **SHAPE)
    fwd_saving = (counts_for_case("mlstm_sig", "fwd", L=64, **SHAPE).bytes
                  - counts_for_case("mlstm_sig", "fwd", L=64, states_on_chip=True, **SHAPE).bytes)
    assert chunked.bytes - walked.bytes == pytest.approx(fwd_saving)


@pytest.mark.parametrize("kind, algorithm, walks", [
    ("mlstm_sig", "walk", True), ("mlstm_sig", "walk_segments_two_level", True),
    ("mlstm_sig", "two_level", False), ("mlstm_exp", "walk", False), ("mlstm_sig", None, False),
])
def test_plan_counts_kwargs_only_for_an_mlstmsig_walk(kind, algorithm, walks):
    assert plan_counts_kwargs(kind, algorithm) == ({"states_on_chip": True} if walks else {})
    assert set(WALK_ALGORITHMS) >= {"walk", "walk_segments"}


def test_counts_for_plan_counts_the_chunk_size_and_algorithm_that_ran():
    tfla = get_backend("tfla")
    params = tfla.parse_params({"variant": "sig", "chunk_size": "auto", "heads": 16, "d_qk": 128, "d_hv": 256})
    shape = Shape(8, 8192, 16, 128, 256, "bfloat16")
    got = counts_for_plan(tfla, params, shape, "fwd", {"chunk_size": 64, "algorithm": "walk"})
    want = counts_for_case("mlstm_sig", "fwd", L=64, states_on_chip=True, **SHAPE)
    assert got == (pytest.approx(want.flops), pytest.approx(want.bytes))
    assert counts_for_plan(tfla, params, shape, "fwd", {}) is None


def test_a_walk_row_is_placed_under_the_walks_bound():
    row = {"status": "ok", "backend": "tfla", "family": "mlstm", "kernel": "ours", "mode": "fwd", "dtype": "bfloat16",
           "batch": 8, "seq_len": 8192, "heads": 16, "d_qk": 128, "d_hv": 256, "chunk_size": 64,
           "algorithm": "walk", "params": '{"variant": "sig", "chunk_size": 128}', "ms_median": 1.0,
           "flops": 1.0e11, "bytes": 6.7e9}
    placed = roofline_placement([row], peak_flops_per_s=989e12, beta=3.35e12)
    walk = counts_for_case("mlstm_sig", "fwd", L=64, states_on_chip=True, **SHAPE)
    assert placed[0]["intensity_flop_per_byte"] == pytest.approx(walk.flops / walk.bytes)
