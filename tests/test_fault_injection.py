"""Fault injection on the CPU: result sets survive a killed run, a torn line, a truncated
table, an unwritable or full disk, a second run, and a suite that names a path.

Each test says what is kept (every whole row), what is said (one line; exit status 2
for what the user can fix) and checks that no file appears outside the result set
(``_new_files``). The suites are tiny ``custom``-backend suites whose kernel is torch's
SDPA (``good``), or SDPA that waits at S >= 32 while a file exists (``held``: the test
holds a run there, to start a second run beside it and to kill it from outside)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

import pytest
import yaml
from conftest import one_error_line, write_custom_suite
from rich.console import Console
from typer.testing import CliRunner

from tflabench.store import results as R
from tflabench.store import files as store_files
from tflabench.store.lock import LOCK_FILE, ResultSetLock
from tflabench.store.schema import new_row
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.report.plots.benchmark import write_plots
from tflabench.store.suite import load_suite
from tflabench.run.suite_run import run_suite

ROOT = Path(__file__).resolve().parent.parent
cli = CliRunner()

KERNELS = textwrap.dedent('''
    import os, time, torch

    def good(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def held(q, k, v):
        # from S = 32 on, wait while the file $FAULT_HOLD exists: the test holds the run there
        while q.shape[2] >= 32 and os.path.exists(os.environ.get("FAULT_HOLD", "/nonexistent")):
            time.sleep(0.02)
        return good(q, k, v)
''')


def _suite(tmp_path: Path, name="faults", fn="good", seq_len=(16, 32), label="sdpa", **over) -> Path:
    """A suite file of one custom kernel of :data:`KERNELS`; ``over`` replaces top-level fields."""
    return write_custom_suite(tmp_path, KERNELS, "fault_kernels", name=name, fn=fn, seq_len=seq_len, label=label,
                              **over)


def _files(root: Path) -> set[Path]:
    """Files under ``root``, without Python's bytecode caches (``__pycache__``: written by the
    interpreter when a worker imports the suite's kernel module, unless
    PYTHONDONTWRITEBYTECODE is set; not a file tflabench writes)."""
    return {p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _new_files(before: set[Path], root: Path, inside: Path | None) -> set[Path]:
    """Files under ``root`` that are new since ``before`` and not inside ``inside``."""
    return {p for p in _files(root) - before if inside is None or inside not in p.parents}


def _whole_lines(path: Path) -> list[dict]:
    """Every line of ``rows.jsonl``, each asserted to be one whole JSON row."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "rows.jsonl must end in a whole line"
    return [json.loads(line) for line in data.decode().splitlines()]


def _cli_env(**extra: str) -> dict:
    env = dict(os.environ, COLUMNS="200", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return env


def _start_run(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tflabench", "run", *args, "--no-progress", "--no-plots"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(directory_glob: Path, n: int, proc: subprocess.Popen, timeout_s=120.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rows in directory_glob.parent.glob(f"{directory_glob.name}/{R.ROWS_FILE}"):
            if rows.read_bytes().count(b"\n") >= n:
                return rows.parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {n} rows within {timeout_s} s")


# --------------------------------------------------------------------------- killed runs


def test_sigkill_mid_run_keeps_every_whole_row_and_resume_takes_over_the_lock(tmp_path):
    suite = _suite(tmp_path, fn="held", seq_len=(8, 16, 24, 32, 40, 48))
    hold = tmp_path / "hold"
    hold.write_text("the first run waits at S=32 while this file exists")
    before = _files(tmp_path)
    proc = _start_run([str(suite), "--out", str(tmp_path / "out")], tmp_path, _cli_env(FAULT_HOLD=str(hold)))
    try:
        directory = _wait_for_rows(tmp_path / "out" / "faults" / "*", 3, proc)  # now held at S=32
        # a second run on the same result set, while the first writes it: refused
        second = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
        line = one_error_line(second)
        assert f"pid {proc.pid} on host {socket.gethostname()}" in line and "being written by another run" in line
        os.kill(proc.pid, signal.SIGKILL)  # power loss / OOM killer: no handler runs
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    hold.unlink()
    kept = _whole_lines(directory / R.ROWS_FILE)
    assert [r["seq_len"] for r in kept] == [8, 16, 24]
    owner = json.loads((directory / LOCK_FILE).read_text())
    assert owner["pid"] == proc.pid  # the killed run could not remove its lock
    assert not (directory / R.PARQUET_FILE).exists()  # killed before the table: rows.jsonl is enough
    rs = R.load_results(directory)
    assert len(rs.rows) == len(kept) and not rs.warnings
    report = cli.invoke(app, ["report", str(directory), "--no-plots"])
    assert report.exit_code == 0, report.output

    resumed = subprocess.run([sys.executable, "-m", "tflabench", "run", str(suite), "--resume", str(directory),
                              "--no-progress", "--no-plots"], cwd=tmp_path, env=_cli_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"took over the lock of pid {proc.pid}" in resumed.stderr
    rows = _whole_lines(directory / R.ROWS_FILE)
    assert rows[: len(kept)] == kept and len(rows) == 6  # the earlier rows, untouched, then the rest
    assert sorted(r["seq_len"] for r in rows) == [8, 16, 24, 32, 40, 48]
    assert not (directory / LOCK_FILE).exists() and not list(directory.glob(".*.tmp"))
    assert _new_files(before, tmp_path, directory) == set()


DRIVER = textwrap.dedent('''
    # driver.py N ARGS: `tflabench run ARGS`, SIGKILLed halfway through writing row N.
    import os, signal, sys
    from tflabench.store import files

    n_row, args = int(sys.argv[1]), sys.argv[2:]
    real, count = files.write_all, [0]

    def torn_write(fd, data):
        count[0] += 1
        if count[0] == n_row:
            real(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real(fd, data)

    if __name__ == "__main__":  # not again in the spawned workers, which import this file
        files.write_all = torn_write
        from tflabench.cli import app
        app(["run", *args, "--no-progress", "--no-plots"])
''')


def test_sigkill_mid_write_leaves_a_torn_line_that_resume_sets_aside(tmp_path):
    suite = _suite(tmp_path, seq_len=(16, 32, 48))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    before = _files(tmp_path)
    killed = subprocess.run([sys.executable, str(driver), "3", str(suite), "--out", str(tmp_path / "out")],
                            cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (directory,) = (tmp_path / "out" / "faults").iterdir()
    data = (directory / R.ROWS_FILE).read_bytes()
    assert data.count(b"\n") == 2 and not data.endswith(b"\n")  # two rows and half of the third

    rs = R.load_results(directory)  # loading reads the two rows, says what it skipped, changes nothing
    assert len(rs.rows) == 2 and len(rs.warnings) == 1 and "line 3 is a torn last row" in rs.warnings[0]
    assert (directory / R.ROWS_FILE).read_bytes() == data
    for args in (["report", str(directory), "--no-plots"], ["compare", str(directory), str(directory)]):
        result = cli.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "line 3 is a torn last row" in result.stderr

    resumed = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert resumed.exit_code == 0, resumed.output
    assert "line 3 is a torn last row (a run died while writing it): set aside into" in resumed.stderr
    rows = _whole_lines(directory / R.ROWS_FILE)
    assert [r["seq_len"] for r in rows] == [16, 32, 48]
    (record,) = [json.loads(x) for x in (directory / R.SET_ASIDE_FILE).read_text().splitlines()]
    assert record["line"] == 3 and data.decode().endswith(record["text"])
    assert R.load_results(directory).warnings == []
    assert _new_files(before, tmp_path, directory) == set()


# --------------------------------------------------------------------------- torn lines, tables


def _copy(measured, tmp_path) -> tuple[Path, Path]:
    suite, directory = measured
    copy = tmp_path / "set"
    shutil.copytree(directory, copy)
    shutil.copy(suite, tmp_path / suite.name)
    shutil.copy(suite.parent / "measured_kernels.py", tmp_path / "measured_kernels.py")
    return tmp_path / suite.name, copy


def test_truncated_last_line_is_set_aside_on_resume_never_glued(measured, tmp_path):
    # The reproduction 1 on a small suite: one whole row, then a torn one.
    suite, directory = _copy(measured, tmp_path)
    first = (directory / R.ROWS_FILE).read_text().splitlines()[0]
    (directory / R.ROWS_FILE).write_text(first + "\n" + '{"case_id": "trunc')
    before = _files(tmp_path)
    result = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "line 2 is a torn last row" in result.stderr and "1 already measured" in result.stderr
    rows = _whole_lines(directory / R.ROWS_FILE)
    assert json.dumps(rows[0]) == json.dumps(json.loads(first)) and len(rows) == 2
    assert json.loads((directory / R.SET_ASIDE_FILE).read_text())["text"] == '{"case_id": "trunc'
    assert cli.invoke(app, ["report", str(directory), "--no-plots"]).exit_code == 0
    assert cli.invoke(app, ["compare", str(measured[1]), str(directory)]).exit_code in (0, 1)  # read, judged
    assert _new_files(before, tmp_path, directory) == set()


def test_row_glued_onto_a_torn_row_by_an_earlier_version_is_recovered(measured, tmp_path):
    # What resuming did before: the next row appended onto the torn line.
    _, directory = _copy(measured, tmp_path)
    one, two = (directory / R.ROWS_FILE).read_text().splitlines()
    (directory / R.ROWS_FILE).write_text(one[:40] + two + "\n")
    rs = R.load_results(directory)
    assert list(rs.rows["case_id"]) == [json.loads(two)["case_id"]]
    assert "with a whole row appended to it" in rs.warnings[0]
    assert R.repair_rows(directory) and _whole_lines(directory / R.ROWS_FILE) == [json.loads(two)]
    assert json.loads((directory / R.SET_ASIDE_FILE).read_text())["text"] == one[:40]


def test_zeroed_tail_of_a_power_loss_is_not_a_row(measured, tmp_path):
    # ext4 and others can leave NUL bytes where a file's last block was not written.
    _, directory = _copy(measured, tmp_path)
    one = (directory / R.ROWS_FILE).read_text().splitlines()[0]
    (directory / R.ROWS_FILE).write_bytes(one.encode() + b"\n" + b"\x00" * 512)
    assert len(R.load_results(directory).rows) == 1
    assert R.repair_rows(directory) == [] and _whole_lines(directory / R.ROWS_FILE) == [json.loads(one)]
    (directory / R.ROWS_FILE).write_bytes(one.encode() + b"\n" + one[:30].encode() + b"\x00" * 512)
    rs = R.load_results(directory)
    assert len(rs.rows) == 1 and "line 2 is a torn last row" in rs.warnings[0]


def test_reading_a_set_while_a_live_run_writes_it_does_not_call_the_last_line_torn(measured, tmp_path):
    _, directory = _copy(measured, tmp_path)
    one = (directory / R.ROWS_FILE).read_text().splitlines()[0]
    (directory / R.ROWS_FILE).write_text(one + "\n" + one[:30])
    with ResultSetLock(directory):  # this process plays the run that is appending
        rs = R.load_results(directory)
    assert len(rs.rows) == 1 and "line 2 is not whole yet" in rs.warnings[0]
    assert (directory / R.ROWS_FILE).read_text() == one + "\n" + one[:30]


def test_unreadable_middle_line_is_refused_in_one_line_with_the_way_out(measured, tmp_path):
    _, directory = _copy(measured, tmp_path)
    one, two = (directory / R.ROWS_FILE).read_text().splitlines()
    (directory / R.ROWS_FILE).write_text(one + "\nedited by hand\n" + two + "\n")
    line = one_error_line(cli.invoke(app, ["report", str(directory), "--no-plots"]))
    assert "line 2 is not JSON" in line and "--resume" in line and R.SET_ASIDE_FILE in line


def test_truncated_parquet_is_never_read_while_the_rows_are_there_and_is_rewritten_on_resume(measured, tmp_path):
    suite, directory = _copy(measured, tmp_path)
    expected = R.load_results(directory).rows
    table = directory / R.PARQUET_FILE
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    assert R.load_results(directory).rows.equals(expected)
    for args in (["report", str(directory), "--no-plots"], ["compare", str(measured[1]), str(directory)]):
        assert cli.invoke(app, args).exit_code in (0, 1)
    result = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    import pandas as pd

    assert len(pd.read_parquet(table)) == 2
    # a table alone, truncated: one line, exit 2
    (directory / R.ROWS_FILE).unlink()
    table.write_bytes(table.read_bytes()[:100])
    assert "cannot read result rows" in one_error_line(cli.invoke(app, ["report", str(directory)]))


def test_sets_without_their_table_are_read_by_report_compare_and_merge(tmp_path):
    def shard_set(k: int, seq_len: int) -> Path:
        row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                        dtype="float32", device="cpu", batch=1, seq_len=seq_len, heads=2, d_qk=16, d_hv=16,
                        chunk_size=None, embedding_dim=32)
        row.update(status="ok", ms_median=1.0, ms_samples=[1.0, 1.0])
        directory = R.write_results(tmp_path / f"shard{k}", [row], {"suite": "s", "shard": f"{k}/2"})
        (directory / R.PARQUET_FILE).unlink()  # the run died before writing its table
        return directory

    one, two = shard_set(1, 16), shard_set(2, 32)
    assert cli.invoke(app, ["report", str(one), "--no-plots"]).exit_code == 0
    assert cli.invoke(app, ["compare", str(one), str(one)]).exit_code == 0
    merged = cli.invoke(app, ["merge", str(one), str(two), "--out", str(tmp_path / "merged")])
    assert merged.exit_code == 0, merged.output
    assert len(R.load_results(tmp_path / "merged").rows) == 2


def test_killed_table_write_leaves_the_previous_table_and_no_partial_file(measured, tmp_path, monkeypatch):
    _, directory = _copy(measured, tmp_path)
    table = directory / R.PARQUET_FILE
    old = table.read_bytes()
    import pandas as pd

    def dies_halfway(self, path, **kw):
        Path(path).write_bytes(b"PAR1 half a table")
        raise KeyboardInterrupt  # SIGTERM mid-write
    monkeypatch.setattr(pd.DataFrame, "to_parquet", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        R.finalize(directory)
    assert table.read_bytes() == old and not list(directory.glob(".*.tmp"))


# --------------------------------------------------------------------------- disks


def test_full_disk_stops_the_run_keeps_whole_rows_and_says_how_to_finish(tmp_path, monkeypatch):
    suite = _suite(tmp_path, seq_len=(16, 32, 48))
    real, count = store_files.write_all, [0]

    def disk_fills(fd, data):  # the second row: half of it fits, then ENOSPC
        count[0] += 1
        if count[0] == 2:
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(store_files, "write_all", disk_fills)
    before = _files(tmp_path)
    result = cli.invoke(app, ["run", str(suite), "--out", str(tmp_path / "out"), "--no-progress", "--no-plots"])
    line = one_error_line(result)
    (directory,) = (tmp_path / "out" / "faults").iterdir()
    assert f"cannot write {directory / R.ROWS_FILE}: No space left on device (ENOSPC)" in line
    assert f"--resume {directory}" in line
    assert [r["seq_len"] for r in _whole_lines(directory / R.ROWS_FILE)] == [16]  # the torn half cut off
    assert not (directory / LOCK_FILE).exists()
    monkeypatch.setattr(store_files, "write_all", real)  # space freed: the resume finishes
    resumed = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["seq_len"] for r in _whole_lines(directory / R.ROWS_FILE)] == [16, 32, 48]
    assert _new_files(before, tmp_path, directory) == set()


def test_full_disk_at_the_table_keeps_the_rows_readable(measured, tmp_path, monkeypatch):
    suite, directory = _copy(measured, tmp_path)
    (directory / R.PARQUET_FILE).unlink()
    import pandas as pd

    def no_space(self, path, **kw):
        Path(path).write_bytes(b"PAR1")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_space)
    result = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "warning: cannot write" in result.stderr and "rows.jsonl holds every row" in result.stderr
    assert not (directory / R.PARQUET_FILE).exists() and not list(directory.glob(".*.tmp"))
    assert len(R.load_results(directory).rows) == 2


def test_unwritable_output_directory_is_one_line_exit_2(tmp_path):
    suite = _suite(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    before = _files(tmp_path)
    line = one_error_line(cli.invoke(app, ["run", str(suite), "--out", str(blocker / "results")]))
    assert f"cannot create a result set under {str(blocker / 'results')!r}: Not a directory" in line
    assert "--out" in line and _new_files(before, tmp_path, None) == set()


def test_read_only_output_directory_is_one_line_exit_2(tmp_path, monkeypatch):
    suite = _suite(tmp_path)
    out = tmp_path / "ro"
    out.mkdir(mode=0o555)
    if os.geteuid() == 0:
        # root writes into a 0o555 directory: make creating anything under it fail as the
        # kernel fails it for other users
        real_mkdir = Path.mkdir

        def denied(self, *args, **kwargs):
            if out in self.parents:
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)
        monkeypatch.setattr(Path, "mkdir", denied)
    try:
        line = one_error_line(cli.invoke(app, ["run", str(suite), "--out", str(out)]))
        assert "Permission denied" in line and "--out" in line
    finally:
        out.chmod(0o755)


# --------------------------------------------------------------------------- locks


def test_lock_of_another_host_is_refused_with_how_to_clear_it(measured, tmp_path):
    suite, directory = _copy(measured, tmp_path)
    (directory / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "gpu-node-7", "started": "earlier"}))
    rows = (directory / R.ROWS_FILE).read_bytes()
    line = one_error_line(cli.invoke(app, ["run", str(suite), "--resume", str(directory)]))
    assert "pid 1 on host gpu-node-7" in line and f"delete {directory / LOCK_FILE}" in line
    assert (directory / R.ROWS_FILE).read_bytes() == rows


def test_lock_is_exclusive_and_released(tmp_path):
    with ResultSetLock(tmp_path) as lock:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(UserError, match=f"pid {os.getpid()} on host"):
            ResultSetLock(tmp_path).acquire()
        assert lock.note is None
    assert not (tmp_path / LOCK_FILE).exists()


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name, why", [("../../escape", "contains a path separator"),
                                       ("a/b", "contains a path separator"), ("..", "contains '..'"),
                                       ("a..b", "contains '..'"), (".hidden", "is not a plain name"),
                                       ("x" * 129, "is 129 characters long"), ("größe", "is not a plain name")])
def test_suite_name_that_is_a_path_is_refused_and_nothing_is_written(tmp_path, name, why):
    out = tmp_path / "deep" / "er" / "results"
    suite = _suite(tmp_path, name="named")
    suite.write_text(suite.read_text().replace("name: named", f"name: '{name}'"))
    before = _files(tmp_path)
    line = one_error_line(cli.invoke(app, ["run", str(suite), "--out", str(out)]))
    assert f"{suite}: name: a suite name" in line and why in line
    assert _new_files(before, tmp_path, None) == set() and not out.exists()


def test_result_directory_cannot_leave_its_root_even_without_a_suite_file(tmp_path):
    with pytest.raises(UserError, match="contains a path separator"):
        R.new_result_directory(tmp_path / "results", "../escape")
    assert list(tmp_path.iterdir()) == []


def test_kernel_label_that_looks_like_a_path_stays_data(tmp_path):
    suite = _suite(tmp_path, label="../../../label/escape", seq_len=(16,))
    before = _files(tmp_path)
    result = run_suite(load_suite(suite), out_root=tmp_path / "out", progress=False,
                       console=Console(file=StringIO()))
    write_plots(result.directory)   # the figures too stay inside the result set
    assert R.load_results(result.directory).rows["kernel"].tolist() == ["../../../label/escape"]
    assert _new_files(before, tmp_path, result.directory) == set()


# --------------------------------------------------------------------------- resume checks


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["timing"].update(iterations=3), "timing.iterations is 3 in this run but 2 in the result set"),
    (lambda d: d.update(dtype="float64"), 'dtype is "float64" in this run but "float32"'),
    (lambda d: d.update(seed=1), "seed is 1 in this run but 0"),
    (lambda d: d["numerics"].update(tolerance=0.5), "numerics.tolerance is 0.5 in this run but null"),
    (lambda d: d["kernels"][0]["params"].update(heads=1), "kernels['sdpa'].params.heads is 1 in this run but 2"),
])
def test_resume_refuses_a_suite_measuring_differently_naming_the_field(measured, tmp_path, edit, field):
    suite, directory = _copy(measured, tmp_path)
    data = yaml.safe_load(suite.read_text())
    edit(data)
    suite.write_text(yaml.safe_dump(data, sort_keys=False))
    files = {p: p.read_bytes() for p in _files(directory)}
    line = one_error_line(cli.invoke(app, ["run", str(suite), "--resume", str(directory)]))
    assert field in line and "start a fresh run" in line
    assert {p: p.read_bytes() for p in _files(directory)} == files  # refused before touching anything


def test_a_timing_field_the_result_set_predates_counts_with_its_value_then():
    """A set written before timing.cuda_graph existed was timed eagerly: resuming it with
    graph replays is a different method, with eager timing it is the same."""
    from tflabench.store.resume import differences

    old = {"timing": {"warmup": 1, "iterations": 2, "timeout_s": 30.0, "sync_each": False}}
    now = {"warmup": 1, "iterations": 2, "timeout_s": 60.0, "sync_each": False, "warmup_s": 0.0}
    assert differences(old, {"timing": dict(now, cuda_graph=True)}) == [("timing.cuda_graph", False, True)]
    assert differences(old, {"timing": dict(now, cuda_graph=False)}) == []


def test_resume_refuses_other_software(measured, tmp_path, monkeypatch):
    from tflabench import environment

    suite, directory = _copy(measured, tmp_path)
    real = environment.collect
    monkeypatch.setattr(environment, "collect", lambda: {**real(), "torch": "9.9.9"})
    with pytest.raises(UserError, match=r'torch is "9.9.9" in this run but .* resume where it began'):
        run_suite(load_suite(suite), resume=directory, progress=False)


def test_resume_after_a_peer_was_installed_says_where_its_cases_can_go(measured, tmp_path, monkeypatch):
    from tflabench import environment

    suite, directory = _copy(measured, tmp_path)
    real = environment.collect
    monkeypatch.setattr(environment, "collect",
                        lambda: {**real(), "peers": {**(real().get("peers") or {}), "flash-attn-4": "4.0.0b36"}})
    with pytest.raises(UserError, match=r"peers is .* or resume with the peers it began with; to add a peer "
                                        r"installed since, run its kernels alone \(--only LABEL\) as a new "
                                        r"result set beside this one$"):
        run_suite(load_suite(suite), resume=directory, progress=False)


def test_resume_accepts_an_edited_sweep_and_lists_new_and_removed_cases(measured, tmp_path):
    suite, directory = _copy(measured, tmp_path)
    data = yaml.safe_load(suite.read_text())
    data["sweep"]["seq_len"] = [32, 48]  # 16 removed, 48 added
    data["timing"]["timeout_s"] = 90  # a limit, not a condition
    suite.write_text(yaml.safe_dump(data, sort_keys=False))
    out = StringIO()
    result = run_suite(load_suite(suite), resume=directory, progress=False,
                       console=Console(file=out, width=200))
    text = out.getvalue()
    assert "resume: 1 case new in the suite since the result set began (they run now):\n  sdpa fwd float32 B1 S48 NH2 d16/16\n" in text
    assert "resume: 1 case no longer in the suite (rows already measured stay in the result set):\n  sdpa fwd float32 B1 S16 NH2 d16/16\n" in text
    assert [r["seq_len"] for r in result.rows] == [48] and result.skipped == 1
    rs = R.load_results(directory)
    assert sorted(rs.rows["seq_len"]) == [16, 32, 48]
    assert rs.metadata["resumed"][-1]["cases_added"] == 1 and rs.metadata["resumed"][-1]["cases_removed"] == 1
