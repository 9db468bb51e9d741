"""Every figure kind at its default size: no text box overlaps another or leaves the canvas.

Each figure is caught just before it is written (``save_figure`` of its module wrapped),
drawn, and every visible, non-empty text artist (titles, axis labels, drawn tick labels,
legend entries, annotations) is measured with ``get_window_extent``.
"""

from __future__ import annotations

import json

import pytest

from tflabench.analysis import model_vs_measured as mm
from tflabench.store import results as R
from tflabench.store.schema import new_row
from tflabench.hardware import get_gpu

#: Overlap or overhang (pixels) put down to rounding, not to a collision.
SLACK_PX = 1.0


def text_boxes(fig) -> list[tuple[str, object]]:
    """(text, window extent) of each text a reader sees in ``fig`` (after drawing it): tick
    labels only of the ticks drawn, the text part of an annotation without its arrow."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: the Agg canvas save_figure uses
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    tick_labels, drawn = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels |= {id(tick.label1), id(tick.label2)}
            for tick in axis._update_ticks():  # the ticks inside the view, as drawn
                drawn += [t for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text().strip()]
    texts = [t for t in fig.findobj(Text) if id(t) not in tick_labels and t.get_visible() and t.get_text().strip()]
    return [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts + drawn]


def layout_problems(fig) -> list[str]:
    """Texts that overlap each other or reach past the canvas, worded (empty: none)."""
    boxes = text_boxes(fig)
    width, height = fig.canvas.get_width_height()
    problems = []
    for text, b in boxes:
        if b.x0 < -SLACK_PX or b.y0 < -SLACK_PX or b.x1 > width + SLACK_PX or b.y1 > height + SLACK_PX:
            problems.append(f"{text!r} leaves the canvas {width}x{height}: {b}")
    for i, (t1, b1) in enumerate(boxes):
        for t2, b2 in boxes[i + 1:]:
            dx = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
            dy = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
            if dx > SLACK_PX and dy > SLACK_PX:
                problems.append(f"{t1!r} overlaps {t2!r}")
    return problems


@pytest.fixture
def checked(monkeypatch):
    """Wrap ``save_figure`` in every figure module: each figure's layout problems are
    collected under its file name before it is written."""
    import tflabench.report.plots as plots
    from tflabench.report.plots import analytic, benchmark, model_measured

    found: dict[str, list[str]] = {}
    original = plots.save_figure

    def save(fig, path, **kw):
        found[str(getattr(path, "name", path))] = layout_problems(fig)
        return original(fig, path, **kw)

    for module in (plots, analytic, benchmark, model_measured):
        if hasattr(module, "save_figure"):
            monkeypatch.setattr(module, "save_figure", save)
    return found


def test_the_checker_sees_an_overlap_and_a_clipped_title():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.text(0.5, 0.5, "first label")
    ax.text(0.52, 0.5, "second label")
    ax.set_title("a title much too long to fit a figure three inches wide at the default size")
    problems = layout_problems(fig)
    assert any("overlaps" in p for p in problems)
    assert any("leaves the canvas" in p for p in problems)


def test_analytic_figures_at_default_size(tmp_path, checked):
    from typer.testing import CliRunner

    from tflabench.cli import app as cli

    runner = CliRunner()
    for args in (["intensity"], ["roofline"], ["roofline", "--gpu", "h100,h200", "--peers"],
                 ["optimal-chunk"], ["intensity", "--state-bytes", "4,2", "--causal-factor", "0.5,0.66,1"],
                 ["roofline", "--dhv", "256,512", "--mode", "fwd,fwdbw"]):
        r = runner.invoke(cli, [*args, "--out", str(tmp_path)])
        assert r.exit_code == 0, (args, r.output)
    assert {"intensity_sig_dhv512.png", "roofline_h100_h200_sig_fwd.png", "optimal_chunk_sig.png"} <= set(checked)
    assert {name: p for name, p in checked.items() if p} == {}


def _row(kernel, backend, L, S, ms, mode="fwd", peak=None, chunk="fixed"):
    shape = dict(batch=65536 // S, seq_len=S, heads=8, d_qk=256, d_hv=512)
    params = {"chunk_size": "auto" if chunk == "auto" else L, "variant": "sig"}
    row = new_row(suite="h100_7b", kernel=kernel, backend=backend, family="mlstm", params=params, mode=mode,
                    dtype="bfloat16", device="cuda", chunk_size=L, embedding_dim=8 * 512, **shape)
    c = mm.model_counts_at("sig", mode, L, **shape, F_causal=0.5)
    row.update(status="ok", ms_median=ms, flops=c.flops, bytes=c.bytes, peak_mem_bytes=peak,
               ms_q25=ms * 0.98, ms_q75=ms * 1.02)
    return row


def _fake_set(tmp_path):
    """A small result set measured on an H200 with a suite named after the H100: two kernels
    swept over L at one shape (the chunk-sweep figure), over S at L 128, and an auto row."""
    rows = []
    for kernel, backend, scale in (("mLSTMsig TFLA xl_chunk (ours)", "tfla", 1.0),
                                   ("mLSTMsig TFLA xl_chunk (mlstm_kernels)", "mlstm_kernels", 1.6)):
        for mode in ("fwd", "fwdbw"):
            for L, ms in ((64, 7.4), (128, 6.4), (256, 6.3), (512, 7.3)):
                rows.append(_row(kernel, backend, L, 8192, ms * scale * (2.5 if mode == "fwdbw" else 1),
                                 mode=mode, peak=int(2**30 * 4096 / L)))
            for S in (1024, 2048, 4096, 16384):
                rows.append(_row(kernel, backend, 128, S, 6.0 * scale * (0.7 if S == 16384 else 1), mode=mode))
    rows.append(_row("mLSTMsig TFLA auto (ours)", "tfla", 64, 8192, 5.0, chunk="auto"))
    meta = {"suite": "h100_7b", "gpu_name": "NVIDIA H200", "gpu_count": 1}
    return R.write_results(tmp_path / "set", rows, meta)


def test_result_set_figures_at_default_size(tmp_path, checked):
    from tflabench.report.plots.benchmark import write_plots

    directory = _fake_set(tmp_path)
    written = write_plots(directory, tmp_path / "plots")
    names = {p.name for p in written}
    assert {"runtime.png", "memory_vs_runtime.png", "roofline_measured.png", "optimal_chunk.png"} <= names
    assert {name: p for name, p in checked.items() if p} == {}


def test_roofline_with_measured_points_names_suite_and_gpu_apart(tmp_path, checked):
    from typer.testing import CliRunner

    from tflabench.cli import app as cli

    directory = _fake_set(tmp_path)
    r = CliRunner().invoke(cli, ["roofline", "--results", str(directory), "--out", str(tmp_path / "figs"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["measured_gpu"]["key"] == "h200"          # the set's GPU, not the first of the defaults
    assert {name: p for name, p in checked.items() if p} == {}
    assert "roofline_h100_h200_sig_fwd_measured.png" in checked


def test_auto_chunk_rows_sit_at_the_intensity_of_the_chunk_that_ran(tmp_path):
    g = get_gpu("h100")
    fixed = _row("fixed", "tfla", 128, 8192, 5.0)
    auto = _row("auto", "tfla", 64, 8192, 5.0, chunk="auto")
    at128 = mm.model_counts_at("sig", "fwd", 128, batch=8, seq_len=8192, heads=8, d_qk=256, d_hv=512, F_causal=0.5)
    auto.update(flops=at128.flops, bytes=at128.bytes)   # counted at an assumed L 128, ran at 64
    placed = {p["kernel"]: p for p in mm.roofline_placement([fixed, auto], peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s)}
    at64 = mm.model_counts_at("sig", "fwd", 64, batch=8, seq_len=8192, heads=8, d_qk=256, d_hv=512, F_causal=0.5)
    assert placed["auto"]["intensity_flop_per_byte"] == pytest.approx(at64.flops / at64.bytes)
    assert placed["fixed"]["intensity_flop_per_byte"] == pytest.approx(at128.flops / at128.bytes)
    assert placed["auto"]["intensity_flop_per_byte"] < placed["fixed"]["intensity_flop_per_byte"]


def test_titles_name_the_suite_and_the_gpu_apart():
    from tflabench.report.plots.numerics import heatmap_title
    from tflabench.report.plots.style import set_label

    assert set_label({"suite": "h100_7b", "gpu_name": "NVIDIA H200"}) == "suite h100_7b · measured on NVIDIA H200"
    assert set_label({"suite": "cpu_demo", "gpu_name": None}) == "suite cpu_demo · measured on the CPU"
    assert "suite h100_7b · measured on NVIDIA H200" in heatmap_title({"suite": "h100_7b-verify",
                                                                       "gpu_name": "NVIDIA H200"})


def test_numerics_heat_map_at_default_size(tmp_path, monkeypatch):
    import pandas as pd

    from tflabench.report.plots import numerics

    found = {}
    original = numerics.save_figure

    def save(fig, path, **kw):
        found["heatmap"] = layout_problems(fig)
        return original(fig, path, **kw)

    monkeypatch.setattr(numerics, "save_figure", save)
    rows = [dict(kernel=k, dtype=d, numerics_case=regime, status="ok", numerics_err=err, numerics_budget=1e-2,
                 numerics_worst="df", numerics_nonfinite=0, seq_len=64, mode="fwd", reason=None)
            for k in ("mLSTMsig TFLA xl_chunk (ours)", "mLSTMexp TFLA xl_chunk (ours)")
            for d in ("float32", "bfloat16")
            for regime, err in (("standard", 1e-4), ("f_open", 5e-3), ("f_closed+init", 3e-3))]
    numerics.write_heatmap(pd.DataFrame(rows), tmp_path / "h.png",
                           title=numerics.heatmap_title({"suite": "verify_cpu-verify", "gpu_name": None}))
    assert found == {"heatmap": []}
