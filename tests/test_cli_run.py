"""The run-side commands: `run` (the CPU default end to end), `report` (table + plots),
`backends`, `doctor`, `calibrate`, and how they refuse bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tflabench.store import results as R
from tflabench.store.schema import new_row
from tflabench.backends import known_names
from tflabench.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_default_cpu_suite_runs_end_to_end(tmp_path):
    # What a newcomer types first: `tflabench run` (no suite) runs suites/cpu_demo.yaml.
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "tflabench", "run", "--out", str(tmp_path), "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results: " in proc.stdout
    directory = Path(proc.stdout.split("results: ")[1].split()[0])
    directory = directory if directory.is_absolute() else tmp_path / directory
    assert directory.parent == tmp_path / "cpu_demo"
    rs = R.load_results(directory)
    # 3 kernels x 3 sequence lengths x 2 modes (suites/cpu_demo.yaml)
    assert len(rs.rows) == 18
    assert set(rs.rows["status"]) == {"ok"}, rs.rows[["kernel", "mode", "status", "reason"]].to_string()
    assert (rs.rows["numerics_err"] < 1e-3).all()
    assert (directory / "results.parquet").exists() and (directory / "plots" / "runtime.png").exists()
    tfla_rows = rs.rows[rs.rows["backend"] == "tfla"]
    assert tfla_rows["reason"].str.startswith("impl=reference").all()  # labelled as the reference
    assert rs.metadata["suite"] == "cpu_demo" and rs.metadata["device"] == "cpu"


def _result_set(tmp_path):
    """A result set with a Figure-4-like sweep and a Figure-5-like chunk sweep (made-up
    numbers: only the drawing is under test)."""
    rows = []

    def add(kernel, mode, seq_len, chunk, ms, peak, status="ok"):
        row = new_row(suite="demo", kernel=kernel, backend="tfla", family="mlstm",
                        params={"chunk_size": chunk}, mode=mode, dtype="bfloat16", device="cuda",
                        batch=65536 // seq_len, seq_len=seq_len, heads=16, d_qk=128, d_hv=256,
                        chunk_size=chunk, embedding_dim=4096)
        row.update(status=status, ms_median=ms if status == "ok" else None, peak_mem_bytes=peak,
                   reason=None if status == "ok" else "worker died (killed by SIGABRT)")
        rows.append(row)

    for mode in ("fwd", "fwdbw"):
        for s in (1024, 2048, 4096):
            add("sig", mode, s, 128, 2.0 + s / 4096, 2**30)
            add("exp", mode, s, 128, 3.0, 2**30, status="crash" if s == 4096 else "ok")
        for chunk, ms, gib in ((64, 5.0, 4), (128, 4.3, 3), (256, 4.7, 2)):
            add("sig sweep", mode, 8192, chunk, ms, gib * 2**30)
    directory = tmp_path / "set"
    R.write_results(directory, rows, {"suite": "demo", "gpu_name": "NVIDIA H200"})
    return directory


def test_report_prints_table_and_writes_both_figures_outside_the_set(tmp_path, monkeypatch):
    directory = _result_set(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    before = sorted(p.name for p in directory.iterdir())
    result = runner.invoke(app, ["report", str(directory)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "sig sweep" in result.output and "crash" in result.output
    assert "timed: not recorded" in result.output     # the set has no measurement record
    assert sorted(p.name for p in directory.iterdir()) == before  # nothing written into the set
    for name in ("runtime.png", "memory_vs_runtime.png"):  # the default: results/plots/<suite>-<set>/ here
        path = tmp_path / "elsewhere" / "results" / "plots" / f"{tmp_path.name}-set" / name
        assert path.exists() and path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_figure_is_skipped_without_a_chunk_sweep(tmp_path):
    from tflabench.report.plots.benchmark import write_plots

    directory = _result_set(tmp_path)
    rs = R.load_results(directory)
    rows = [r for r in rs.rows.to_dict("records") if r["kernel"] != "sig sweep"]
    R.write_results(tmp_path / "nosweep", rows, rs.metadata)
    written = write_plots(tmp_path / "nosweep")
    assert [p.name for p in written] == ["runtime.png"]


def test_run_refuses_a_bad_suite_in_one_line_with_exit_2(tmp_path):
    suite = tmp_path / "bad.yaml"
    suite.write_text("name: bad\nsweep: {tokens: 1000, seq_len: [128]}\nkernels: [{backend: tfla}]\n")
    result = runner.invoke(app, ["run", str(suite), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert "sweep.seq_len[0]: tokens 1000 is not divisible by seq_len 128" in err
    assert not (tmp_path / "bad").exists()  # nothing ran


def test_run_refuses_bad_options_with_exit_2(tmp_path):
    for args, text in ((["--gpus", "x"], "--gpus"), (["--shard", "3/2"], "--shard"),
                       (["--device", "tpu"], "--device"), (["--ceilings", "peak"], "--ceilings")):
        result = runner.invoke(app, ["run", *args, "--out", str(tmp_path)])
        assert result.exit_code == 2, args
        assert text in result.stderr and "Traceback" not in result.output


def test_run_with_gpus_on_a_machine_without_one_is_refused(tmp_path, monkeypatch):
    from tflabench.run import pool as worker_pool
    from tflabench.environment import GpuInfo

    monkeypatch.setattr(worker_pool, "gpu_info", lambda: GpuInfo([], None))
    result = runner.invoke(app, ["run", "--gpus", "0,1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no GPU is visible here" in result.stderr
    assert not (tmp_path / "cpu_demo").exists()  # nothing recorded as if it ran on two GPUs


def test_interrupted_run_names_the_result_set_to_resume(tmp_path, monkeypatch):
    from tflabench.run import suite_run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite_run, "run_cases", interrupted)
    suite = ROOT / "suites" / "cpu_demo.yaml"
    result = runner.invoke(app, ["run", str(suite), "--out", str(tmp_path), "--no-progress", "--no-plots"])
    assert result.exit_code == 130
    (directory,) = (tmp_path / "cpu_demo").iterdir()
    assert f"finish with `tflabench run {suite} --resume {directory}`" in result.stderr
    assert "DIR" not in result.stderr


def test_report_of_a_missing_set_exits_2(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path / "none")])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_backends_lists_every_backend_with_its_status():
    result = runner.invoke(app, ["backends"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in known_names():
        assert name in result.output
    assert "available" in result.output


def test_doctor_reports_environment_and_problems():
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for text in ("python", "torch", "triton", "GPU", "peers:"):
        assert text in result.output


def test_calibrate_without_gpu_exits_2(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["calibrate"])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.stderr


def test_known_bad_combinations_are_reported():
    from tflabench.environment import known_problems

    env = {"triton": "3.6.0", "gpu_name": "NVIDIA H200", "gpu_count": 1,
           "peers": {"fla-core": "0.6.0", "mlstm_kernels": "2.0.6"}}
    problems = known_problems(env)
    assert any("fla 0.6.0 on triton 3.6.0 on Hopper" in p for p in problems)
    # the authors' mLSTMexp xl_chunk ran in every H200 reference run with triton 3.6
    assert not any("mlstm_kernels" in p for p in problems)
    fixed = known_problems(dict(env, triton="3.7.1", peers={"fla-core": "0.6.0"}))
    assert not any("fla" in p for p in fixed)
    assert json.dumps(problems)  # plain strings


def test_git_revision_can_be_named_where_the_tree_has_no_git(monkeypatch):
    from tflabench.environment import git_revision

    monkeypatch.setenv("TFLABENCH_GIT_REVISION", "0123abc")
    assert git_revision() == "0123abc"


def test_sources_hash_names_the_code_that_ran(tmp_path):
    """sources_sha256: equal for equal trees wherever they lie, changed by one byte of one
    .py file or by a renamed file, blind to caches and other files; None without sources.
    A run records it (the default roots: tflabench and tfla)."""
    from tflabench.environment import collect, sources_sha256

    def tree(where, text="x = 1\n", name="a.py"):
        pkg = where / "tfla"
        (pkg / "triton").mkdir(parents=True)
        (pkg / name).write_text(text)
        (pkg / "triton" / "k.py").write_text("y = 2\n")
        return pkg

    first = sources_sha256([tree(tmp_path / "one")])
    assert first == sources_sha256([tree(tmp_path / "two")])
    assert first != sources_sha256([tree(tmp_path / "three", text="x = 2\n")])
    assert first != sources_sha256([tree(tmp_path / "four", name="b.py")])
    other = tmp_path / "one" / "tfla"
    (other / "__pycache__").mkdir()
    (other / "__pycache__" / "a.cpython-311.py").write_text("junk")
    (other / "notes.txt").write_text("junk")
    assert sources_sha256([other]) == first
    assert sources_sha256([tmp_path / "missing"]) is None
    assert len(collect()["sources_sha256"]) == 64


def test_a_cuda_suite_on_a_cpu_gets_one_suggestion_from_run_and_verify(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite = ROOT / "suites" / "h100_7b.yaml"
    messages = []
    for command in ("run", "verify"):
        result = runner.invoke(app, [command, str(suite), "--out", str(tmp_path), "--no-progress"])
        assert result.exit_code == 2, (command, result.output)
        messages.append(result.stderr.strip())
    assert messages[0] == messages[1]
    assert "pass --device cpu" in messages[0] and "device: auto" in messages[0]
