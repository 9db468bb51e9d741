"""Hostile and damaged inputs: every unusable input or output is exit 2 with one line,
before anything on disk changes, and no result set ends up mixing conditions.

Result sets come from one real run of a two-case CPU suite (module fixture ``measured``)
or are written with ``tflabench.store.results.write_results``. Each test that refuses also
checks that the files of the set are byte for byte what they were."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from conftest import one_error_line
from tflabench.store import results as R
from tflabench.store.schema import new_row
from tflabench.cli import app
from tflabench.run.suite_run import run_suite
from tflabench.store.suite import load_suite

cli = CliRunner()

SUITE = {"name": "hostile", "device": "cpu", "dtype": "float32", "modes": ["fwd"], "seed": 0,
         "timing": {"warmup": 1, "iterations": 3, "timeout_s": 60}, "numerics": {"max_seq_len": 32},
         "model": {"embedding_dim": 32}, "sweep": {"batch": 1, "seq_len": [16, 32]},
         "kernels": [{"backend": "sdpa", "label": "sdpa math", "params": {"impl": "math", "heads": 2}}]}


def _write_suite(path: Path, **over) -> Path:
    data = json.loads(json.dumps(SUITE))
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(suite path, result-set directory) of a finished run of :data:`SUITE`."""
    tmp = tmp_path_factory.mktemp("measured")
    suite = _write_suite(tmp / "hostile.yaml")
    result = run_suite(load_suite(suite), out_root=tmp / "out", progress=False,
                       console=Console(file=StringIO()))
    return suite, result.directory


def _copy(measured, tmp_path: Path) -> Path:
    copy = tmp_path / "set"
    shutil.copytree(measured[1], copy)
    return copy


def _snapshot(directory: Path) -> dict:
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(directory.rglob("*"))}


# --------------------------------------------------------------------------- damaged sets


def _binary_metadata(d: Path):
    (d / R.METADATA_FILE).write_bytes(bytes(range(256)))


def _list_metadata(d: Path):
    (d / R.METADATA_FILE).write_text("[1, 2]")


def _wrong_type_metadata(d: Path):
    meta = json.loads((d / R.METADATA_FILE).read_text())
    meta["peers"] = ["fla"]
    (d / R.METADATA_FILE).write_text(json.dumps(meta))


def _metadata_directory(d: Path):
    (d / R.METADATA_FILE).unlink()
    (d / R.METADATA_FILE).mkdir()


def _extra_row_key(d: Path):
    lines = (d / R.ROWS_FILE).read_text().splitlines()
    row = json.loads(lines[1])
    row["measured_by"] = "hand"
    lines[1] = json.dumps(row)
    (d / R.ROWS_FILE).write_text("\n".join(lines) + "\n")


def _rows_directory(d: Path):
    (d / R.ROWS_FILE).unlink()
    (d / R.ROWS_FILE).mkdir()


DAMAGE = {
    "binary metadata": (_binary_metadata, "metadata.json: not UTF-8 text"),
    "metadata a JSON list": (_list_metadata, "metadata.json: an array, not an object"),
    "metadata key of the wrong type": (_wrong_type_metadata, "'peers' is an array, not an object"),
    "metadata a directory": (_metadata_directory, "metadata.json: is a directory"),
    "row with an extra key": (_extra_row_key, "rows.jsonl: line 2 has the field 'measured_by'"),
    "rows.jsonl a directory": (_rows_directory, "rows.jsonl: is a directory"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_set_is_one_line_exit_2_for_report_compare_and_resume(measured, tmp_path, damage):
    make, expected = DAMAGE[damage]
    directory = _copy(measured, tmp_path)
    make(directory)
    before = _snapshot(directory)
    for args in (["report", str(directory), "--no-plots"],
                 ["compare", str(measured[1]), str(directory)],
                 ["compare", str(directory), str(measured[1])],
                 ["run", str(measured[0]), "--resume", str(directory), "--no-progress", "--no-plots"]):
        line = one_error_line(cli.invoke(app, args))
        assert expected in line, (args, line)
        assert _snapshot(directory) == before, args  # refused before anything changed


def test_damaged_shard_is_one_line_exit_2_for_merge(measured, tmp_path):
    directory = _copy(measured, tmp_path)
    _list_metadata(directory)
    line = one_error_line(cli.invoke(app, ["merge", str(directory), "--out", str(tmp_path / "m")]))
    assert "an array, not an object" in line and not (tmp_path / "m").exists()


# --------------------------------------------------------------------------- resume: one set, one condition


def test_resume_without_metadata_is_checked_from_its_rows_then_refused(measured, tmp_path):
    directory = _copy(measured, tmp_path)
    (directory / R.METADATA_FILE).unlink()
    before = _snapshot(directory)
    # more iterations and one more length: the rows say 3 iterations
    more = _write_suite(tmp_path / "more.yaml", timing={"iterations": 50}, sweep={"batch": 1, "seq_len": [16, 32, 48]})
    line = one_error_line(cli.invoke(app, ["run", str(more), "--resume", str(directory)]))
    assert "timing.iterations (rows.jsonl line 1) is 50 in this run but 3 in the result set" in line
    # another suite's name
    other = _write_suite(tmp_path / "other.yaml", name="other")
    line = one_error_line(cli.invoke(app, ["run", str(other), "--resume", str(directory)]))
    assert 'suite (rows.jsonl line 1) is "other" in this run but "hostile"' in line
    # the same suite: the rows agree, but what they cannot tell (GPU, software, seed) is unknown
    line = one_error_line(cli.invoke(app, ["run", str(measured[0]), "--resume", str(directory)]))
    assert "metadata.json is missing or records no measurement conditions" in line and "seed" in line
    assert _snapshot(directory) == before


def test_resume_checks_the_rows_even_when_the_metadata_was_edited_to_agree(measured, tmp_path):
    directory = _copy(measured, tmp_path)
    meta = json.loads((directory / R.METADATA_FILE).read_text())
    meta["measurement"]["timing"]["iterations"] = 50
    (directory / R.METADATA_FILE).write_text(json.dumps(meta))
    before = _snapshot(directory)
    more = _write_suite(tmp_path / "more.yaml", timing={"iterations": 50})
    line = one_error_line(cli.invoke(app, ["run", str(more), "--resume", str(directory)]))
    assert "timing.iterations (rows.jsonl line 1) is 50 in this run but 3" in line
    assert _snapshot(directory) == before


@pytest.mark.parametrize("edit, field", [
    (lambda m: m["measurement"].update(timing="fast"), "measurement.timing is not a JSON object"),
    (lambda m: m["measurement"]["kernels"].update({"sdpa math": ["x"]}), "measurement.kernels['sdpa math'] is not"),
    (lambda m: m["measurement"]["kernels"]["sdpa math"].update(params={"heads": 2}),
     "measurement.kernels['sdpa math'].params is not an object of arrays"),
])
def test_resume_refuses_a_measurement_record_of_the_wrong_shape_naming_the_field(measured, tmp_path, edit, field):
    directory = _copy(measured, tmp_path)
    meta = json.loads((directory / R.METADATA_FILE).read_text())
    edit(meta)
    (directory / R.METADATA_FILE).write_text(json.dumps(meta))
    before = _snapshot(directory)
    line = one_error_line(cli.invoke(app, ["run", str(measured[0]), "--resume", str(directory)]))
    assert field in line, line
    assert _snapshot(directory) == before


# --------------------------------------------------------------------------- shards


def _shard(tmp_path: Path, k: int, n: int, seq_lens: list[int], expected: list[int] | None) -> Path:
    rows = []
    for s in seq_lens:
        row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                        dtype="float32", device="cpu", batch=1, seq_len=s, heads=2, d_qk=16, d_hv=16,
                        chunk_size=None, embedding_dim=32)
        row.update(status="ok", ms_median=1.0, ms_samples=[1.0, 1.0, 1.0])
        rows.append(row)
    ids = None
    if expected is not None:
        ids = [new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                         dtype="float32", device="cpu", batch=1, seq_len=s, heads=2, d_qk=16, d_hv=16,
                         chunk_size=None, embedding_dim=32)["case_id"] for s in expected]
    return R.write_results(tmp_path / f"shard{k}", rows, {"suite": "s", "shard": f"{k}/{n}", "case_ids": ids})


def test_merge_refuses_a_shard_holding_fewer_cases_than_it_was_to_measure(tmp_path):
    one = _shard(tmp_path, 1, 2, [16, 32], [16, 32])
    two = _shard(tmp_path, 2, 2, [48], [48, 64, 80])  # cut to 1 of its 3 rows
    line = one_error_line(cli.invoke(app, ["merge", str(one), str(two), "--out", str(tmp_path / "m")]))
    assert "shard 2/2" in line and "holds 1 of its 3 cases" in line and "--allow-missing" in line
    assert f"--shard 2/2 --resume {two}" in line
    assert not (tmp_path / "m").exists()
    # recorded like a missing shard with --allow-missing, and compare warns about it
    result = cli.invoke(app, ["merge", str(one), str(two), "--out", str(tmp_path / "m"), "--allow-missing"])
    assert result.exit_code == 0, result.output
    assert "shard 2/2 lack 2 of 3 case(s)" in result.stderr
    meta = R.load_results(tmp_path / "m").metadata
    assert meta["shards_incomplete"] == [{"shard": "2/2", "path": str(two), "cases_expected": 3, "cases_missing": 2}]
    report = cli.invoke(app, ["compare", str(tmp_path / "m"), str(tmp_path / "m"), "--format", "json"])
    assert any("merged from incomplete shards (2 case(s) not measured)" in w
               for w in json.loads(report.stdout)["warnings"])


def test_merge_of_shards_without_their_own_case_list_checks_the_suites(tmp_path):
    # shards written before each recorded its own cases: the union against the suite's
    ids = [new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                     dtype="float32", device="cpu", batch=1, seq_len=s, heads=2, d_qk=16, d_hv=16, chunk_size=None,
                     embedding_dim=32)["case_id"] for s in (16, 32, 48)]
    paths = []
    for k, seq_lens in ((1, [16]), (2, [32])):
        path = _shard(tmp_path, k, 2, seq_lens, None)
        meta = json.loads((path / R.METADATA_FILE).read_text())
        meta["measurement"] = {"case_ids": ids}
        (path / R.METADATA_FILE).write_text(json.dumps(meta))
        paths.append(str(path))
    line = one_error_line(cli.invoke(app, ["merge", *paths, "--out", str(tmp_path / "m")]))
    assert "the shards hold 2 of the suite's 3 cases (1 in no shard)" in line


@pytest.mark.parametrize("text, expected", [
    ("1/99999999999999999999", "splits into more than 10000 shards"),
    ("99999999999999999999/3", "needs 1 <= K <= N"),
    ("0/3", "needs 1 <= K <= N"),
])
def test_shard_option_is_bounded(measured, text, expected):
    line = one_error_line(cli.invoke(app, ["run", str(measured[0]), "--shard", text]))
    assert expected in line


# --------------------------------------------------------------------------- compare's inputs and outputs


@pytest.mark.parametrize("where", ["a directory", "under a file", "in /proc"])
@pytest.mark.parametrize("option", ["--markdown", "--json", "GITHUB_STEP_SUMMARY"])
def test_compare_refuses_an_unwritable_output_before_writing_anything(measured, tmp_path, monkeypatch, where, option):
    (tmp_path / "afile").write_text("x")
    target = {"a directory": tmp_path, "under a file": tmp_path / "afile" / "report.md",
              "in /proc": Path("/proc/version")}[where]
    other = tmp_path / "other.json"
    args = ["compare", str(measured[1]), str(measured[1])]
    if option == "GITHUB_STEP_SUMMARY":
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        args += ["--step-summary", "--json", str(other)]
    else:
        args += [option, str(target)] + (["--markdown", str(other)] if option == "--json" else ["--json", str(other)])
    result = cli.invoke(app, args)
    line = one_error_line(result)
    assert ("$GITHUB_STEP_SUMMARY" if option == "GITHUB_STEP_SUMMARY" else option) in line
    assert result.stdout == "" and not other.exists()  # nothing printed, nothing written
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("text, expected", [
    ("min_samples: .nan\n", "min_samples must be an integer in [2, 1000000] (got nan)"),
    ("mem_floor_bytes: .inf\n", "mem_floor_bytes must be an integer in [0, 1125899906842624] (got inf)"),
    ("min_samples: 1.0e+400\n", "min_samples must be an integer in [2, 1000000] (got inf)"),
    ("alpha: true\n", "alpha must be a finite number in (0, 1) (got True)"),
    ("time_threshold: 0.05\ntime_threshold: 0.5\n", "key 'time_threshold' appears twice"),
    ("[1, 2]\n", "expected a mapping of thresholds, got list"),
])
def test_compare_thresholds_file_is_bounded(measured, tmp_path, text, expected):
    path = tmp_path / "thresholds.yaml"
    path.write_text(text)
    line = one_error_line(cli.invoke(app, ["compare", str(measured[1]), str(measured[1]), "--thresholds", str(path)]))
    assert expected in line, line


def test_min_samples_zero_is_refused_not_a_crash_on_rows_without_samples(tmp_path):
    row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                    dtype="float32", device="cpu", batch=1, seq_len=16, heads=2, d_qk=16, d_hv=16,
                    chunk_size=None, embedding_dim=32)
    row.update(status="ok", ms_median=1.0)  # no ms_samples, no quartiles
    directory = R.write_results(tmp_path / "set", [row], {"suite": "s"})
    line = one_error_line(cli.invoke(app, ["compare", str(directory), str(directory), "--min-samples", "0"]))
    assert "--min-samples: min_samples must be an integer in [2, 1000000] (got 0)" in line


def test_compare_warns_when_host_cpu_or_python_differ(measured, tmp_path):
    other = _copy(measured, tmp_path)
    meta = json.loads((other / R.METADATA_FILE).read_text())
    meta.update(hostname="elsewhere", cpu="Another CPU", python="3.0.0")
    (other / R.METADATA_FILE).write_text(json.dumps(meta))
    result = cli.invoke(app, ["compare", str(measured[1]), str(other), "--format", "json", "--fail-on", "none"])
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    for key in ("hostname", "cpu", "python"):
        assert any(w.startswith(f"{key} differs: base ") for w in warnings), (key, warnings)
    same = cli.invoke(app, ["compare", str(measured[1]), str(measured[1]), "--format", "json", "--fail-on", "none"])
    assert not any("differs" in w for w in json.loads(same.stdout)["warnings"])


# --------------------------------------------------------------------------- interrupted runs: the message is true


HELD = '''
import os, time, torch

def held(q, k, v):
    while q.shape[2] >= int(os.environ["HOLD_AT"]) and os.path.exists(os.environ["FAULT_HOLD"]):
        time.sleep(0.02)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
'''


@pytest.mark.parametrize("hold_at, rows, expected", [
    (16, 0, "interrupted before a case finished: {d} holds no row yet; finish with `tflabench run {s} --resume {d}`"),
    (32, 1, "interrupted: 1 case(s) measured so far are kept in {d}; finish with `tflabench run {s} --resume {d}`"),
])
def test_sigterm_says_what_is_kept_at_that_moment(tmp_path, hold_at, rows, expected):
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "held.py").write_text(HELD)
    suite = _write_suite(tmp_path / "held.yaml", numerics={"check": False}, kernels=[
        {"backend": "custom", "label": "held", "params": {"function": f"{tmp_path}/held.py:held",
                                                          "layout": "attention", "heads": 2}}])
    hold = tmp_path / "hold"
    hold.touch()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, HOLD_AT=str(hold_at), FAULT_HOLD=str(hold),
               PYTHONPATH=os.pathsep.join([str(root), str(root / "kernels"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "tflabench", "run", str(suite), "--out", str(tmp_path / "out"),
                             "--no-progress", "--no-plots"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    directory = None
    while time.monotonic() < deadline:
        found = list((tmp_path / "out").glob("hostile/*/"))
        if found and (found[0] / R.METADATA_FILE).exists() and (
                (found[0] / R.ROWS_FILE).exists() and (found[0] / R.ROWS_FILE).read_bytes().count(b"\n") >= rows):
            directory = found[0]
            time.sleep(0.5)  # the held case has started
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert directory is not None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == expected.format(d=directory, s=suite)
    assert len(R.load_results(directory).rows) == rows


def test_interruption_before_anything_is_written_leaves_nothing(tmp_path, monkeypatch):
    from tflabench import environment
    from tflabench.cli.run_cmds import _interrupted_line
    from tflabench.run.pool import RunInterrupted

    suite = _write_suite(tmp_path / "s.yaml")

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(environment, "collect", stop)  # before the result set exists
    with pytest.raises(RunInterrupted) as info:
        run_suite(load_suite(suite), out_root=tmp_path / "out", progress=False, console=Console(file=StringIO()))
    assert info.value.directory is None and not list(tmp_path.glob("out/hostile/*"))
    assert _interrupted_line(info.value, suite) == "interrupted before a result set was created: nothing was written"
    monkeypatch.undo()
    monkeypatch.setattr(R, "write_metadata", stop)  # the set exists, nothing written to it yet
    with pytest.raises(RunInterrupted) as info:
        run_suite(load_suite(suite), out_root=tmp_path / "out", progress=False, console=Console(file=StringIO()))
    assert info.value.directory is None and not list(tmp_path.glob("out/hostile/*"))  # the empty set went again


# --------------------------------------------------------------------------- user text is data


ODD = "[/] $a^$ [batch, seq] :smile: \\frac"
KERNELS = '''
import sys, torch

def good(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

def refuses(q, k, v):
    raise ValueError("Expected [batch, seq] got [/] and $a^$ :smile: [bold]x[/bold]")

def loud(q, k, v):
    sys.stdout.write("x" * 99 + "\\n")
    sys.stdout.write(("y" * 99 + "\\n") * 200)
    sys.stdout.write("LAST LINE OF THE CALL\\n")
    sys.stdout.flush()
    return good(q, k, v)
'''


def _custom_suite(tmp_path: Path, kernels: list[tuple[str, str]], **over) -> Path:
    (tmp_path / "odd_kernels.py").write_text(KERNELS)
    return _write_suite(tmp_path / "odd.yaml", kernels=[
        {"backend": "custom", "label": label, "params": {"function": f"{tmp_path}/odd_kernels.py:{fn}",
                                                         "layout": "attention", "heads": 2}}
        for label, fn in kernels], **over)


def test_labels_and_error_messages_print_literally_in_tables_figures_and_html(tmp_path):
    suite = _custom_suite(tmp_path, [(ODD, "good"), (f"bad {ODD}", "refuses")])
    wide = {"COLUMNS": "250"}  # tables keep every column whole
    result = cli.invoke(app, ["run", str(suite), "--out", str(tmp_path / "out"), "--no-progress"], env=wide)
    assert result.exit_code == 0, result.output
    assert ODD in result.stdout and "Expected [batch, seq] got [/] and $a^$ :smile:" in result.stdout
    assert "[bold]x[/bold]" in result.stdout  # the reason column folds after 60 characters
    directory = next((tmp_path / "out").glob("hostile/*/"))
    assert (directory / "plots" / "runtime.png").stat().st_size > 0  # the $a^$ legend entry drew
    report = cli.invoke(app, ["report", str(directory), "--html", str(tmp_path / "r.html"), "--out",
                                str(tmp_path / "plots")], env=wide)
    assert report.exit_code == 0, report.output
    assert ODD in report.stdout
    page = (tmp_path / "r.html").read_text()
    assert "[/] $a^$ [batch, seq] :smile: \\frac" in page.replace("&#x27;", "'")
    compare = cli.invoke(app, ["compare", str(directory), str(directory), "--all", "--fail-on", "none"], env=wide)
    assert compare.exit_code == 0, compare.output
    assert ODD in compare.stdout and "Traceback" not in compare.output


def test_report_no_plots_writes_no_figure_even_with_html(tmp_path, measured):
    directory = _copy(measured, tmp_path)
    shutil.rmtree(directory / "plots", ignore_errors=True)
    before = _snapshot(directory)
    result = cli.invoke(app, ["report", str(directory), "--no-plots", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert _snapshot(directory) == before  # no plots/ in the set
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()  # the page still has its figures
    assert not any(tmp_path.glob("tflabench-report-*"))


def test_worker_log_keeps_the_head_and_the_tail_of_each_case(tmp_path, monkeypatch):
    from tflabench.run import pool as worker_pool

    monkeypatch.setattr(worker_pool, "LOG_HEAD_BYTES", 2000)
    monkeypatch.setattr(worker_pool, "LOG_TAIL_BYTES", 1000)
    suite = _custom_suite(tmp_path, [("loud", "loud")], timing={"warmup": 1, "iterations": 3, "timeout_s": 60})
    result = run_suite(load_suite(suite), out_root=tmp_path / "out", progress=False, console=Console(file=StringIO()))
    assert [r["status"] for r in result.rows] == ["ok", "ok"]
    log = (result.directory / "logs" / "worker-0.log").read_text()
    cases = log.split("--- case ")[1:]
    assert len(cases) == 2
    for text in cases:  # each case: 5 calls x 20 KB printed, 3 KB kept, the last line among them
        assert len(text.encode()) < 2000 + 1000 + 300
        assert "bytes of this case's output left out" in text
        assert text.rstrip().endswith("LAST LINE OF THE CALL")
