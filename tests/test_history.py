"""`tflabench history` (tflabench.compare.history, docs/ci.md "History") on synthetic series.

One real result set of a tiny CPU suite is measured once (the shape of real rows and
metadata); each fake commit is a copy whose timings are scaled: a 30 % step at commit 6
of 10 must be found at that commit with its size, a flat noisy series must show none.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CPU_KERNELS
from tflabench.compare import history as H
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.run.kernel_profile import parse_profile
from tflabench.store.results import load_results, write_results

ROOT = Path(__file__).resolve().parents[1]

SUITE = """\
name: history_tiny
description: four tiny CPU cases, the shape of a history's result sets
device: cpu
dtype: float32
modes: [fwd]
seed: 0
timing: {warmup: 1, iterations: 8, timeout_s: 120}
numerics: {check: false}
compare: {time_threshold: 0.05}
model: {embedding_dim: 64}
sweep: {batch: 1, seq_len: [32, 64]}
""" + TINY_CPU_KERNELS

TIME_COLUMNS = ("ms_median", "ms_mean", "ms_min", "ms_max", "ms_q25", "ms_q75")


@pytest.fixture(scope="module")
def real_set(tmp_path_factory):
    """One result set measured by `tflabench run` (rows and metadata as a run writes them)."""
    work = tmp_path_factory.mktemp("real")
    suite = work / "history_tiny.yaml"
    suite.write_text(SUITE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels"),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tflabench", "run", str(suite), "--out", str(work / "out"),
                           "--no-progress", "--no-plots"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return load_results(next((work / "out").glob("*/*/metadata.json")).parent)


def _scaled(row: dict, factor: float) -> dict:
    out = dict(row)
    for column in TIME_COLUMNS:
        if out.get(column) is not None:
            out[column] = float(out[column]) * factor
    samples = json.loads(out["ms_samples"]) if isinstance(out["ms_samples"], str) else list(out["ms_samples"])
    out["ms_samples"] = json.dumps([s * factor for s in samples])
    return out


def make_series(real, root: Path, factors: list[float], *, noise: float = 0.01, seed: int = 0,
                commit_dates: bool = True, profile_step: int | None = None, metadata: dict | None = None) -> list:
    """One result set per factor (fake commits c0, c1, ...): the real set's rows with every
    time scaled by the factor and a per-case noise of ``noise``; commit dates an hour apart
    (recorded, or left out with run dates in order). Returns the directories, shuffled."""
    rng = random.Random(seed)
    rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in real.rows.to_dict("records")]
    dirs = []
    for c, factor in enumerate(factors):
        scaled = []
        for row in rows:
            new = _scaled(row, factor * (1.0 + rng.gauss(0.0, noise)))
            if profile_step is not None:
                slow = 2.0 if c >= profile_step else 1.0
                new["kernel_profile"] = json.dumps({"source": "cpu operators", "steps": 5, "kernels": [
                    {"pass": "fwd", "name": "aten::bmm", "ms": 0.1 * slow, "calls": 2.0},
                    {"pass": "fwd", "name": "aten::exp", "ms": 0.05, "calls": 1.0}]})
            scaled.append(new)
        meta = dict(real.metadata, git_revision=f"{c:02d}" + "ab" * 19, date=f"2026-01-01T{c:02d}:30:00",
                    **(metadata or {}))
        if commit_dates:
            meta["git_commit_date"] = f"2026-01-01T{c:02d}:00:00+00:00"
        else:
            meta.pop("git_commit_date", None)
        dirs.append(write_results(root / f"c{c}", scaled, meta))
    rng.shuffle(dirs)
    return dirs


def _no_git(revision):
    return None


STEP = [1.0] * 5 + [1.3] * 5  # the step: commit 6 of 10 (index 5) is the first slow one


def test_a_30_percent_step_at_commit_6_of_10_is_found_there_with_its_size(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, STEP)
    result = H.analyse([load_results(d) for d in dirs], lookup=_no_git)
    assert [c.revision[:2] for c in result.commits] == [f"{c:02d}" for c in range(10)]  # shuffled in, sorted out
    assert result.commits[0].date_source == "commit" and result.threshold == 0.05
    assert len(result.cases) == len(real_set.rows) == 4
    for case in result.cases:
        assert [s.index for s in case.steps] == [5], case
        step = case.steps[0]
        assert step.revision.startswith("05") and step.size == pytest.approx(0.30, abs=0.04)
        assert step.p is not None and step.p < 0.01 and step.basis == "commits"
        assert case.regression
    assert result.exit_status() == 1
    # the terminal table at 80 columns: nothing cut, every column there
    import io

    from rich.console import Console

    buffer = io.StringIO()
    H.render_table(result, console=Console(file=buffer, width=80, highlight=False))
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.count("! +") == 4 and "REGRESSION: 4 case(s)" in text  # each row marked, the verdict
    assert all(f"{c.steps[0].size * 100:+.1f} %" in text for c in result.cases)


def test_the_command_reports_the_step_exits_1_and_writes_markdown_json_and_a_figure_per_family(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path / "sets", STEP)
    md, js, figs = tmp_path / "history.md", tmp_path / "history.json", tmp_path / "figs"
    result = CliRunner().invoke(app, ["history", *map(str, dirs), "--markdown", str(md), "--json", str(js),
                                      "--out", str(figs)])
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.stdout and "#6 05abab" in result.stdout
    report = json.loads(js.read_text())
    assert report["exit_status"] == 1 and len(report["regressions"]) == 4
    assert {s["index"] for c in report["cases"] for s in c["steps"]} == {5}
    assert "| torch SDPA math fwd float32 B1 S32" in md.read_text() and "+3" in md.read_text()
    pngs = sorted(p.name for p in figs.glob("*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:4] == b"\x89PNG" for p in figs.glob("*.png"))
    # a folder holding the sets is read like the sets themselves
    folder = CliRunner().invoke(app, ["history", str(tmp_path / "sets"), "--format", "json"])
    assert folder.exit_code == 1 and json.loads(folder.stdout)["regressions"] == report["regressions"]


def test_a_flat_noisy_series_has_no_step_and_exits_0(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, [1.0] * 10, noise=0.02, seed=3)
    result = CliRunner().invoke(app, ["history", *map(str, dirs), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert all(c["steps"] == [] for c in report["cases"]) and len(report["cases"]) == 4


def test_a_step_undone_later_is_found_twice_and_the_newest_commit_is_not_a_regression(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, [1.0] * 3 + [1.5] * 4 + [1.0] * 3)
    result = H.analyse([load_results(d) for d in dirs], lookup=_no_git)
    for case in result.cases:
        assert [s.index for s in case.steps] == [3, 7]
        assert case.steps[0].size > 0.4 and case.steps[1].size < -0.25 and not case.regression
    assert result.exit_status() == 0


def test_without_commit_dates_the_run_dates_order_the_sets_and_the_report_says_so(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, STEP, commit_dates=False)
    result = H.analyse([load_results(d) for d in dirs], lookup=_no_git)
    assert all(c.date_source == "run" for c in result.commits)
    assert any("ordered by each run's date" in note for note in result.notes)
    assert all([s.index for s in c.steps] == [5] for c in result.cases)
    assert "ordered by run date" in H.to_markdown(result)


def test_the_step_names_the_profiled_kernel_that_moved(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, STEP, profile_step=5)
    result = H.analyse([load_results(d) for d in dirs], parse_profile=parse_profile, lookup=_no_git)
    for case in result.cases:
        assert case.steps[0].kernel == "aten::bmm (fwd)"
        assert case.steps[0].kernel_change_ms == pytest.approx(0.1)


def test_a_new_step_at_the_newest_commit_is_judged_on_the_pooled_samples(real_set, tmp_path):
    dirs = make_series(real_set, tmp_path, [1.0] * 9 + [1.4], noise=0.005)
    result = H.analyse([load_results(d) for d in dirs], lookup=_no_git)
    for case in result.cases:
        assert [s.index for s in case.steps] == [9] and case.steps[0].basis == "samples"
        assert case.regression
    assert result.exit_status() == 1


def test_bad_series_are_refused_with_one_error_line_and_exit_2(real_set, tmp_path):
    runner = CliRunner()
    dirs = make_series(real_set, tmp_path / "a", [1.0] * 3)
    one = runner.invoke(app, ["history", str(dirs[0])])
    assert one.exit_code == 2 and one.stderr.startswith("error: history needs at least 2 result sets")
    twice = runner.invoke(app, ["history", str(dirs[0]), str(dirs[0])])
    assert twice.exit_code == 2 and "given twice" in twice.stderr
    other_suite = make_series(real_set, tmp_path / "b", [1.0], metadata={"suite": "other"})
    mixed = runner.invoke(app, ["history", *map(str, dirs), str(other_suite[0])])
    assert mixed.exit_code == 2 and "give result sets of one suite" in mixed.stderr
    other_torch = make_series(real_set, tmp_path / "c", [1.0], metadata={"torch": "0.0-other"})
    stack = runner.invoke(app, ["history", *map(str, dirs), str(other_torch[0])])
    assert stack.exit_code == 2 and "torch differs" in stack.stderr
    timing = dict(real_set.metadata["measurement"])
    timing["timing"] = dict(timing["timing"], iterations=99)
    other_timing = make_series(real_set, tmp_path / "d", [1.0], metadata={"measurement": timing})
    timed = runner.invoke(app, ["history", *map(str, dirs), str(other_timing[0])])
    assert timed.exit_code == 2 and "timing.iterations differs" in timed.stderr
    for bad in (["history", str(tmp_path / "nowhere"), str(dirs[0])],
                ["history", *map(str, dirs), "--time-threshold", "-1"],
                ["history", *map(str, dirs), "--format", "xml"]):
        result = runner.invoke(app, bad)
        assert result.exit_code == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.output


def test_change_points_find_no_step_below_the_threshold_and_refuse_nothing_on_two_commits():
    assert H.change_points([1.0, 1.02, 0.99, 1.03, 1.0, 1.01, 0.98, 1.02], 0.05) == []
    assert H.change_points([1.0, 1.0, 1.0, 1.0, 1.04, 1.04, 1.04, 1.04], 0.05) == []  # 4 % < 5 %
    assert H.change_points([1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2, 1.2], 0.05) == [4]
    assert H.change_points([1.0, 2.0], 0.05) in ([], [1])
    with pytest.raises(UserError):
        H.check_series([])


def test_damaged_metadata_and_rows_end_in_0_1_or_2_without_a_traceback(real_set, tmp_path):
    """Whatever a set's commit date, run date or timings hold, history ends in 0, 1 or 2 (one
    error line), never in a traceback (docs/harness.md, "Exit status")."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    values = st.one_of(st.none(), st.text(max_size=30), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                            max_size=2))
    counter = iter(range(10**6))

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(commit=values, run_date=values, median=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
           samples=st.one_of(st.none(), st.just("[1, 2"), st.just("[]"), st.just("[0.5, 0.6]")))
    def check(commit, run_date, median, samples):
        root = tmp_path / str(next(counter))
        dirs = make_series(real_set, root, [1.0, 1.0, 1.5])
        victim = load_results(dirs[0])
        rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                for r in victim.rows.to_dict("records")]
        rows[0]["ms_median"], rows[0]["ms_samples"] = median, samples
        meta = dict(victim.metadata, git_commit_date=commit, date=run_date)
        try:
            write_results(dirs[0], rows, meta)
        except (UserError, TypeError, ValueError):
            return  # a set the writer itself refuses cannot be read either
        result = CliRunner().invoke(app, ["history", *map(str, dirs), "--format", "json"])
        assert result.exit_code in (0, 1, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        if result.exit_code == 2:
            assert result.stderr.startswith("error: ")

    check()
