"""The runner: cases in worker processes; crash, hang, exception and OOM become rows while
the run goes on; resume; shard; --gpus parsing."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from tflabench.store import results as R
from tflabench.errors import UserError
from tflabench.run.suite_run import run_suite
from tflabench.run.pool import parse_gpus
from tflabench.store.suite import expand_cases, load_suite

KERNELS = textwrap.dedent('''
    import os, time, torch

    def good(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def aborts(q, k, v):
        print("about to abort", flush=True)
        os.abort()

    def hangs(q, k, v):
        time.sleep(600)

    def raises(q, k, v):
        raise RuntimeError("deliberate failure from the test kernel")

    def tells_threads(q, k, v):
        raise RuntimeError(f"threads={torch.get_num_threads()} omp={os.environ.get('OMP_NUM_THREADS')}")

    def runs_out_of_memory(q, k, v):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    def tunes_per_case(q, k, v):
        # a stand-in for a peer's autotuner whose key leaves out the sequence length: a
        # result left from another shape must be gone when a case starts
        import sys, types, triton
        mod = sys.modules.get("probe_autotuned")
        if mod is None:
            mod = types.ModuleType("probe_autotuned")
            mod.kernel = triton.autotune(configs=[triton.Config({})], key=[])(_probe)
            sys.modules["probe_autotuned"] = mod
        if any(key != tuple(q.shape) for key in mod.kernel.cache):
            raise RuntimeError("autotuning results of another shape survived into this case")
        mod.kernel.cache[tuple(q.shape)] = "config"
        return good(q, k, v)

    import triton

    @triton.jit
    def _probe(X):
        pass
''')


def _suite(tmp_path, kernels, seq_len=(32,), modes=("fwd",), timeout_s=30.0, name="runner_test"):
    kfile = tmp_path / "test_kernels.py"
    kfile.write_text(KERNELS)
    entries = []
    for label, fn, extra in kernels:
        entry = {"backend": "custom", "label": label,
                 "params": {"function": f"{kfile}:{fn}", "layout": "attention", "heads": 2}}
        entry.update(extra)
        entries.append(entry)
    data = {"name": name, "device": "cpu", "dtype": "float32", "modes": list(modes),
            "timing": {"warmup": 1, "iterations": 2, "timeout_s": timeout_s},
            "numerics": {"max_seq_len": 32}, "model": {"embedding_dim": 32},
            "sweep": {"batch": 1, "seq_len": list(seq_len)}, "kernels": entries}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_suite(path)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """One run in which kernels abort, hang, raise and run out of memory between good ones."""
    tmp_path = tmp_path_factory.mktemp("failing_run")
    loaded = _suite(tmp_path, [
        ("good first", "good", {}),
        ("aborts", "aborts", {}),
        ("hangs", "hangs", {"timeout_s": 4}),
        ("raises", "raises", {}),
        ("oom", "runs_out_of_memory", {}),
        ("good last", "good", {}),
    ])
    result = run_suite(loaded, out_root=tmp_path / "results", progress=False)
    return result, {row["kernel"]: row for row in result.rows}


def test_crashing_worker_becomes_crash_row(failing_run):
    _, rows = failing_run
    row = rows["aborts"]
    assert row["status"] == "crash"
    assert "SIGABRT" in row["reason"] and "Fatal Python error: Aborted" in row["reason"]
    assert "about to abort" in row["reason"]  # the worker's last output is kept


def test_hanging_worker_becomes_timeout_row(failing_run):
    _, rows = failing_run
    assert rows["hangs"]["status"] == "timeout"
    assert "no result within 4 s" in rows["hangs"]["reason"]


def test_raising_kernel_becomes_error_row_with_its_message(failing_run):
    _, rows = failing_run
    assert rows["raises"]["status"] == "error"
    assert rows["raises"]["reason"].startswith("RuntimeError: deliberate failure from the test kernel")


def test_out_of_memory_becomes_oom_row(failing_run):
    _, rows = failing_run
    assert rows["oom"]["status"] == "oom" and "out of memory" in rows["oom"]["reason"]


def test_run_continues_after_every_failure(failing_run):
    result, rows = failing_run
    assert [r["kernel"] for r in result.rows] == ["good first", "aborts", "hangs", "raises", "oom", "good last"]
    assert rows["good first"]["status"] == "ok" and rows["good last"]["status"] == "ok"
    assert rows["good last"]["ms_median"] > 0 and rows["good last"]["n_iter"] == 2


def test_every_row_is_on_disk_in_rows_parquet_and_metadata(failing_run):
    result, _ = failing_run
    rs = R.load_results(result.directory)
    assert len((result.directory / "rows.jsonl").read_text().splitlines()) == 6
    assert (result.directory / "results.parquet").exists()
    assert sorted(rs.rows["status"]) == sorted(["ok", "crash", "timeout", "error", "oom", "ok"])
    assert rs.metadata["suite"] == "runner_test" and rs.metadata["suite_sha256"]
    assert rs.metadata["python"] and rs.metadata["torch"]
    assert (result.directory / "logs" / "worker-0.log").exists()
    # the model columns of an ok row (attention_causal counts from tflabench.model)
    good = rs.rows[rs.rows["kernel"] == "good last"].iloc[0]
    assert good["flops"] > 0 and good["tflops_per_s"] > 0


def test_workers_are_reused_until_a_crash_or_timeout(failing_run):
    result, _ = failing_run
    log = (result.directory / "logs" / "worker-0.log").read_text()
    pid_of = {}
    for line in log.splitlines():
        if line.startswith("--- case "):
            label = line[len("--- case "):].split(" fwd ")[0]
            pid_of[label] = line.split(" pid=")[1].split()[0]
    assert pid_of["aborts"] == pid_of["good first"]  # reused: a healthy worker runs the next case
    assert pid_of["hangs"] not in (pid_of["good first"], pid_of["raises"])  # replaced after the crash
    # replaced after the timeout; on the CPU an exception does not retire the worker
    assert pid_of["raises"] == pid_of["oom"] == pid_of["good last"]


def test_one_worker_per_gpu_slot_gives_the_same_rows(tmp_path):
    loaded = _suite(tmp_path, [("good", "good", {})], seq_len=(8, 16, 32, 64), name="slots_test")
    result = run_suite(loaded, out_root=tmp_path / "results", gpus=["0", "1"], progress=False)
    assert sorted(r["case_id"] for r in result.rows) == sorted(c.case_id for c in expand_cases(loaded))
    assert {r["status"] for r in result.rows} == {"ok"}
    for slot in (0, 1):
        assert "--- case" in (result.directory / "logs" / f"worker-{slot}.log").read_text()


def test_resume_skips_cases_already_measured(tmp_path):
    loaded = _suite(tmp_path, [("good", "good", {})], seq_len=(16, 32), name="resume_test")
    first = run_suite(loaded, out_root=tmp_path / "results", progress=False)
    assert len(first.rows) == 2
    rows_file = first.directory / "rows.jsonl"
    kept = rows_file.read_text().splitlines()[:1]  # as if the run had been killed after one case
    rows_file.write_text("\n".join(kept) + "\n")
    second = run_suite(loaded, resume=first.directory, progress=False)
    assert second.directory == first.directory and second.skipped == 1
    assert [r["seq_len"] for r in second.rows] == [32]
    assert sorted(R.load_results(first.directory).rows["seq_len"]) == [16, 32]


def test_resume_without_only_finishes_the_runs_selection(tmp_path, capsys):
    """A run given --only, interrupted, then resumed without --only, measures what is left of
    that selection (the metadata's ``only``), not the rest of the suite; an explicit --only
    on the resume chooses again."""
    loaded = _suite(tmp_path, [("chosen", "good", {}), ("other", "good", {})], seq_len=(16, 32),
                    name="resume_only_test")
    first = run_suite(loaded, out_root=tmp_path / "results", only=["chosen"], progress=False)
    assert {r["kernel"] for r in first.rows} == {"chosen"} and len(first.rows) == 2
    rows_file = first.directory / "rows.jsonl"
    rows_file.write_text(rows_file.read_text().splitlines()[0] + "\n")   # killed after one case
    second = run_suite(loaded, resume=first.directory, progress=False)
    assert [r["kernel"] for r in second.rows] == ["chosen"] and second.skipped == 1
    assert "--resume keeps the run's --only chosen" in capsys.readouterr().err
    meta = json.loads((first.directory / "metadata.json").read_text())
    assert meta["only"] == ["chosen"]
    third = run_suite(loaded, resume=first.directory, only=["other"], progress=False)
    assert {r["kernel"] for r in third.rows} == {"other"} and len(third.rows) == 2


def test_resume_refuses_a_result_set_of_another_suite(tmp_path):
    loaded = _suite(tmp_path, [("good", "good", {})], name="one")
    R.write_results(tmp_path / "other", [], {"suite": "another"})
    with pytest.raises(UserError, match="holds suite 'another'"):
        run_suite(loaded, resume=tmp_path / "other", progress=False)


def test_shard_runs_its_share_and_records_it(tmp_path):
    loaded = _suite(tmp_path, [("good", "good", {})], seq_len=(8, 16, 32, 64), name="shard_test")
    from tflabench.run.suite_run import case_cost
    from tflabench.store.shard import select_shard

    expected = {c.case_id for c in select_shard(expand_cases(loaded), 2, 2, case_cost)}
    result = run_suite(loaded, out_root=tmp_path / "results", shard="2/2", progress=False)
    assert {r["case_id"] for r in result.rows} == expected and 0 < len(expected) < 4
    meta = json.loads((result.directory / "metadata.json").read_text())
    assert meta["shard"] == "2/2"


def test_each_case_tunes_at_its_own_shape(tmp_path):
    """The worker forgets autotuning results between cases (triton_cache: autotuning scope):
    the probe kernel raises when it finds a result of another shape."""
    loaded = _suite(tmp_path, [("tunes", "tunes_per_case", {})], seq_len=(16, 32))
    result = run_suite(loaded, out_root=tmp_path / "results", progress=False)
    assert [r["status"] for r in result.rows] == ["ok", "ok"], [r["reason"] for r in result.rows]


def test_gpus_option_is_parsed_or_refused(monkeypatch):
    from tflabench.run import pool as worker_pool
    from tflabench.environment import GpuDevice, GpuInfo

    four = GpuInfo([GpuDevice(str(i), "NVIDIA H200") for i in range(4)], "580", "nvidia-smi")
    monkeypatch.setattr(worker_pool, "gpu_info", lambda: four)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert parse_gpus(None) is None
    assert parse_gpus("0,1") == ["0", "1"]
    assert parse_gpus(" 3 ") == ["3"]
    assert parse_gpus("all") == ["0", "1", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert parse_gpus("all") == ["2", "3"]  # the GPUs this process may use
    for bad in ("0,0", "a,b", "1;2", "-1", "4", "1,7"):
        with pytest.raises(UserError, match="--gpus"):
            parse_gpus(bad)
    with pytest.raises(UserError, match="GPU 4 does not exist here; 4 visible"):
        parse_gpus("0,4")
    # a machine without a GPU: asking for GPUs is refused, not recorded as if it ran there
    monkeypatch.setattr(worker_pool, "gpu_info", lambda: GpuInfo([], None))
    for text in ("0,1", "all"):
        with pytest.raises(UserError, match="no GPU is visible here"):
            parse_gpus(text)


def test_kernel_refusing_its_environment_becomes_unavailable_not_error(tmp_path):
    """A backend's classify_error (here fla's #640 backward refusal) turns the raised
    RuntimeError into an `unavailable` reason; any other exception stays an error."""
    from tflabench.run.pool import _refusal_reason

    data = {"name": "refusal", "device": "cpu", "dtype": "bfloat16", "modes": ["fwdbw"],
            "sweep": {"batch": 1, "seq_len": [64]},
            "kernels": [{"backend": "fla", "params": {"op": "chunk_simple_gla"}}]}
    path = tmp_path / "refusal.yaml"
    path.write_text(yaml.safe_dump(data))
    (case,) = expand_cases(load_suite(path))
    refusal = RuntimeError("Triton 3.4-3.7.0 on Hopper breaks this backward; see fla issue #640")
    reason = _refusal_reason(case, refusal)
    assert reason is not None and "#640" in reason
    assert _refusal_reason(case, RuntimeError("an ordinary bug")) is None


def test_cpu_threads_share_the_cores_and_the_user_setting_wins():
    from tflabench.run.pool import cpu_threads, usable_cores

    cores = usable_cores()
    one = cpu_threads(1, environ={})
    assert one["per_worker"] == max(1, cores - 1) and one["cores"] == cores
    assert cpu_threads(4, environ={})["per_worker"] == max(1, (cores - 1) // 4)
    mine = cpu_threads(1, environ={"OMP_NUM_THREADS": "3"})
    assert mine["per_worker"] == 3 and mine["set_by"] == "OMP_NUM_THREADS"


def test_workers_use_the_thread_count_recorded_in_the_metadata(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = run_suite(_suite(tmp_path, [("threads", "tells_threads", {})], name="threads"),
                       out_root=tmp_path / "out", progress=False)
    rs = R.load_results(result.directory)
    threads = rs.metadata["cpu_threads"]
    assert rs.metadata["cpu_allocator"]["library"]
    (row,) = rs.rows.to_dict("records")
    assert f"threads={threads['per_worker']} omp={threads['per_worker']}" in row["reason"]


def test_a_single_threaded_cpu_worker_is_timed_by_its_cpu_time():
    from tflabench.run.measure import cpu_timer

    assert cpu_timer(1) == "process_time" and cpu_timer(4) == "perf_counter"


def test_suite_compare_thresholds_reach_the_result_metadata(tmp_path):
    loaded = _suite(tmp_path, [("good", "good", {})], name="with_thresholds")
    data = yaml.safe_load(loaded.path.read_text())
    data["compare"] = {"time_threshold": 0.07, "alpha": 0.05}
    loaded.path.write_text(yaml.safe_dump(data))
    result = run_suite(load_suite(loaded.path), out_root=tmp_path / "out", progress=False)
    meta = R.load_results(result.directory).metadata
    assert meta["compare"] == {"time_threshold": 0.07, "alpha": 0.05}


def test_only_keeps_the_matching_kernels_and_refuses_a_pattern_matching_none(tmp_path):
    from tflabench.run.suite_run import select_kernels

    loaded = _suite(tmp_path, [("good one", "good", {}), ("raiser", "raises", {})], seq_len=(16, 32))
    cases = expand_cases(loaded)
    kept = select_kernels(cases, ["GOOD*"])
    assert {c.kernel for c in kept} == {"good one"} and len(kept) == 2
    assert select_kernels(cases, None) == cases
    with pytest.raises(UserError, match="matches no kernel"):
        select_kernels(cases, ["nothing-like-this"])


def test_kernel_that_keeps_crashing_has_its_remaining_cases_recorded_not_run(tmp_path):
    loaded = _suite(tmp_path, [("aborts", "aborts", {}), ("good", "good", {})], seq_len=(16, 32, 48))
    result = run_suite(loaded, out_root=tmp_path / "results", progress=False,
                       max_kernel_failures=1)
    aborts = sorted((r for r in result.rows if r["kernel"] == "aborts"), key=lambda r: r["seq_len"])
    assert [r["status"] for r in aborts] == ["crash", "not_run", "not_run"]
    assert "not run" not in aborts[0]["reason"]
    assert all("not run: this kernel's last 1 cases ended in crash" in r["reason"] for r in aborts[1:])
    assert all(r["ms_median"] is None or r["ms_median"] != r["ms_median"] for r in aborts[1:])
    assert [r["status"] for r in result.rows if r["kernel"] == "good"] == ["ok", "ok", "ok"]
    # the cases not run are not lost: a resume runs exactly them
    again = run_suite(loaded, resume=result.directory, progress=False, max_kernel_failures=0)
    assert sorted(r["seq_len"] for r in again.rows) == [32, 48] and again.skipped == 4
    assert [r["status"] for r in again.rows] == ["crash", "crash"]
    rows = R.load_results(result.directory).rows
    assert sorted(rows.loc[rows["kernel"] == "aborts", "status"]) == ["crash", "crash", "crash"]


def test_a_worker_log_closed_twice_or_underneath_raises_nothing(tmp_path):
    # An interrupted run kills every worker while their slot threads close them too: the
    # second close of the log pipe must not turn Ctrl-C / SIGTERM into a traceback.
    import multiprocessing
    import os
    import threading

    from tflabench.run.pool import _LogPump

    reader, writer = multiprocessing.Pipe(duplex=False)
    pump = _LogPump(reader, tmp_path / "worker.log")
    os.write(writer.fileno(), b"hello\n")
    writer.close()
    pump._thread.join(10)              # the pump has copied "hello" and seen the end of the pipe
    os.close(reader.fileno())          # closed underneath, as by the other closer
    errors = []

    def close():
        try:
            pump.close()
        except Exception as exc:  # noqa: BLE001 - the test collects what a closer raised
            errors.append(exc)

    closers = [threading.Thread(target=close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    close()
    assert errors == []
    assert (tmp_path / "worker.log").read_bytes().startswith(b"hello")


def test_cpu_workers_keep_freed_buffers_in_the_heap(tmp_path):
    # With glibc's defaults a 4 MiB buffer gets its own mmap (and page faults on every
    # call that allocates it again); a CPU worker's allocator keeps it in the heap.
    import platform
    import subprocess
    import sys

    from tflabench.run.pool import CPU_MALLOC_SETTINGS, cpu_allocator

    if platform.libc_ver()[0] != "glibc":
        assert cpu_allocator()["mallopt"] is None
        return
    assert cpu_allocator() == {"library": "glibc", "mallopt": CPU_MALLOC_SETTINGS}
    probe = textwrap.dedent("""
        import ctypes, sys
        from tflabench.run.pool import steady_allocator
        libc = ctypes.CDLL(None)
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in
                        ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                         "uordblks", "fordblks", "keepcost")]
        libc.mallinfo2.restype = Info
        libc.malloc.restype = ctypes.c_void_p
        if sys.argv[1] == "steady":
            assert steady_allocator()
        before = libc.mallinfo2().hblkhd
        p = libc.malloc(4 << 20)
        print(libc.mallinfo2().hblkhd - before)
        libc.free(ctypes.c_void_p(p))
    """)
    mapped = {mode: int(subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "steady")}
    assert mapped["default"] >= 4 << 20 and mapped["steady"] == 0
