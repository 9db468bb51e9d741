"""Measurement: timing statistics, the one timing function, and the numerics gate."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tflabench.backends import register
from tflabench.backends.attention_family import AttentionFamily
from tflabench.backends.base import Backend, HeadLayoutParams, Shape
from tflabench.run.measure import (max_normalised_error, measure_case, numerics_gate, summarize,
                               time_callable)
from tflabench.store.suite import Case


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by 3 (a wrong gradient)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 3 * g


class _AttentionParams(HeadLayoutParams):
    flaw: str = "none"  # none | output | grad_q


class _TestAttention(Backend):
    """Causal attention through torch SDPA, with a deliberate flaw on request."""

    name = "test_attention"
    family = AttentionFamily("BHSD")
    Params = _AttentionParams

    def available(self, params):
        return None

    def forward(self, params, inputs):
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if params.flaw == "grad_q":
            q = _ScaleGrad.apply(q)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out * 1.05 if params.flaw == "output" else out


BACKEND = register(_TestAttention())
SHAPE = Shape(batch=2, seq_len=64, heads=2, d_qk=16, d_hv=16, dtype="float32")


def _gate(flaw, mode):
    return numerics_gate(BACKEND, BACKEND.parse_params({"heads": 2, "flaw": flaw}), SHAPE, mode=mode,
                         dtype=torch.float32, device="cpu", seed=0, max_seq_len=32)


def test_summarize_gives_median_quartiles_and_samples():
    # numpy.percentile with linear interpolation: for 1..5 the quartiles are 2 and 4.
    stats = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert stats["ms_median"] == 3.0 and stats["ms_mean"] == 3.0
    assert (stats["ms_min"], stats["ms_max"]) == (1.0, 5.0)
    assert (stats["ms_q25"], stats["ms_q75"]) == (2.0, 4.0)
    assert stats["ms_samples"] == [5.0, 1.0, 4.0, 2.0, 3.0] and stats["n_iter"] == 5


def test_time_callable_runs_warmups_then_timed_iterations():
    calls, before = [], []
    samples = time_callable(lambda: calls.append(1), device="cpu", warmup=3, iterations=4,
                            before_each=lambda: before.append(1))
    assert len(samples) == 4 and all(s >= 0 for s in samples)
    assert len(calls) == 7 and len(before) == 7
    with pytest.raises(ValueError, match="iterations"):
        time_callable(lambda: None, device="cpu", warmup=0, iterations=0)


def test_time_callable_warms_up_for_warmup_s_seconds_after_the_counted_warmups(monkeypatch):
    """warmup_s: untimed calls after the counted ones until that much wall time has passed,
    never inside the timed calls; 0 keeps the count alone."""
    import tflabench.run.measure as measure

    now = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    calls = []

    def call():                      # each call takes 0.25 s of the fake wall clock
        calls.append(1)
        now[0] += 0.25

    samples = time_callable(call, device="cpu", warmup=2, iterations=3, warmup_s=1.0)
    # 2 counted + 4 timed until 1 s has passed (the clock starts after the counted ones) + 3
    assert len(samples) == 3 and len(calls) == 2 + 4 + 3
    calls.clear()
    time_callable(call, device="cpu", warmup=2, iterations=3)
    assert len(calls) == 5


def test_cuda_graph_timing_needs_cuda_and_a_failed_capture_names_the_setting(monkeypatch):
    """time_callable refuses cuda_graph off CUDA; graph_replay turns any capture failure
    (here: no CUDA stream to capture on) into GraphCaptureError naming timing.cuda_graph."""
    import tflabench.run.measure as measure

    with pytest.raises(ValueError, match="cuda_graph: CUDA graphs need a CUDA device; got device 'cpu'"):
        time_callable(lambda: None, device="cpu", warmup=0, iterations=1, cuda_graph=True)

    def no_stream(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(torch.cuda, "Stream", no_stream)
    with pytest.raises(measure.GraphCaptureError) as info:
        measure.graph_replay(lambda: None)
    assert str(info.value) == ("the call cannot be captured as a CUDA graph (RuntimeError: operation not "
                               "permitted when stream is capturing); time this kernel without timing.cuda_graph")


def test_a_failed_capture_is_an_error_row_that_keeps_what_was_measured(monkeypatch):
    """A kernel that cannot be captured loses its timings only: the numerics and the peak
    memory measured before stay in the row."""
    import tflabench.run.measure as measure

    def refuse(fn, **kw):
        assert kw["cuda_graph"] is True
        raise measure.GraphCaptureError("the call cannot be captured as a CUDA graph (x)")

    monkeypatch.setattr(measure, "time_callable", refuse)
    out = measure_case(_case(cuda_graph=True))
    assert out["status"] == "error" and "cannot be captured as a CUDA graph" in out["reason"]
    assert out["numerics_err"] < 1e-5 and "peak_mem_bytes" in out and "ms_median" not in out


def test_max_normalised_error_definition_and_non_finite_output():
    ref = torch.tensor([1.0, -4.0, 2.0])
    assert max_normalised_error(torch.tensor([1.0, -3.0, 2.0]), ref) == pytest.approx(0.25)
    assert max_normalised_error(torch.tensor([float("nan"), -4.0, 2.0]), ref) == math.inf


@pytest.mark.parametrize("mode", ["fwd", "fwdbw"])
def test_numerics_gate_passes_a_correct_kernel(mode):
    result = _gate("none", mode)
    assert result.passed and result.err < 1e-5
    assert set(result.errors) == ({"out"} if mode == "fwd" else {"out", "dq", "dk", "dv"})
    assert "B=1 NH=2 S=32" in result.ref  # the reduced shape


def test_numerics_gate_flags_a_wrong_output():
    result = _gate("output", "fwd")
    assert not result.passed and result.worst == "out"
    assert result.err == pytest.approx(0.05, rel=1e-3)  # output scaled by 1.05
    assert "exceeds its budget" in result.reason()


def test_numerics_gate_flags_a_wrong_gradient_only_in_fwdbw():
    assert _gate("grad_q", "fwd").passed  # the forward is right
    result = _gate("grad_q", "fwdbw")
    assert not result.passed and result.worst == "dq"
    assert result.err == pytest.approx(2.0, rel=1e-3)  # dq tripled: |3g - g| / |g| = 2


def _case(**over):
    params = dict(heads=2, flaw="none", d_hv=None, d_qk=None, p_qk=1.0)
    params.update(over.pop("params", {}))
    base = dict(suite="t", kernel="att", backend="test_attention", family="attention",
                params=BACKEND.parse_params(params),
                mode="fwdbw", dtype="float32", device="cpu", batch=2, seq_len=64, heads=2, d_qk=16,
                d_hv=16, chunk_size=None, embedding_dim=32, warmup=1, iterations=3, timeout_s=30,
                numerics_max_seq_len=32)
    base.update(over)
    return Case(**base)


def test_measure_case_times_a_correct_kernel():
    out = measure_case(_case())
    assert out["status"] == "ok"
    assert out["n_iter"] == 3 and len(json.loads(out["ms_samples"])) == 3
    assert out["ms_min"] <= out["ms_median"] <= out["ms_max"]
    assert out["first_call_s"] > 0 and out["numerics_err"] < 1e-5
    assert out["peak_mem_bytes"] is None  # no device memory statistics on the CPU


def test_measure_case_reports_wrong_kernel_without_timings():
    out = measure_case(_case(params={"flaw": "output"}))
    assert out["status"] == "wrong" and out["numerics_err"] == pytest.approx(0.05, rel=1e-3)
    assert "ms_median" not in out


def test_measure_case_reports_cuda_case_without_gpu_as_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = measure_case(_case(device="cuda"))
    assert out["status"] == "unavailable" and "CUDA" in out["reason"]


def test_host_ms_per_call_is_the_median_host_time_and_clears_before_each(monkeypatch):
    """host_ms_per_call: one synchronise before each call, the median of the calls' host times."""
    import time as _time

    import torch

    from tflabench.run.measure import host_ms_per_call

    syncs, cleared, delays = [], [], iter([0.001, 0.030, 0.002, 0.003, 0.004])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    got = host_ms_per_call(lambda: _time.sleep(next(delays)), lambda: cleared.append(1), calls=5)
    assert len(cleared) == 5 and len(syncs) == 6
    assert 2.9 <= got < 25.0   # the median (3 ms), not the 30 ms outlier nor the mean
    with pytest.raises(ValueError, match="calls"):
        host_ms_per_call(lambda: None, calls=0)
