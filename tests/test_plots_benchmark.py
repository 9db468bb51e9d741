"""The runtime figure's x-axis follows what a result set sweeps (tflabench.report.plots.benchmark)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tflabench.report.plots.benchmark import _series_labels, plot_runtime, runtime_axis


def _rows(sweep: str) -> pd.DataFrame:
    """ok rows of two kernels, fwd and fwdbw: a head-dimension sweep at fixed S (the paper's
    Figure 14) or a fixed-token sequence-length sweep (Figure 4) at two head sizes."""
    rows = []
    for kernel, backend in (("ours", "tfla"), ("peer", "fla")):
        for mode in ("fwd", "fwdbw"):
            if sweep == "d_hv":
                points = [(8192, 4, d) for d in (32, 64, 128, 256)]
            else:
                points = [(S, 65536 // S, d) for S in (1024, 2048, 4096) for d in (128, 256)]
            for S, B, d in points:
                rows.append(dict(kernel=kernel, backend=backend, mode=mode, status="ok",
                                 seq_len=float(S), batch=float(B), d_hv=float(d),
                                 chunk_size=128.0, ms_median=0.001 * S * d / 128,
                                 params=json.dumps({"d_hv": d, "chunk_size": 128})))
    return pd.DataFrame(rows)


def test_head_dimension_sweeps_are_drawn_over_d_hv(tmp_path):
    frame = _rows("d_hv")
    assert runtime_axis(frame)[:2] == ("d_hv", "d_hv")
    # one line per kernel, not one point per head dimension
    assert set(_series_labels(frame, exclude=("d_hv",))) == {"ours", "peer"}
    out = plot_runtime(frame, tmp_path / "runtime.png")
    assert out is not None and out.stat().st_size > 0


def test_sequence_length_sweeps_stay_over_s_with_a_line_per_head_size(tmp_path):
    frame = _rows("seq_len")
    assert runtime_axis(frame)[0] == "seq_len"
    labels = set(_series_labels(frame))
    assert labels == {"ours (d_hv=128)", "ours (d_hv=256)", "peer (d_hv=128)", "peer (d_hv=256)"}
    assert plot_runtime(frame, tmp_path / "runtime.png") is not None


@pytest.mark.parametrize("column", ["chunk_size", "batch"])
def test_other_sweeps_pick_their_axis_and_a_single_point_falls_back_to_s(column):
    frame = _rows("d_hv")
    frame = frame[frame["d_hv"] == 128].copy()
    assert runtime_axis(frame)[0] == "seq_len"     # nothing varies: Figure 4's axis
    frame[column] = [16.0 * (n % 3 + 1) for n in range(len(frame))]
    assert runtime_axis(frame)[0] == column


def _sweep_rows(n_shapes: int) -> pd.DataFrame:
    """ok rows of our kernel at chunk sizes 64, 128, 256 for ``n_shapes`` batch sizes (one
    (kernel, shape) series each), fwd and fwdbw, with runtime and peak memory."""
    rows = []
    for b in range(1, n_shapes + 1):
        for mode in ("fwd", "fwdbw"):
            for L in (64, 128, 256):
                rows.append(dict(kernel="ours", backend="tfla", mode=mode, status="ok", dtype="bfloat16",
                                 seq_len=8192.0, batch=float(b), heads=8.0, d_qk=128.0, d_hv=256.0,
                                 chunk_size=float(L), ms_median=b * (1 + abs(L - 128) / 256),
                                 peak_mem_bytes=float(b * 2**30 * 256 // L),
                                 params=json.dumps({"chunk_size": L})))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("n_shapes", [3, 12])
def test_memory_runtime_figure_stays_readable_for_many_series(n_shapes, tmp_path, monkeypatch):
    """Up to MAX_SWEEP_SERIES (kernel, shape) series: one legend entry per series (Figure 5).
    Past it: one legend entry per chunk size, each series relative to its own fastest and
    smallest point (the fastest at 1.0 on the x-axis), so the legend no longer grows with
    the shapes."""
    from tflabench.report.plots import benchmark

    figures = []
    monkeypatch.setattr(benchmark, "save_figure", lambda fig, path: figures.append(fig) or path)
    assert benchmark.plot_memory_runtime(_sweep_rows(n_shapes), tmp_path / "m.png") is not None
    (fig,) = figures
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    if n_shapes <= benchmark.MAX_SWEEP_SERIES:
        assert len(legend) == n_shapes and all(t.startswith("ours (B=") for t in legend)
        return
    assert legend == ["L=64", "L=128", "L=256"]
    for ax in fig.axes:
        assert "fastest" in ax.get_xlabel() and f"{n_shapes} kernel and shape series" in ax.get_title()
        xs = [x for c in ax.collections for x, _ in c.get_offsets()]
        assert len(xs) == 3 * n_shapes and min(xs) == 1.0
