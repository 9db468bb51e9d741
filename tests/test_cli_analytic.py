"""The analytic commands through Typer's test runner: exit codes, JSON fields, plot files, bad input.

Expected numbers come from docs/model-counts.md's oracles (named per test) or from the library
function the command wraps (the CLI must not compute anything of its own).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tflabench.cli import app
from tflabench.model import mlstm_counts

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("isolated_cwd")   # tests/conftest.py


def run(*args):
    return runner.invoke(app, list(args))


def run_json(*args):
    r = run(*args, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def close_printed(value: float, printed: str) -> bool:
    mant, _, exp = printed.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return abs(value - float(printed)) <= 0.5 * 10.0 ** ((int(exp) if exp else 0) - decimals) + 1e-6 * abs(float(printed))


# ------------------------------------------------------------------ help and discovery


def test_root_help_lists_the_analytic_commands_and_each_help_has_an_example():
    r = run("--help")
    assert r.exit_code == 0
    for cmd in ("flops", "roofline", "intensity", "optimal-chunk", "gpus"):
        assert cmd in r.stdout
        h = run(cmd, "--help")
        assert h.exit_code == 0 and "Example" in h.stdout and f"tflabench {cmd}" in h.stdout


# ------------------------------------------------------------------ flops


def test_flops_json_reports_table_17_total_intensity_and_rows_O4():
    d = run_json("flops", "--variant", "sig", "-L", "256", "-T", "8192", "--batch", "8", "--heads", "8",
                 "--dhv", "512", "--pqk", "0.5", "--causal-factor", "0.66", "--counts", "paper")
    assert close_printed(d["flops"], "4.126877e11")  # O4 per-call totals
    assert close_printed(d["bytes"], "4.567597e9")
    assert close_printed(d["intensity_flop_per_byte"], "90.4")  # O5 d_hv 512, fp32 states, F_c .66
    assert set(d["flop_rows"]) >= {"gates", "numerator", "intra_outputs", "inter_outputs", "paper_table17_adjustment"}
    assert abs(sum(d["flop_rows"].values()) - d["flops"]) < 1e-6 * d["flops"]
    assert set(d["byte_rows"]) == {"recurrent_load", "recurrent_store", "parallel_load", "parallel_store"}
    assert d["config"]["d_qk"] == 256 and d["config"]["counts"] == "paper"


@pytest.mark.parametrize("form", ["parallel", "recurrent"])
def test_flops_other_formulations_match_the_library(form):
    d = run_json("flops", "--variant", "exp", "--formulation", form, "-T", "1024", "--dhv", "128", "--dqk", "64",
                 "--batch", "2", "--heads", "3", "--causal-factor", "0.5")
    c = mlstm_counts("exp", form, S=1024, d_hv=128, d_qk=64, B=2, NH=3, F_causal=0.5)
    assert d["flops"] == c.flops and d["bytes"] == c.bytes


def test_flops_fwdbw_pad_and_table_output():
    d = run_json("flops", "--mode", "fwdbw", "-L", "64", "-T", "1000", "--pad", "--dhv", "128")
    assert any(k.startswith("bwd_") for k in d["flop_rows"]) and any(k.startswith("fwd_") for k in d["flop_rows"])
    r = run("flops", "-L", "128", "--dhv", "256")
    assert r.exit_code == 0
    for word in ("numerator", "recurrent kernel", "parallel kernel", "total", "arithmetic intensity"):
        assert word in r.stdout


# ------------------------------------------------------------------ roofline


def _result_set(tmp_path):
    from tflabench.store.results import write_results

    rows = []
    for L, ms in ((64, 7.411136), (128, 6.376), (256, 6.301056)):  # §7 measured H100 forward runtimes
        c = mlstm_counts("sig", "chunkwise", S=8192, L=L, d_hv=512, d_qk=256, B=8, NH=8, F_causal=0.66)
        rows.append(dict(suite="s", kernel="tfla_sig", backend="tfla", family="mlstm", params={"chunk_size": L},
                         mode="fwd", dtype="bfloat16", device="cuda", batch=8, seq_len=8192, heads=8, d_qk=256,
                         d_hv=512, chunk_size=L, status="ok", ms_median=ms, flops=c.flops, bytes=c.bytes,
                         intensity_flop_per_byte=c.intensity_flop_per_byte,
                         tflops_per_s=c.flops / (ms * 1e-3) / 1e12))
    rows.append(dict(rows[-1], status="crash", chunk_size=512, params={"chunk_size": 512}))
    return write_results(tmp_path / "rs", rows, {"suite": "s"})


def test_roofline_json_points_plot_and_measured_points(tmp_path):
    rs = _result_set(tmp_path)
    d = run_json("roofline", "--gpu", "h100,h200", "-L", "64,128,256", "--results", str(rs),
                 "--out", str(tmp_path / "figs"))
    assert [g["key"] for g in d["gpus"]] == ["h100", "h200"]
    assert len(d["points"]) == 6
    p = next(p for p in d["points"] if p["gpu"] == "h100" and p["L"] == 256)
    assert close_printed(p["intensity_flop_per_byte"], "90.4")  # O5/O6
    assert close_printed(p["attainable_tflops_per_s"] * 1e12, "3.0268e14")  # O6 H100 roofline at I(.66)
    assert p["bound"] == "memory"
    assert close_printed(p["roofline_ms"], "1.363")  # O4 max form at L = 256
    assert close_printed(p["sum_form_ms"], "1.781")  # O4 eq. 116 at L = 256
    assert len(d["measured"]) == 3  # the crash row is left out
    assert close_printed(max(m["flops_per_s"] for m in d["measured"]), "6.5495e13")  # O6 FLOP/s at L = 256
    plot = tmp_path / "figs" / "roofline_h100_h200_sig_fwd.png"
    assert d["plot"] == str(plot.resolve()) and plot.stat().st_size > 10_000
    measured = tmp_path / "figs" / "roofline_h100_h200_sig_fwd_measured.png"
    assert d["measured_plot"] == str(measured.resolve()) and measured.stat().st_size > 10_000


def test_roofline_default_writes_png_under_results_plots_and_prints_the_path(tmp_path):
    r = run("roofline", "--gpu", "b200", "--peers", "--ceilings", "datasheet")
    assert r.exit_code == 0, r.stderr
    files = list((tmp_path / "results" / "plots").glob("roofline_*.png"))
    assert len(files) == 1 and files[0].stat().st_size > 10_000
    assert f"plot: {files[0].resolve()}" in r.stdout.replace("\n", "")  # where it wrote, absolute
    assert "FlashAttn" in r.stdout and "compute" in r.stdout and "memory" in r.stdout


def test_roofline_measured_ceilings_svg_and_fwdbw(tmp_path):
    d = run_json("roofline", "--gpu", "h200", "--ceilings", "measured", "--mode", "fwdbw", "-L", "128",
                 "--out", str(tmp_path), "--figure-format", "svg")
    assert d["gpus"][0]["flops_per_s"] == 772e12 and d["gpus"][0]["ceilings"] == "measured"
    assert (tmp_path / "roofline_h200_sig_fwdbw.svg").read_text().lstrip().startswith("<?xml")
    # auto (the default everywhere): measured where every GPU shown has them recorded, else
    # datasheet for all (one ceilings source per figure: the H200 alone, then beside the H100)
    d = run_json("roofline", "--gpu", "h200", "--no-plots", "-L", "128")
    assert [g["ceilings"] for g in d["gpus"]] == ["measured"]
    d = run_json("roofline", "--gpu", "h200,h100", "--no-plots", "-L", "128")
    assert [g["ceilings"] for g in d["gpus"]] == ["datasheet", "datasheet"]


def test_roofline_and_intensity_drop_default_chunk_sizes_longer_than_the_sequence():
    d = run_json("roofline", "-T", "512", "--no-plots")
    assert sorted({p["L"] for p in d["points"]}) == [64, 128, 256, 512]
    d = run_json("intensity", "-T", "100", "--no-plots")
    assert set(d["curves"][0]["intensity"]) == {"16", "32", "64"}


# ------------------------------------------------------------------ intensity


def test_intensity_json_values_crossings_and_plot_O5(tmp_path):
    d = run_json("intensity", "--dhv", "512", "--state-bytes", "4,2", "--causal-factor", "0.5,1",
                 "-L", "16,64,256,1024,4096", "--counts", "paper", "--out", str(tmp_path), "--figure-format", "pdf",
                 "--ceilings", "datasheet")
    curves = {(c["bytes_Cmn"], c["F_causal"]): c for c in d["curves"]}
    assert set(curves) == {(4, 0.5), (4, 1.0), (2, 0.5), (2, 1.0)}
    for (sb, fc), Is, cross in (((4, 0.5), "7.9 27.6 83.1 233.4 756.9", "487.5 630.5 1375.9 1358.6"),
                                ((2, 1.0), "15.2 49.0 138.3 410.6 1443.0", "243.7 315.2 688.2 679.6")):
        c = curves[(sb, fc)]
        for L, v in zip((16, 64, 256, 1024, 4096), Is.split()):
            assert close_printed(c["intensity"][str(L)], v)
        for g, v in zip(("v100", "a100", "h100", "b200"), cross.split()):
            assert close_printed(c["L_at_I_acc"][g], v)
    assert (tmp_path / "intensity_sig_dhv512.pdf").read_bytes()[:4] == b"%PDF"


def test_intensity_table_and_default_plot(tmp_path):
    r = run("intensity")
    assert r.exit_code == 0, r.stderr
    assert "fp32" in r.stdout and "bf16" in r.stdout and "plot:" in r.stdout
    files = list((tmp_path / "results" / "plots").glob("intensity_*.png"))
    assert len(files) == 1 and files[0].stat().st_size > 10_000


# ------------------------------------------------------------------ optimal-chunk


def test_optimal_chunk_json_O2_O3_O4():
    d = run_json("optimal-chunk", "--dhv", "128,512", "--gpu", "h100,v100", "--counts", "paper", "--no-plots")
    res = {(r["gpu"], r["d_hv"]): r for r in d["results"]}
    assert close_printed(res[("h100", 512)]["L_opt_flop"], "16.042")  # O2
    assert close_printed(res[("h100", 512)]["L_opt_runtime"], "551.48")  # O3
    assert close_printed(res[("h100", 128)]["L_opt_runtime"], "273.75")  # O3
    assert close_printed(res[("v100", 512)]["L_opt_runtime"], "370.81")  # O3
    assert close_printed(res[("h100", 512)]["L_opt_runtime_max"], "1098.4")  # O4 argmin(max)
    for r in d["results"]:
        assert abs(r["L_opt_runtime_numeric"] / r["L_opt_runtime"] - 1) < 1e-6
        lo, hi = r["L_pow2_runtime"] / 2, r["L_pow2_runtime"] * 2
        assert lo < r["L_opt_runtime"] < hi
    assert res[("h100", 512)]["L_pow2_runtime"] == 512
    assert close_printed(res[("h100", 512)]["runtime_ms_pow2"], "1.598")  # O4 H100 F_c .66 L 512


def test_optimal_chunk_table_and_plot(tmp_path):
    r = run("optimal-chunk", "--dhv", "512", "--gpu", "h100", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.stderr
    assert "h100" in r.stdout and "551" in r.stdout and "512" in r.stdout
    assert (tmp_path / "o" / "optimal_chunk_sig.png").stat().st_size > 10_000  # drawn by default, as everywhere


def test_optimal_chunk_state_bytes_and_measured_h200_section_5():
    d = run_json("optimal-chunk", "--gpu", "h200", "--counts", "paper", "--causal-factor", "0.5", "--no-plots",
                 "--ceilings", "datasheet")
    assert close_printed(d["results"][0]["L_opt_runtime"], "529.34")  # §5 H200 datasheet, F_c .5
    d2 = run_json("optimal-chunk", "--gpu", "h100", "--state-bytes", "4,2", "--counts", "paper", "--no-plots")
    by_state = {r["bytes_Cmn"]: r for r in d2["results"]}
    assert close_printed(by_state[2]["L_opt_runtime"], "390.12")  # O3 bytes_Cmn 2
    assert close_printed(by_state[4]["L_opt_runtime"], "551.48")  # O3 bytes_Cmn 4


def test_figures_draw_a_gpu_named_like_a_formula(tmp_path):
    f = tmp_path / "hw.yaml"  # a name is data: drawn as written, never parsed as mathtext
    f.write_text('gpus:\n  odd: {name: "$a^$ \\\\frac", flops_per_s: 3.62e+14, bytes_per_s: 8.64e+11}\n')
    for args in (["roofline", "--gpu", "h100,odd"], ["intensity", "--gpu", "odd,h100"], ["optimal-chunk", "--gpu", "odd"]):
        r = run(*args, "--hardware", str(f), "--out", str(tmp_path / "p"))
        assert r.exit_code == 0, (args, r.stdout, r.stderr)
    assert len(list((tmp_path / "p").glob("*.png"))) == 3


# ------------------------------------------------------------------ gpus


def test_gpus_json_and_table_with_user_hardware_file(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text("gpus:\n  l40s: {name: NVIDIA L40S, flops_per_s: 3.62e+14, bytes_per_s: 8.64e+11}\n")
    d = run_json("gpus", "--hardware", str(f))
    keys = [g["key"] for g in d["gpus"]]
    assert {"v100", "a100", "h100", "b200", "h100_pcie", "h200", "gb200", "mi300x", "l40s"} <= set(keys)
    h200 = next(g for g in d["gpus"] if g["key"] == "h200")
    assert h200["measured_flops_per_s"] == 772e12 and h200["measured_bytes_per_s"] == 4.24e12
    r = run("gpus")
    assert r.exit_code == 0 and "H200" in r.stdout and "Table 18" in r.stdout
    m = run_json("gpus", "--ceilings", "measured")
    assert next(g for g in m["gpus"] if g["key"] == "h200")["ceilings"] == "measured"


def test_hardware_file_from_environment_is_used(tmp_path, monkeypatch):
    f = tmp_path / "hw.yaml"
    f.write_text("gpus:\n  h100: {measured: {flops_per_s: 7.0e+14, bytes_per_s: 3.0e+12, note: mine}}\n")
    monkeypatch.setenv("TFLABENCH_HARDWARE", str(f))
    d = run_json("roofline", "--gpu", "h100", "--ceilings", "measured", "--no-plots", "-L", "64")
    assert d["gpus"][0]["flops_per_s"] == 7.0e14


# ------------------------------------------------------------------ bad input


#: one bad command line a line: its arguments (shell words) => a text the error line names
BAD_LINES = """
flops --batch 0                            =>  --batch
flops --heads -2                           =>  --heads
flops -T 0                                 =>  --seq-len
flops --dhv -64                            =>  --dhv
flops -L 0                                 =>  --chunk-size
flops -L 64 -T 1000                        =>  does not divide
flops -L 2048 -T 1024                      =>  1 <= L <= S
flops --pqk 0                              =>  --pqk
flops --pqk -0.5                           =>  --pqk
flops --pqk 0.5 --dqk 64                   =>  --dqk
flops --variant tanh                       =>  --variant
flops --formulation blocked                =>  --formulation
flops --counts printed                     =>  --counts
flops --causal-factor 0.2                  =>  --causal-factor
flops --mode fwdbw --formulation parallel  =>  --mode
roofline --gpu tpu                         =>  --gpu
roofline -L 64,abc                         =>  --chunk-size
roofline -L 64,0                           =>  --chunk-size
roofline --ceilings peak                   =>  --ceilings
roofline --gpu h100 --ceilings measured    =>  calibrate
roofline --results does/not/exist          =>  
intensity --state-bytes 4,-2               =>  --state-bytes
intensity --causal-factor 0.66,1.5         =>  --causal-factor
optimal-chunk --dhv 0                      =>  --dhv
optimal-chunk --pqk 0                      =>  --pqk
optimal-chunk --gpu h100,nope              =>  known
optimal-chunk --gpu h100 --gpu h200        =>  --gpu given 2 times; give one comma-separated list
intensity --state-bytes 4,x                =>  e.g. 4,2
roofline --mode fwd,bwd                    =>  --mode
roofline --figure-format jpg               =>  --figure-format
optimal-chunk --variant lstm               =>  --variant
gpus --ceilings x                          =>  --ceilings
"""
BAD = [(shlex.split(line.split(" => ")[0]), line.split(" => ", 1)[1].strip())
       for line in BAD_LINES.strip().splitlines()]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gives_exit_2_and_one_error_line_without_traceback(args, needle):
    r = run(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("content", [None, "gpus: [oops\n"])
def test_unreadable_hardware_file_gives_exit_2_one_line(tmp_path, content):
    f = tmp_path / "hw.yaml"
    if content is not None:
        f.write_text(content)
    for cmd in (["gpus"], ["roofline", "--no-plots"], ["optimal-chunk", "--no-plots"], ["intensity", "--no-plots"]):
        r = run(*cmd, "--hardware", str(f))
        assert r.exit_code == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "hardware file" in lines[0] and str(f) in lines[0]


def test_unwritable_plot_directory_is_a_user_error(tmp_path):
    (tmp_path / "blocker").write_text("x")
    r = run("intensity", "--out", str(tmp_path / "blocker" / "sub"))
    assert r.exit_code == 2 and r.stderr.startswith("error: ")
    r = run("intensity", "--out", str(tmp_path / "blocker"))
    assert r.exit_code == 2 and "--out" in r.stderr and "is a file" in r.stderr


# ------------------------------------------------------------------ cold start


@pytest.mark.parametrize("args", [["optimal-chunk", "--dhv", "512", "--no-plots"], ["flops", "-L", "256"], ["gpus"]])
def test_number_only_commands_import_no_torch_matplotlib_or_pandas(args):
    """Nor pydantic: the options' values are read without typer's pydantic adapters
    (:class:`tflabench.cli._QuickCoercion`)."""
    code = (
        "import sys\n"
        "from tflabench.cli import app\n"
        f"try:\n    app({args!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'numpy', 'scipy', 'triton', 'pydantic')\n"
        "         if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="


def test_the_default_figure_imports_matplotlib_lean_and_draws_the_same_bytes(tmp_path):
    """``roofline`` with its figure (issue 44, about a second): matplotlib without the 3D
    toolkit and without the Artist ``set()`` signatures and docstrings
    (:func:`tflabench.report.plots.lean_matplotlib`), without pyplot, no torch, pandas, scipy
    or pydantic; the PNG is byte for byte the one a plain matplotlib import draws."""
    code = (
        "import sys\n"
        "if sys.argv[1] == 'plain':\n    import matplotlib\n"
        "from tflabench.cli import app\n"
        "try:\n    app(['roofline', '--out', sys.argv[2]])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "loaded = [m for m in ('mpl_toolkits.mplot3d', 'matplotlib.pyplot', 'torch', 'pandas', 'scipy', 'pydantic')\n"
        "          if m in sys.modules]\n"
        "print('LOADED=' + ','.join(loaded))\n"
    )
    outs = {}
    for how in ("plain", "lean"):
        out = subprocess.run([sys.executable, "-c", code, how, str(tmp_path / how)], capture_output=True, text=True,
                             check=True)
        outs[how] = out.stdout.strip().splitlines()[-1]
    assert outs == {"plain": "LOADED=mpl_toolkits.mplot3d", "lean": "LOADED="}
    (plain,) = (tmp_path / "plain").glob("*.png")
    (lean,) = (tmp_path / "lean").glob("*.png")
    assert plain.name == lean.name and plain.read_bytes() == lean.read_bytes()


@pytest.mark.parametrize("annotation", ["str", "int", "float", "Path", "List[str]"])
def test_option_values_are_read_as_typers_pydantic_adapters_read_them(annotation, tmp_path):
    """:class:`tflabench.cli._QuickCoercion` reads the plain values without pydantic and
    hands the rest to typer: either way the value (or the error) is typer's own."""
    from pathlib import Path
    from typing import List

    from typer._coercion import build_runtime_param, resolve_type_descriptor
    from typer._click import Context
    from typer._click.exceptions import BadParameter
    from typer.core import TyperOption
    from typer.models import OptionInfo

    from tflabench.cli import _Command, _QuickCoercion

    kind = {"str": str, "int": int, "float": float, "Path": Path, "List[str]": List[str]}[annotation]
    multiple = annotation == "List[str]"
    info = OptionInfo(default=None, param_decls=("--x",))
    param = TyperOption(param_decls=["--x"], type_descriptor=resolve_type_descriptor(kind, info), multiple=multiple)
    ctx = Context(_Command(name="c"))
    (tmp_path / "file").write_text("x")
    texts = ["0", "7", "-3", "+5", "007", "1_000", " 12", "12 ", "1.5", "-.5", "2.", "1e3", "1E-3", "-2.5e+2",
             "inf", "nan", "x", "", "0x10", "1e400", "9" * 30, "h100,h200", str(tmp_path / "file"), str(tmp_path),
             str(tmp_path / "absent"), "-", "~"]
    values = [(t,) for t in texts] + [("a", "b"), ()] if multiple else texts + [None, 3, 2.5, True]

    def answer(runtime, value):
        try:
            return "value", runtime.coerce(value, param, ctx)
        except BadParameter as exc:
            return "error", exc.format_message()

    typer_runtime = build_runtime_param(param.type_descriptor)
    for value in values:
        ours, theirs = answer(_QuickCoercion(), value), answer(typer_runtime, value)
        assert repr(ours) == repr(theirs), (value, ours, theirs)  # repr: nan, and int from float apart
