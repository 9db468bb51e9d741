"""One wording per kind of mistake, the same rule in every command (issue 48, item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tflabench import environment
from tflabench.store import results as R
from tflabench.store.schema import new_row
from tflabench.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _cpu_set(tmp_path: Path) -> Path:
    row = new_row(suite="cpu_demo", kernel="mLSTMsig (ours)", backend="tfla", family="mlstm",
                    params={"chunk_size": 64, "variant": "sig"}, mode="fwd", dtype="float32", device="cpu",
                    batch=1, seq_len=256, heads=2, d_qk=32, d_hv=64, chunk_size=64, embedding_dim=128)
    row.update(status="ok", ms_median=2.0, flops=4e8, bytes=2e7, ms_samples=json.dumps([2.0, 2.1, 1.9]))
    return R.write_results(tmp_path / "cpu_set", [row], {"suite": "cpu_demo", "gpu_name": None, "gpu_count": 0})


def test_roofline_help_example_names_a_result_set_that_exists():
    text = runner.invoke(app, ["roofline", "--help"], env={"COLUMNS": "300"}).stdout
    example = next(line for line in text.splitlines() if "Example:" in line and "--results" in line)
    path = example.split("--results", 1)[1].split()[0]
    assert (ROOT / path / R.ROWS_FILE).exists() or (ROOT / path / "results.parquet").exists(), path


def test_run_of_a_directory_says_it_is_a_directory(tmp_path):
    line = _error_line(runner.invoke(app, ["run", str(tmp_path)]))
    assert "is a directory" in line and "does not exist" not in line


def test_a_missing_result_set_is_worded_the_same_by_report_compare_and_roofline(tmp_path):
    cpu = _cpu_set(tmp_path)
    missing = str(tmp_path / "nonexistent")
    report = _error_line(runner.invoke(app, ["report", missing, "--no-plots"]))
    compare = _error_line(runner.invoke(app, ["compare", str(cpu), missing]))
    roofline = _error_line(runner.invoke(app, ["roofline", "--results", missing, "--no-plots"]))
    assert report == compare == roofline
    assert missing in report


@pytest.mark.parametrize("value", ["3", "4,3", "1"])
def test_state_bytes_takes_only_2_or_4(value):
    for command in ("intensity", "roofline", "optimal-chunk", "flops"):
        line = _error_line(runner.invoke(app, [command, "--state-bytes", value, "--no-plots"]
                                         if command != "flops" else [command, "--state-bytes", value]))
        assert "--state-bytes" in line and "2" in line and "4" in line


def test_roofline_of_a_cpu_set_needs_a_gpu_as_report_does(tmp_path):
    cpu = _cpu_set(tmp_path)
    line = _error_line(runner.invoke(app, ["roofline", "--results", str(cpu), "--no-plots"]))
    assert "--gpu" in line and "CPU" in line
    r = runner.invoke(app, ["roofline", "--results", str(cpu), "--gpu", "h100", "--no-plots", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["measured_gpu"]["key"] == "h100"


def test_every_analytic_gpu_option_takes_a_list_with_one_ceilings_source(tmp_path):
    for command in ("roofline", "intensity", "optimal-chunk"):
        r = runner.invoke(app, [command, "--gpu", "h100,h200", "--no-plots", "--json"])
        assert r.exit_code == 0, (command, r.output)
        gpus = json.loads(r.stdout).get("gpus")
        if gpus is not None:
            assert [g["ceilings"] for g in gpus] == ["datasheet", "datasheet"]
            h100, h200 = gpus
            assert h200["flops_per_s"] >= h100["flops_per_s"]       # the H200's roof is not drawn below
    r = runner.invoke(app, ["roofline", "--gpu", "h200", "--no-plots", "--json"])
    assert json.loads(r.stdout)["gpus"][0]["ceilings"] == "measured"   # alone: its recorded ceilings


def test_report_html_and_compare_markdown_create_a_missing_directory_and_say_so(tmp_path):
    cpu = _cpu_set(tmp_path)
    html = tmp_path / "new_html_dir" / "r.html"
    md = tmp_path / "new_md_dir" / "r.md"
    report = runner.invoke(app, ["report", str(cpu), "--no-plots", "--html", str(html)])
    compare = runner.invoke(app, ["compare", str(cpu), str(cpu), "--markdown", str(md)])
    assert report.exit_code == 0, report.output
    assert compare.exit_code in (0, 1), compare.output
    assert html.is_file() and md.is_file()
    assert f"created directory {str(html.parent)!r} for --html" in report.stderr
    assert f"created directory {str(md.parent)!r} for --markdown" in compare.stderr


def test_run_refuses_gpus_it_cannot_have_without_importing_torch():
    code = (
        "import sys\n"
        "from tflabench.cli import app\n"
        "try:\n    app(['run', '--gpus', '99', '--no-progress'])\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "EXIT 2" in out.stdout, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "TORCH False"
    assert out.stderr.count("error: ") == 1 and "--gpus" in out.stderr


def test_doctor_says_when_a_cuda_build_of_torch_sits_on_a_machine_without_a_gpu():
    env = {"gpu_count": 0, "cuda": "12.8", "torch": "2.9.0+cu128", "peers": {}}
    lines = environment.known_problems(env)
    assert any("is a CUDA build" in line and environment.CPU_TORCH_INSTALL in line for line in lines)
    cpu_build = environment.known_problems({**env, "cuda": None, "torch": "2.9.0+cpu"})
    assert not any("is a CUDA build" in line for line in cpu_build)


def test_every_gpu_the_project_measured_is_shown_by_default():
    for command in ("roofline", "intensity", "optimal-chunk"):
        r = runner.invoke(app, [command, "--no-plots", "--json"])
        assert r.exit_code == 0, (command, r.output)
        d = json.loads(r.stdout)
        keys = [g["key"] for g in d["gpus"]] if "gpus" in d else list(dict.fromkeys(x["gpu"] for x in d["results"]))
        assert {"h100", "h200"} <= set(keys), (command, keys)


def test_looking_for_gpus_imports_torch_only_where_a_driver_is_loaded():
    code = ("import sys\nfrom tflabench import environment\n"
            "environment.DRIVER_PATHS = ('/nonexistent/driver',)\n"        # a machine without a GPU driver
            "environment.shutil.which = lambda name: None\n"                # and without nvidia-smi
            "info = environment.gpu_info()\n"
            "print(environment.gpu_driver_present(), len(info.devices), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "0", "False"]
