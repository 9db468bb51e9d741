"""The model meets the measurement: chunk-size sweeps against eqs. 111/116/121, per-shape
roofline placement, the distance-to-the-bound table, the figures and the HTML report.

Expected values come from docs/model-counts.md's oracles (O2, O3, O4, §7 measured H100
runtimes; named per test) or are computed by hand in the test from the roofline formula
P(I) = min(beta·I, peak_flops_per_s) (eq. 119).
"""

from __future__ import annotations

import base64
import html.parser
import json
import math

import pytest
from typer.testing import CliRunner

from tflabench.analysis import model_vs_measured as mm
from tflabench.store import results as R
from tflabench.store.schema import fill_model_columns, new_row
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.hardware import get_gpu

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("isolated_cwd")   # tests/conftest.py

H100 = dict(peak_flops_per_s=989e12, beta=3.35e12)            # paper Table 18
FIG17 = dict(batch=8, seq_len=8192, heads=8, d_qk=256, d_hv=512)   # paper Figs. 5, 17 (§6.4)
#: §7: the authors' measured H100 forward runtimes (ms) of TFLA mLSTMsig at the Fig. 17 shape.
H100_FWD_MS = {64: 7.411136, 128: 6.376000, 256: 6.301056, 512: 7.300192, 1024: 9.552736}


def close(value: float, printed: str, rel: float = 1e-6) -> bool:
    """Half a unit in the last printed digit plus ``rel`` relative (docs/model-counts.md §6)."""
    digits = printed.split("e")[0]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    exp = int(printed.split("e")[1]) if "e" in printed else 0
    return abs(value - float(printed)) <= 0.5 * 10 ** (exp - decimals) + rel * abs(float(printed))


def _row(kernel="sig sweep", *, L=128, ms=1.0, mode="fwd", family="mlstm", status="ok", shape=FIG17,
         flops=None, nbytes=None, peak=None, variant="sig"):
    row = new_row(suite="s", kernel=kernel, backend="tfla", family=family,
                    params={"chunk_size": L, "variant": variant}, mode=mode, dtype="bfloat16", device="cuda",
                    chunk_size=L, embedding_dim=shape["heads"] * shape["d_hv"], **shape)
    row.update(status=status, ms_median=ms if status == "ok" else None, flops=flops, bytes=nbytes,
               peak_mem_bytes=peak)
    return row


# ------------------------------------------------------------------ the model at one shape


def test_model_optima_at_the_fig17_shape_are_eqs_111_121_and_the_ridge():
    o = mm.model_optima("sig", "fwd", **FIG17, **H100, F_causal=0.66, counts="paper")
    assert close(o["L_opt_flop"], "16.042")           # O2, d_hv 512, p_qk .5, F_c .66
    assert close(o["L_opt_runtime"], "551.48")        # O3, H100, bytes_Cmn 4, d_hv 512
    assert close(o["L_opt_runtime_max"], "1098.4")    # O4 argmin(max), H100, F_c .66
    assert close(o["I_acc"], "295.224")               # §5 Table 18 exact


def test_model_runtime_curve_is_eq_116_sum_form_and_eq_114_max_form():
    for L, printed in ((64, "3.602"), (128, "2.353"), (256, "1.781"), (1024, "1.714")):  # O4 H100 F_c .66
        c = mm.model_counts_at("sig", "fwd", L, **FIG17, F_causal=0.66, counts="paper")
        assert close(mm.model_ms(c, **H100), printed), L
    c = mm.model_counts_at("sig", "fwd", 256, **FIG17, F_causal=0.66, counts="paper")
    assert close(mm.model_ms(c, **H100, combine="max"), "1.363")   # O4 max form at L = 256


def test_fwdbw_optimum_is_the_argmin_of_the_derived_model():
    o = mm.model_optima("sig", "fwdbw", **FIG17, **H100, F_causal=0.66)

    def ms(L):
        return mm.model_ms(mm.model_counts_at("sig", "fwdbw", L, **FIG17, F_causal=0.66, chunks="real"), **H100)

    L = o["L_opt_runtime"]
    assert ms(L) <= ms(L * 1.05) and ms(L) <= ms(L / 1.05)
    assert "derived" in o["source"]
    fwd = mm.model_optima("sig", "fwd", **FIG17, **H100, F_causal=0.66)
    assert abs(L / fwd["L_opt_runtime"] - 1) > 1e-3  # the backward moves it


# ------------------------------------------------------------------ chunk-size sweeps


def test_sweep_of_the_papers_h100_runtimes_gives_measured_optimum_256_and_model_551():
    rows = [_row(L=L, ms=ms, peak=2**30) for L, ms in H100_FWD_MS.items()]
    rows.append(_row(L=2048, ms=1.0, status="crash"))          # not measured: left out
    (s,) = mm.chunk_sweeps(rows, **H100, F_causal=0.66, counts="paper")
    assert s.measured_L_opt == 256 and s.measured_ms_opt == pytest.approx(6.301056)   # §7
    assert [p["L"] for p in s.points] == [64, 128, 256, 512, 1024]
    assert close(s.optima["L_opt_runtime"], "551.48")                                # O3
    assert s.model_L_pow2 == 512                       # O4: 1.598 ms at 512 is the lowest swept
    p256 = next(p for p in s.points if p["L"] == 256)
    assert p256["ratio_sum"] == pytest.approx(6.301056 / p256["model_ms_sum"])
    assert close(p256["model_ms_sum"], "1.781")                                      # O4
    assert p256["peak_mem_bytes"] == 2**30


def test_sweeps_need_two_chunk_sizes_an_mlstm_family_and_one_shape():
    one_L = [_row(L=128, ms=1.0)]
    other_family = [_row(kernel="gla", L=L, ms=1.0, family="gla") for L in (64, 128)]
    two_shapes = [_row(kernel="k", L=64, ms=1.0), _row(kernel="k", L=128, ms=1.0, shape=dict(FIG17, seq_len=4096))]
    assert mm.chunk_sweeps(one_L + other_family + two_shapes, **H100) == []
    with pytest.raises(UserError, match="two or more chunk sizes"):
        mm.analyse_chunk_sweep([_row()], variant="sig", **H100, shape=FIG17)


def test_each_mode_and_kernel_is_its_own_sweep():
    rows = [_row(kernel=k, L=L, ms=ms + (1 if k == "b" else 0), mode=m)
            for k in ("a", "b") for m in ("fwd", "fwdbw") for L, ms in ((64, 3.0), (128, 2.0), (256, 4.0))]
    sweeps = mm.chunk_sweeps(rows, **H100)
    assert sorted((s.kernel, s.mode) for s in sweeps) == [("a", "fwd"), ("a", "fwdbw"), ("b", "fwd"), ("b", "fwdbw")]
    assert all(s.measured_L_opt == 128 for s in sweeps)


# ------------------------------------------------------------------ roofline at each row's own shape


def test_each_row_is_placed_against_the_bound_at_its_own_intensity():
    g = get_gpu("h200")                                   # datasheet: 989e12 FLOP/s, 4.8e12 byte/s
    rows = [
        _row(kernel="k", L=64, ms=5.0, flops=1e12, nbytes=1e10),           # I = 100: memory-bound
        _row(kernel="k", L=128, ms=2.0, flops=1e12, nbytes=1e9),           # I = 1000: compute-bound
        _row(kernel="k", L=256, ms=2.0, status="crash", flops=1e12, nbytes=1e9),   # not measured
        _row(kernel="custom", L=32, ms=2.0),                                # no model counts
    ]
    pl = mm.roofline_placement(rows, peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s)
    assert [p["case"] for p in pl] == ["B8 S8192 NH8 d256/512 L64", "B8 S8192 NH8 d256/512 L128"]
    mem, comp = pl
    assert mem["bound"] == "memory" and comp["bound"] == "compute"
    assert mem["bound_flops_per_s"] == pytest.approx(4.8e12 * 100)         # beta·I
    assert mem["fraction"] == pytest.approx((1e12 / 5e-3) / 4.8e14)       # 0.41667
    assert comp["bound_flops_per_s"] == pytest.approx(989e12)             # peak_flops_per_s
    assert comp["fraction"] == pytest.approx((1e12 / 2e-3) / 989e12)
    # the same number as the result column roofline_fraction under the same ceilings
    filled = fill_model_columns(dict(rows[0]), g.flops_per_s, g.bytes_per_s)
    assert filled["roofline_fraction"] == pytest.approx(mem["fraction"])


def test_outliers_and_distance_to_the_bound_per_kernel_and_mode():
    pts = [{"kernel": "k", "mode": "fwd", "case": f"S={s}", "fraction": f, "bound": "memory"}
           for s, f in ((512, 0.50), (1024, 0.52), (2048, 0.48), (65536, 0.20))]
    pts.append({"kernel": "k", "mode": "fwdbw", "case": "S=512", "fraction": 0.7, "bound": "compute"})
    mm.mark_outliers(pts)
    assert [p["outlier"] for p in pts] == [False, False, False, True, False]
    d = {(x["kernel"], x["mode"]): x for x in mm.distance_to_bound(pts)}
    fwd = d[("k", "fwd")]
    assert fwd["n"] == 4 and fwd["median_fraction"] == pytest.approx(0.49)
    assert (fwd["worst_case"], fwd["worst_fraction"]) == ("S=65536", 0.20)
    assert (fwd["best_case"], fwd["best_fraction"]) == ("S=1024", 0.52)
    assert d[("k", "fwdbw")]["bound"] == "compute"


def test_ceilings_for_a_cpu_set_or_an_unknown_gpu_say_what_to_do():
    with pytest.raises(UserError, match="--gpu"):
        mm.ceilings_for({"gpu_name": None})
    with pytest.raises(UserError, match="not in the catalogue"):
        mm.ceilings_for({"gpu_name": "Some Future GPU"})
    assert mm.ceilings_for({"gpu_name": "NVIDIA H200"}).ceilings == "measured"      # auto: recorded
    assert mm.ceilings_for({"gpu_name": "NVIDIA H100 80GB HBM3"}).ceilings == "datasheet"


# ------------------------------------------------------------------ figures


def test_figures_are_written_and_refuse_empty_input(tmp_path):
    from tflabench.report.plots.model_measured import chunk_sweep_figure, roofline_measured_figure

    g = get_gpu("h200")
    rows = [_row(kernel=f"kernel {k}", L=64, ms=1.0 + k, flops=1e12, nbytes=1e10 * (k + 1),
                 shape=dict(FIG17, seq_len=512 * 2 ** k)) for k in range(8)]
    pl = mm.roofline_placement(rows, peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s)
    p = roofline_measured_figure(pl, g, path=tmp_path / "roof.png")
    assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 20_000
    sweeps = mm.chunk_sweeps([_row(L=L, ms=ms, peak=2**30) for L, ms in H100_FWD_MS.items()], **H100)
    p = chunk_sweep_figure(sweeps, path=tmp_path / "oc.png")
    assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 20_000
    with pytest.raises(UserError):
        roofline_measured_figure([], g, path=tmp_path / "x.png")
    with pytest.raises(UserError):
        chunk_sweep_figure([], path=tmp_path / "y.png")


def test_the_optimal_chunk_figure_draws_at_most_six_shapes_and_says_so(tmp_path):
    """A suite of 40 shapes gave a figure 256 inches wide: the figure keeps the first
    MAX_SWEEP_PANELS (shape, mode) columns and its title says how many were measured."""
    import matplotlib.image

    from tflabench.report.plots.model_measured import MAX_SWEEP_PANELS, chunk_sweep_figure

    rows = [_row(L=L, ms=ms * (1 + k / 10), peak=2**30, shape=dict(FIG17, seq_len=512 * 2 ** k))
            for k in range(MAX_SWEEP_PANELS + 2) for L, ms in H100_FWD_MS.items()]
    sweeps = mm.chunk_sweeps(rows, **H100)
    assert len({tuple(sorted(s.shape.items())) for s in sweeps}) == MAX_SWEEP_PANELS + 2
    p = chunk_sweep_figure(sweeps, path=tmp_path / "oc.png", title="t")
    width_in = matplotlib.image.imread(p).shape[1] / 150
    assert 6.4 * MAX_SWEEP_PANELS - 1 <= width_in <= 6.4 * MAX_SWEEP_PANELS + 1


# ------------------------------------------------------------------ report and its HTML


def _sweep_set(tmp_path, label="sig sweep"):
    rows = []
    for L, ms in H100_FWD_MS.items():
        c = mm.model_counts_at("sig", "fwd", L, **FIG17, F_causal=0.5)
        rows.append(_row(kernel=label, L=L, ms=ms, peak=2**30, flops=c.flops, nbytes=c.bytes))
    rows.append(_row(kernel=label, L=2048, ms=None, status="crash"))
    rows[-1]["reason"] = "worker died <killed by SIGABRT>"
    return R.write_results(tmp_path / "set", rows, {"suite": "sweep", "gpu_name": "NVIDIA H200", "torch": "2.11"})


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_report_html_is_self_contained_and_opens_without_network(tmp_path):
    directory = _sweep_set(tmp_path, label="sig <b>sweep</b>")
    out = tmp_path / "share" / "report.html"
    result = runner.invoke(app, ["report", str(directory), "--html", str(out), "--out", str(tmp_path / "plots")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(text)
    tags = parser.tags
    imgs = [a for t, a in tags if t == "img"]
    assert len(imgs) >= 3                       # runtime, roofline_measured, optimal_chunk (+ memory)
    for a in imgs:
        assert a["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(a["src"].split(",", 1)[1])[:4] == b"\x89PNG"
    assert not [t for t, _ in tags if t in ("script", "link", "iframe", "object", "embed")]
    for _, attrs in tags:                       # nothing fetched: no URL in any attribute
        for key, value in attrs.items():
            assert "://" not in (value or "") or key == "src" and value.startswith("data:"), (key, value)
    assert "url(" not in text and "@import" not in text
    assert "Distance to the bound" in text and "Optimal chunk size" in text
    assert "sig &lt;b&gt;sweep&lt;/b&gt;" in text and "<b>sweep</b>" not in text     # labels escaped
    assert "worker died &lt;killed by SIGABRT&gt;" in text


def test_report_prints_distance_and_optimum_tables_and_draws_the_optimal_chunk_figure(tmp_path):
    directory = _sweep_set(tmp_path)
    result = runner.invoke(app, ["report", str(directory), "--ceilings", "datasheet", "--out", str(tmp_path / "plots")],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "distance to the bound" in result.output and "optimal chunk size" in result.output
    assert "datasheet ceilings" in result.output
    for name in ("optimal_chunk.png", "roofline_measured.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_report_html_refuses_a_non_html_name_in_one_line(tmp_path):
    directory = _sweep_set(tmp_path)
    result = runner.invoke(app, ["report", str(directory), "--no-plots", "--html", str(tmp_path / "r.txt")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().startswith("error: --html=") and len(result.stderr.strip().splitlines()) == 1


def test_roofline_results_places_points_at_their_own_shapes(tmp_path):
    directory = _sweep_set(tmp_path)
    result = runner.invoke(app, ["roofline", "--gpu", "h200", "--results", str(directory), "--out",
                                 str(tmp_path), "--json", "--ceilings", "datasheet"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert len(d["placement"]) == 5 and d["distance_to_bound"][0]["n"] == 5
    assert {p["case"] for p in d["placement"]} == {f"B8 S8192 NH8 d256/512 L{L}" for L in H100_FWD_MS}
    for p in d["placement"]:   # each bound at its own intensity (datasheet H200)
        assert p["bound_flops_per_s"] == pytest.approx(min(4.8e12 * p["intensity_flop_per_byte"], 989e12))
    assert d["measured_plot"] == str((tmp_path / "roofline_h200_sig_fwd_measured.png").resolve())
    assert (tmp_path / "roofline_h200_sig_fwd_measured.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ optimal-chunk --measure


def test_optimal_chunk_measure_refuses_without_a_gpu_in_one_line(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["optimal-chunk", "--measure", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: optimal-chunk --measure needs a CUDA GPU") and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())     # nothing written


@pytest.mark.parametrize("args, text", [
    (["--kernel", "not a kernel"], "--kernel="),
    (["--dhv", "256,512"], "--measure sweeps one shape; give one value"),
    (["-L", "128"], "two or more chunk sizes"),
    (["-L", "64,3000"], "--chunk-size=3000"),
    (["--mode", "bwd"], "--mode="),
])
def test_optimal_chunk_measure_bad_input_exits_2(args, text):
    result = runner.invoke(app, ["optimal-chunk", "--measure", *args])
    assert result.exit_code == 2, result.output
    assert text in result.stderr and "Traceback" not in result.output


def test_sweep_suite_names_each_kernel_and_passes_its_chunk_sizes():
    from tflabench.run.chunk_measure import SweepSpec, sweep_suite

    suite = sweep_suite(SweepSpec(kernels=["ours", "mlstm_kernels", "mypkg.k:fn"], chunk_sizes=(128, 64)))
    assert [k["backend"] for k in suite["kernels"]] == ["tfla", "mlstm_kernels", "custom"]
    assert all(k["params"]["chunk_size"] == [64, 128] for k in suite["kernels"])
    assert suite["kernels"][1]["params"]["normalize"] is False          # the paper's mLSTMsig
    assert suite["sweep"] == {"batch": 8, "seq_len": 8192}
    assert suite["model"]["embedding_dim"] == 8 * 512


def test_measured_sweep_runs_through_the_run_machinery_on_the_cpu(tmp_path):
    """The library path behind --measure (the CLI refuses without a GPU): tfla's PyTorch
    reference at a tiny shape, each case in a worker, rows + model comparison."""
    from tflabench.run.chunk_measure import SweepSpec, measure_chunk_sweep

    spec = SweepSpec(kernels=["ours"], batch=1, seq_len=64, heads=1, d_qk=8, d_hv=16, chunk_sizes=(16, 32),
                     modes=("fwd",), dtype="float32", warmup=0, iterations=2)
    result, rs = measure_chunk_sweep(spec, out_root=tmp_path, device="cpu", progress=False)
    assert list(rs.rows["status"]) == ["ok", "ok"]
    assert (tmp_path / "suites" / f"{spec.name}.yaml").exists()
    assert rs.metadata["suite"] == spec.name
    g = mm.ceilings_for(rs.metadata, gpu="h200")
    (s,) = mm.chunk_sweeps(rs.rows, peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s)
    assert [p["L"] for p in s.points] == [16, 32]
    assert s.measured_L_opt in (16, 32) and all(math.isfinite(p["ratio_sum"]) for p in s.points)


def test_custom_mlstm_kernels_sweep_too_and_limit_chunk_uses_its_own_backward_split():
    custom = []
    for L, ms in ((64, 3.0), (128, 2.0)):
        r = _row(kernel="mine", L=L, ms=ms, family="custom")
        r["params"] = json.dumps({"function": "m:f", "layout": "mlstm", "variant": "sig", "chunk_size": L})
        custom.append(r)
    attention = [dict(r, kernel="attn", params=json.dumps({"function": "m:g", "layout": "attention"}))
                 for r in custom]
    (s,) = mm.chunk_sweeps(custom + attention, **H100)
    assert s.kernel == "mine" and s.measured_L_opt == 128
    limit = []
    for L in (64, 128):
        r = _row(kernel="lim", L=L, ms=5.0, mode="fwdbw", variant="exp")
        r["params"] = json.dumps({"variant": "exp", "algorithm": "limit_chunk", "chunk_size": L})
        limit.append(r)
    (s,) = mm.chunk_sweeps(limit, **H100)
    assert s.kernel_split == "limit_chunk"
    c = mm.model_counts_at("exp", "fwdbw", 64, **FIG17, kernel_split="limit_chunk")
    assert s.points[0]["model_ms_sum"] == pytest.approx(mm.model_ms(c, **H100))
    xl = mm.model_counts_at("exp", "fwdbw", 64, **FIG17)
    assert c.bytes != xl.bytes          # the split changes the backward's bytes (docs/model.md)


def test_measured_sweep_rendering_names_both_optima_and_the_ratio(tmp_path, capsys):
    """What optimal-chunk --measure prints after its GPU run (the rendering is reached only
    on a GPU through the CLI; here on a result set made of the paper's H100 runtimes)."""
    from tflabench.cli.analytic_cmds import _show_measured_sweep

    rows = [_row(L=L, ms=ms, peak=2**30) for L, ms in H100_FWD_MS.items()]
    rs = R.load_results(R.write_results(tmp_path / "set", rows, {"suite": "sweep", "gpu_name": "NVIDIA H100 80GB HBM3"}))
    _show_measured_sweep(rs, None, gpu=None, ceilings="auto", hardware=None, F_causal=0.66, counts="paper",
                         bytes_Cmn=4, plot_dir=tmp_path, figure_format="png", as_json=False)
    text = capsys.readouterr().out
    assert "measured optimum L=256" in text and "model L=551" in text        # §7 and O3
    assert "datasheet ceilings" in text                # the H100 has no measured ceilings recorded
    assert (tmp_path / "optimal_chunk_measured.png").read_bytes()[:4] == b"\x89PNG"
    _show_measured_sweep(rs, None, gpu="h100", ceilings="datasheet", hardware=None, F_causal=0.66, counts="paper",
                         bytes_Cmn=4, plot_dir=None, figure_format="png", as_json=True)
    d = json.loads(capsys.readouterr().out)
    assert d["sweeps"][0]["measured_L_opt"] == 256 and d["gpu"]["key"] == "h100"
