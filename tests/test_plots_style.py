"""The figures' look: colour-blind-safe colours and a marker per kernel family, ours told
from the authors', plain log ticks, labels that do not collide, a heat map keyed to the
budget. Asserts on the styles and on drawn matplotlib artists, not on pixels."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from matplotlib.colors import to_rgb

from tflabench.report.plots import style

FIG4 = [  # (label, backend, params) of the paper's Figure-4 suite
    ("mLSTMsig TFLA xl_chunk (ours)", "tfla", {"variant": "sig", "algorithm": "xl_chunk"}),
    ("mLSTMexp TFLA xl_chunk (ours)", "tfla", {"variant": "exp", "algorithm": "xl_chunk"}),
    ("mLSTMexp limit_chunk (ours)", "tfla", {"variant": "exp", "algorithm": "limit_chunk"}),
    ("mLSTMsig TFLA xl_chunk (mlstm_kernels)", "mlstm_kernels", {"variant": "sig", "algorithm": "xl_chunk"}),
    ("mLSTMexp TFLA xl_chunk (mlstm_kernels)", "mlstm_kernels", {"variant": "exp", "algorithm": "xl_chunk"}),
    ("mLSTMexp limit_chunk (mlstm_kernels)", "mlstm_kernels", {"variant": "exp", "algorithm": "limit_chunk"}),
    ("Simple GLA (FLA chunk)", "fla", {"kernel": "simple_gla"}),
    ("GLA (FLA chunk)", "fla", {"kernel": "chunk_gla"}),
    ("FlashAttention 3", "fa3", {}),
    ("Torch FlashAttention (SDPA flash)", "sdpa", {"impl": "flash"}),
    ("cuDNN FlashAttention (SDPA cudnn)", "sdpa", {"impl": "cudnn"}),
    ("Mamba 2 (SSD)", "mamba2", {}),
]


def test_figure4_kernels_get_a_colour_and_marker_per_family_ours_filled_the_authors_hollow():
    styles = style.kernel_styles(FIG4)
    ours = {k: s for k, s in styles.items() if "(ours)" in k}
    authors = {k: s for k, s in styles.items() if "(mlstm_kernels)" in k}
    assert all(s.ours for s in ours.values()) and not any(s.ours for k, s in styles.items() if k not in ours)
    for label, st in ours.items():  # the authors' kernel of one algorithm: same colour and marker...
        twin = authors[label.replace("(ours)", "(mlstm_kernels)")]
        assert (twin.color, twin.marker) == (st.color, st.marker)
        line, twin_line = st.line(), twin.line()  # ...told apart by line and fill
        assert line["linestyle"] == "-" and twin_line["linestyle"] != "-"
        assert line["markerfacecolor"] == st.color and twin_line["markerfacecolor"] == "white"
    families = {(s.color, s.marker) for s in styles.values()}
    assert len(families) == 9  # 3 mLSTM algorithms + 6 peers, each its own colour and marker
    assert len({c for c, _ in families}) == 9 and len({m for _, m in families}) == 9
    # no pale yellow, no near-white: every colour visible on white
    assert all(sum(to_rgb(c)) < 2.4 for c, _ in families)
    assert list(ours.values())[0].color == style.PALETTE[0]  # ours take the first colours


def test_ours_under_chunk_size_auto_is_drawn_apart_from_ours_at_a_fixed_chunk():
    kernels = FIG4[:1] + [("mLSTMsig TFLA auto (ours)", "tfla",
                           {"variant": "sig", "algorithm": "xl_chunk", "chunk_size": "auto"})] + FIG4[3:4]
    styles = style.kernel_styles(kernels)
    auto, fixed = styles["mLSTMsig TFLA auto (ours)"], styles["mLSTMsig TFLA xl_chunk (ours)"]
    assert auto.ours and (auto.color, auto.marker) != (fixed.color, fixed.marker)
    twin = styles["mLSTMsig TFLA xl_chunk (mlstm_kernels)"]  # the fixed chunk keeps its twin
    assert (twin.color, twin.marker) == (fixed.color, fixed.marker)
    # params as a result set stores them (JSON with a quoted "auto") give the same families
    as_json = style.kernel_styles([(k, b, json.dumps(p)) for k, b, p in kernels])
    assert as_json == styles


def test_labels_without_backend_fall_back_to_the_ours_and_authors_notes():
    styles = style.kernel_styles([(label, None, None) for label, _, _ in FIG4[:6]])
    assert styles["mLSTMsig TFLA xl_chunk (ours)"].color == styles["mLSTMsig TFLA xl_chunk (mlstm_kernels)"].color
    assert styles["mLSTMsig TFLA xl_chunk (ours)"].ours and not styles["mLSTMsig TFLA xl_chunk (mlstm_kernels)"].ours


@pytest.mark.parametrize("value, text", [(1024, "1024"), (65536, "64k"), (0.5, "0.5"), (1.7, "1.7"),
                                         (300, "300"), (1e6, "1e+06")])
def test_tick_text_is_plain(value, text):
    assert style.tick_text(value) == text


def test_a_narrow_log_axis_gets_several_plain_labels_and_no_powers_of_ten():
    from tflabench.report.plots import new_figure

    fig, ax = new_figure()
    ax.plot([1, 2], [1.02, 1.68])
    ax.set_yscale("log")
    style.log_axis(ax, "y")
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    lo, hi = ax.get_ylim()
    visible = [t for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi and t.get_text()]
    assert len(visible) >= 3
    assert not any("10^" in t or "times" in t or "×" in t for t in labels)


def test_place_labels_keeps_nearly_equal_values_apart():
    from tflabench.report.plots import new_figure

    fig, ax = new_figure()
    ax.set_yscale("log")
    ax.set_ylim(1, 2000)
    fig.canvas.draw()
    placed = style.place_labels(ax, [(295.2, "H100"), (292.2, "B200"), (161.2, "A100")], axis="y", min_gap_pt=10)
    pts = sorted(ax.transData.transform((0, p[1]))[1] * 72 / fig.dpi for p in placed)
    assert all(b - a >= 10 - 1e-6 for a, b in zip(pts, pts[1:]))
    assert placed[2][1] == pytest.approx(161.2)  # a label with room stays where its line is


def test_intensity_figure_names_each_gpu_in_its_own_colour(tmp_path):
    from tflabench.hardware import get_gpu
    from tflabench.model import chunkwise_coefficients
    from tflabench.report.plots import analytic

    drawn = {}
    original = analytic.save_figure

    def keep(fig, path):
        drawn["fig"] = fig
        return original(fig, path)

    gpus = [get_gpu(k) for k in ("v100", "a100", "h100", "b200")]
    co = chunkwise_coefficients("sig", d_hv=512, p_qk=0.5, F_causal=0.66, bytes_Cmn=4)
    curves = [{"label": "fp32, F_c=0.66", "bytes_Cmn": 4, "F_causal": 0.66, "coefficients": co,
               "intensity": {64: 30.0}}]
    analytic.save_figure = keep
    try:
        analytic.intensity_figure(curves, gpus, S=8192, path=tmp_path / "i.png")
    finally:
        analytic.save_figure = original
    ax = drawn["fig"].axes[0]
    texts = {t.get_text(): t for t in ax.texts}
    for g in gpus:
        (label,) = [t for name, t in texts.items() if name.startswith(g.name)]
        assert f"{g.intensity_flop_per_byte:.1f}" in label.get_text()
    colours = {texts[n].get_color() for n in texts}
    assert len(colours) == len(gpus)


def test_heatmap_colours_follow_the_budget_and_the_key_explains_grey(tmp_path):
    from tflabench.report.plots.numerics import BUDGET_STEPS, heatmap_title, write_heatmap

    rows = []
    for regime, err in (("standard", 1e-4), ("f_open", 5e-3), ("f_closed", 3e-2)):
        rows.append(dict(kernel="k", dtype="bfloat16", numerics_case=regime, status="wrong" if err > 1e-2 else "ok",
                         numerics_err=err, numerics_budget=1e-2, numerics_worst="df", numerics_nonfinite=0,
                         seq_len=64, mode="fwd", reason=None))
    rows.append(dict(kernel="attn", dtype="bfloat16", numerics_case="standard", status="ok", numerics_err=1e-3,
                     numerics_budget=1e-2, numerics_worst="out", numerics_nonfinite=0, seq_len=64, mode="fwd",
                     reason=None))
    path = write_heatmap(pd.DataFrame(rows), tmp_path / "h.png",
                         title=heatmap_title({"suite": "demo-verify", "gpu_name": None, "device": "cpu"}))
    assert path.stat().st_size > 10_000
    assert BUDGET_STEPS[5] == 1.0  # the colour changes at the budget
    assert heatmap_title({"suite": "demo-verify", "device": "cpu"}).startswith("Numerics of suite demo · measured on the CPU")


def test_runtime_plot_puts_its_legend_outside_the_axes(runtime_figure):
    fig = runtime_figure(FIG4[:4])
    assert fig.legends and not any(ax.get_legend() for ax in fig.axes)
    fig.canvas.draw()
    legend_box = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not legend_box.overlaps(ax.get_window_extent())
