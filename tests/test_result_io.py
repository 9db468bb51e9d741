"""Result sets from elsewhere (docs/result-sets.md): links and
non-regular files refused on read, reads bounded, writes through a temporary file and a
rename, the lock an OS file lock, merge whole or not at all, no orphan processes, exit
status 2 (never a traceback) for a damaged set, SIGTERM as Ctrl-C; and a property test of
the readers behind report, compare, merge and --resume."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from tflabench.store import results as R
from tflabench.store import files as store_files
from tflabench.store.files import ResultWriteError, install_file
from tflabench.store.lock import LOCK_FILE, ResultSetLock
from tflabench.store.schema import COLUMNS, METADATA_TYPES, TIMING_FIELD_TYPES, new_row
from tflabench.store import shard
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.store.suite import load_suite
from tflabench.run.suite_run import run_suite

ROOT = Path(__file__).resolve().parent.parent
cli = CliRunner()

KERNELS = textwrap.dedent('''
    import os, subprocess, sys, time, torch

    def good(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def _spawn_sleeper():
        # a process the case starts (a kernel's helper, a compiler) that would sleep forever
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        path = os.environ["ORPHAN_PID_FILE"]
        with open(path + ".tmp", "w") as fh:
            fh.write(str(child.pid))
        os.replace(path + ".tmp", path)

    def spawns_and_hangs(q, k, v):
        _spawn_sleeper()
        time.sleep(600)

    def spawns_and_crashes(q, k, v):
        _spawn_sleeper()
        os.abort()
''')


def _suite(tmp_path: Path, fn="good", seq_len=(16, 32), timeout_s=60.0, name="io") -> Path:
    """A suite file of one custom kernel of :data:`KERNELS`."""
    return write_custom_suite(tmp_path, KERNELS, "io_kernels", name=name, fn=fn, seq_len=seq_len, timeout_s=timeout_s)


def _env(**extra: str) -> dict:
    env = dict(os.environ, COLUMNS="200", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return env


def _row(seq_len=64, **over) -> dict:
    row = new_row(suite="io", kernel="k", backend="custom", family="custom", params={"x": 1}, mode="fwd",
                    dtype="float32", device="cpu", batch=1, seq_len=seq_len, heads=2, d_qk=16, d_hv=16,
                    chunk_size=None, embedding_dim=32)
    row.update(status="ok", ms_median=1.0, ms_samples=[1.0, 1.0, 1.0])
    row.update(over)
    return row


@pytest.fixture
def small_set(tmp_path) -> Path:
    return R.write_results(tmp_path / "set", [_row(64), _row(128)], {"suite": "io", "date": "2026-01-01"})


def _gone(pid: int, within_s: float = 15.0) -> bool:
    """Whether process ``pid`` no longer runs (gone, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


# --------------------------------------------------------------------------- links and special files


def test_report_refuses_a_set_with_a_planted_link_and_writes_nothing_through_it(small_set, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (small_set / "plots").mkdir()
    (small_set / "plots" / "runtime.png").symlink_to(victim)
    line = one_error_line(cli.invoke(app, ["report", str(small_set)]))
    assert str(small_set / "plots" / "runtime.png") in line and "symbolic link" in line
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", [R.ROWS_FILE, R.METADATA_FILE])
def test_a_set_file_linked_to_dev_zero_or_a_fifo_is_refused_at_once(small_set, name):
    (small_set / name).unlink()
    (small_set / name).symlink_to("/dev/zero")
    line = one_error_line(cli.invoke(app, ["report", str(small_set), "--no-plots"]))
    assert str(small_set / name) in line and "symbolic link" in line
    (small_set / name).unlink()
    os.mkfifo(small_set / name)  # nobody writes it: reading it would wait forever
    line = one_error_line(cli.invoke(app, ["compare", str(small_set), str(small_set)]))
    assert str(small_set / name) in line and "FIFO" in line


def test_reads_are_bounded_per_file(small_set, monkeypatch):
    (small_set / R.PARQUET_FILE).unlink()  # rows.jsonl alone (a killed run's set)
    size = (small_set / R.ROWS_FILE).stat().st_size
    monkeypatch.setattr(store_files, "MAX_ROWS_FILE_BYTES", size - 1)
    with pytest.raises(UserError, match=f"{size} bytes, more than the {size - 1} bytes"):
        R.load_results(small_set)
    monkeypatch.setattr(store_files, "MAX_ROWS_FILE_BYTES", size)
    assert len(R.load_results(small_set).rows) == 2


def test_atomic_write_replaces_a_planted_link_instead_of_writing_through_it(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "set" / "metadata.json"
    target.parent.mkdir()
    target.symlink_to(victim)
    R.write_metadata(target.parent, {"suite": "io"})
    assert victim.read_text() == "precious" and not target.is_symlink()
    assert json.loads(target.read_text())["suite"] == "io"
    # a link planted under the temporary file's name is not followed either
    monkeypatch.setattr(store_files.uuid, "uuid4", lambda: type("U", (), {"hex": "0" * 32})())
    planted = target.with_name(f".{target.name}.{os.getpid()}.00000000.tmp")
    planted.symlink_to(victim)
    with pytest.raises(ResultWriteError):
        R.write_metadata(target.parent, {"suite": "io2"})
    assert victim.read_text() == "precious"
    # install_file (figures) refuses a directory that is a link
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "set" / "plots").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ResultWriteError, match="symbolic link, not a directory"):
        install_file(victim, tmp_path / "set" / "plots" / "runtime.png")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_resume_refuses_a_linked_worker_log(measured, tmp_path):
    suite, directory = measured
    copy = tmp_path / "set"
    import shutil

    shutil.copytree(directory, copy)
    victim = tmp_path / "victim.log"
    victim.write_text("precious")
    log = copy / "logs" / "worker-0.log"
    log.unlink()
    log.symlink_to(victim)
    line = one_error_line(cli.invoke(app, ["run", str(suite), "--resume", str(copy), "--no-progress",
                                            "--no-plots"]))
    assert str(log) in line and "symbolic link" in line
    assert victim.read_text() == "precious"


# --------------------------------------------------------------------------- damaged values: exit 2


@pytest.mark.parametrize("change, field", [
    (lambda rows, meta: rows[0].update(ms_median=math.inf), "ms_median"),
    (lambda rows, meta: rows[0].update(mode="xyz"), "has mode 'xyz', not one of fwd, fwdbw"),
    (lambda rows, meta: meta.update(measurement={"timing": {"warmup_s": "five"}}), "measurement.timing.warmup_s"),
    (lambda rows, meta: meta.update(shards_incomplete=[{"cases_missing": "3"}]), "cases_missing"),
    (lambda rows, meta: meta.update(git_commit_date=20260101), "'git_commit_date' is an integer, not a string"),
])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_mistyped_or_infinite_value_in_a_set_is_one_line_naming_the_field(tmp_path, change, field, command):
    rows, meta = [_row(64), _row(128)], {"suite": "io"}
    change(rows, meta)
    directory = R.write_results(tmp_path / "set", [_row(64), _row(128)], {"suite": "io"})
    (directory / R.ROWS_FILE).write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    (directory / R.METADATA_FILE).write_text(json.dumps(meta))
    args = ["report", str(directory), "--no-plots"] if command == "report" else ["compare", str(directory),
                                                                                   str(directory)]
    assert field in one_error_line(cli.invoke(app, args))


def test_suite_with_a_control_character_is_one_line_exit_2(tmp_path):
    path = _suite(tmp_path)
    path.write_text(path.read_text().replace("name: io", "name: i\x07o"))
    line = one_error_line(cli.invoke(app, ["run", str(path), "--no-progress"]))
    assert str(path) in line and "#x0007" in line


def test_a_line_nested_200000_deep_is_an_unreadable_line_not_a_crash(measured, tmp_path):
    import shutil

    suite, directory = measured
    copy = tmp_path / "set"
    shutil.copytree(directory, copy)
    rows = (copy / R.ROWS_FILE).read_text()
    deep = "[" * 200_000 + "]" * 200_000
    (copy / R.ROWS_FILE).write_text(deep + "\n" + rows)
    assert "line 1 is not JSON" in one_error_line(cli.invoke(app, ["report", str(copy), "--no-plots"]))
    # a resume sets it aside as any unreadable line (docs/harness.md, "Crash safety"), then goes on
    result = cli.invoke(app, ["run", str(suite), "--resume", str(copy), "--no-progress", "--no-plots"])
    assert result.exit_code == 0 and "line 1 is not a JSON row: set aside" in result.stderr, result.output
    assert json.loads((copy / R.SET_ASIDE_FILE).read_text())["text"] == deep


def test_a_sweep_of_a_billion_cases_is_refused_before_any_list_is_built(tmp_path):
    path = _suite(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["sweep"] = {"batch": list(range(1, 40_001)), "seq_len": list(range(1, 40_001))}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="expands to 1,600,000,000 cases, more than max_cases 10,000"):
        load_suite(path)


# --------------------------------------------------------------------------- locks


def _hold_lock(directory, ready, release):
    lock = ResultSetLock(directory).acquire()
    ready.set()
    release.wait(60)
    lock.release()


def test_a_live_lock_is_never_taken_over_even_when_its_pid_looks_dead(tmp_path):
    # what a run in another PID namespace of this host looks like: its pid means nothing here
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path, ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        owner = json.loads((tmp_path / LOCK_FILE).read_text())
        (tmp_path / LOCK_FILE).write_text(json.dumps({**owner, "pid": 2**22 + 17}))  # no such process here
        assert ResultSetLock(tmp_path).held()
        with pytest.raises(UserError, match="being written by another run"):
            ResultSetLock(tmp_path).acquire()
    finally:
        release.set()
        holder.join(60)
    with ResultSetLock(tmp_path) as lock:  # free once its owner let go
        assert lock.note is None


def test_the_lock_of_a_killed_owner_is_free_because_the_kernel_dropped_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path, ready, release))
    holder.start()
    assert ready.wait(60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(60)
    assert not ResultSetLock(tmp_path).held()
    with ResultSetLock(tmp_path) as lock:
        assert f"took over the lock of pid {holder.pid}" in lock.note
        assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == socket.gethostname()


# --------------------------------------------------------------------------- merge


def _shards(tmp_path) -> list[Path]:
    dirs = []
    for k, seq_len in ((1, 64), (2, 128)):
        meta = {"suite": "io", "suite_sha256": "ab" * 32, "shard": f"{k}/2", "date": f"2026-01-0{k}"}
        dirs.append(R.write_results(tmp_path / f"s{k}", [_row(seq_len)], meta))
    return dirs


def test_a_killed_merge_leaves_no_half_made_set_and_a_second_merge_works(tmp_path, monkeypatch):
    dirs, out = _shards(tmp_path), tmp_path / "merged"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the merge dies after rows.jsonl and the table were written

    monkeypatch.setattr(R, "write_metadata", killed)
    with pytest.raises(KeyboardInterrupt):
        shard.merge_results(dirs, out)
    assert not out.exists() and not list(tmp_path.glob(".merged.merge-*"))
    monkeypatch.undo()
    merged = R.load_results(shard.merge_results(dirs, out))
    assert sorted(merged.rows["seq_len"]) == [64, 128] and merged.metadata["shards_missing"] == []


def test_a_merge_directory_left_by_a_dead_merge_is_removed_by_the_next(tmp_path):
    dirs, out = _shards(tmp_path), tmp_path / "merged"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".merged.merge-{dead.stdout.strip()}-deadbeef"
    stale.mkdir()
    (stale / R.ROWS_FILE).write_text("{}\n")
    shard.merge_results(dirs, out)
    assert not stale.exists() and len(R.load_results(out).rows) == 2


# --------------------------------------------------------------------------- orphans


def test_a_process_a_case_started_dies_with_the_case_at_its_timeout(tmp_path, monkeypatch):
    pid_file = tmp_path / "orphan.pid"
    monkeypatch.setenv("ORPHAN_PID_FILE", str(pid_file))
    result = run_suite(load_suite(_suite(tmp_path, fn="spawns_and_hangs", seq_len=(16,), timeout_s=8)),
                       out_root=tmp_path / "out", progress=False, console=Console(file=StringIO()))
    assert [r["status"] for r in result.rows] == ["timeout"]
    assert _gone(int(pid_file.read_text()))


def test_a_process_a_case_started_dies_with_a_crashed_worker(tmp_path, monkeypatch):
    pid_file = tmp_path / "orphan.pid"
    monkeypatch.setenv("ORPHAN_PID_FILE", str(pid_file))
    result = run_suite(load_suite(_suite(tmp_path, fn="spawns_and_crashes", seq_len=(16,))),
                       out_root=tmp_path / "out", progress=False, console=Console(file=StringIO()))
    assert [r["status"] for r in result.rows] == ["crash"]
    assert _gone(int(pid_file.read_text()))


def test_sigkill_of_the_run_leaves_no_process_a_case_started(tmp_path):
    pid_file = tmp_path / "orphan.pid"
    suite = _suite(tmp_path, fn="spawns_and_hangs", seq_len=(16,), timeout_s=600)
    proc = subprocess.Popen([sys.executable, "-m", "tflabench", "run", str(suite), "--out", str(tmp_path / "out"),
                             "--no-progress", "--no-plots"], cwd=tmp_path, env=_env(ORPHAN_PID_FILE=str(pid_file)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not pid_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _gone(grandchild)
    assert all(_gone(pid) for pid in workers)


# --------------------------------------------------------------------------- signals


def test_sigterm_during_report_exits_130_like_ctrl_c(small_set, tmp_path):
    ready = tmp_path / "ready"
    driver = textwrap.dedent(f'''
        import sys, time
        from pathlib import Path
        from tflabench.store import results as R
        real = R.load_results
        def slow(path):
            Path({str(ready)!r}).write_text("loading")
            time.sleep(60)
            return real(path)
        R.load_results = slow
        sys.argv = ["tflabench", "report", {str(small_set)!r}, "--no-plots"]
        from tflabench.cli import main
        main()
    ''')
    proc = subprocess.Popen([sys.executable, "-c", driver], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


# --------------------------------------------------------------------------- property: readers exit 0 or 2

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
COLUMN_NAMES = st.sampled_from(list(COLUMNS) + ["extra"])


@st.composite
def damaged_row(draw):
    row = dict(_row(draw(st.integers(1, 4096))))
    for key in draw(st.lists(COLUMN_NAMES, max_size=4)):
        if draw(st.booleans()):
            row[key] = draw(JSON_VALUES)
        else:
            row.pop(key, None)
    return row


@st.composite
def damaged_metadata(draw):
    meta = {"suite": "io", "shard": None}
    keys = st.sampled_from(list(METADATA_TYPES) + ["measurement.timing", "shards_incomplete[0]"])
    for key in draw(st.lists(keys, max_size=4)):
        value = draw(JSON_VALUES)
        if key == "measurement.timing":
            meta["measurement"] = {"timing": value if not isinstance(value, dict) else
                                   {draw(st.sampled_from(list(TIMING_FIELD_TYPES))): draw(JSON_VALUES)}}
        elif key == "shards_incomplete[0]":
            meta["shards_incomplete"] = [value]
        else:
            meta[key] = value
    return draw(st.one_of(st.just(meta), JSON_VALUES))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(rows=st.lists(damaged_row(), min_size=1, max_size=3), metadata=damaged_metadata(),
       command=st.sampled_from(["report", "compare", "merge"]))
def test_readers_of_result_sets_exit_0_or_2_never_a_traceback(tmp_path_factory, rows, metadata, command):
    base = tmp_path_factory.mktemp("prop")
    directory = base / "set"
    directory.mkdir()
    (directory / R.ROWS_FILE).write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    (directory / R.METADATA_FILE).write_text(json.dumps(metadata, allow_nan=True))
    args = {"report": ["report", str(directory), "--no-plots"],
            "compare": ["compare", str(directory), str(directory)],
            "merge": ["merge", str(directory), "--out", str(base / "merged")]}[command]
    result = cli.invoke(app, args)
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(rows=st.lists(damaged_row(), min_size=1, max_size=3), metadata=damaged_metadata())
def test_resume_of_a_damaged_set_exits_0_or_2_never_a_traceback(measured, tmp_path_factory, rows, metadata):
    suite, _ = measured
    directory = tmp_path_factory.mktemp("resume") / "set"
    directory.mkdir()
    (directory / R.ROWS_FILE).write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    (directory / R.METADATA_FILE).write_text(json.dumps(metadata, allow_nan=True))
    result = cli.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
