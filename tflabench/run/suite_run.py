"""``tflabench run``: a suite end to end, from its cases to a complete result set.

Expands the suite (:func:`tflabench.store.suite.expand_cases`), keeps ``--only`` kernels and a
``--shard``, skips what a ``--resume`` already measured (:mod:`tflabench.store.resume`), writes
the metadata, runs the cases in the worker pool (:func:`tflabench.run.pool.run_cases`,
rows appended as they complete) under a progress bar, and writes the table. Figures and
the summary table are drawn by the caller from the result set (:mod:`tflabench.report.plots`,
:mod:`tflabench.report.tables`): nothing here renders.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import fnmatch
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text

from tflabench import environment, hardware
from tflabench.store import resume as resume_mod
from tflabench.store import results as R
from tflabench.store.lock import ResultSetLock
from tflabench.backends import get_backend
from tflabench.backends.base import Shape
from tflabench.errors import UserError
from tflabench.store.shard import format_shard, parse_shard, select_shard
from tflabench.store.suite import Case, LoadedSuite, expand_cases, require_device, resolve_device
from tflabench.run.pool import RunInterrupted, cpu_allocator, cpu_threads, run_cases


@dataclasses.dataclass
class RunResult:
    """What a run produced: the result-set directory, the rows written by this run (in
    completion order), cases skipped by ``--resume``, wall seconds."""

    directory: Path
    rows: list[dict]
    skipped: int
    wall_s: float

    def status_counts(self) -> dict[str, int]:
        return dict(collections.Counter(r["status"] for r in self.rows))


def case_cost(case: Case) -> float:
    """Predicted cost of a case for shard balancing: the model's FLOPs / 1e12 + bytes / 1e9
    where the backend has counts, else tokens x heads x d_qk x d_hv x (3 for fwdbw)."""
    try:
        backend = get_backend(case.backend)
        counts = backend.family.model_counts(case.params, Shape(case.batch, case.seq_len, case.heads,
                                                    case.d_qk, case.d_hv, case.dtype), case.mode)
        if counts is not None:
            return counts[0] / 1e12 + counts[1] / 1e9
    except Exception:  # cost is a balancing hint only
        pass
    return case.batch * case.seq_len * case.heads * case.d_qk * case.d_hv * (3 if case.mode == "fwdbw" else 1) / 1e12


def _ceilings(gpu_name: str | None, ceilings: str) -> dict | None:
    """{name, flops_per_s, bytes_per_s, source} for the GPU, or None (CPU / not catalogued)."""
    if not gpu_name:
        return None
    try:
        key = hardware.detect_gpu(gpu_name)
        if key is None:
            return None
        gpu = hardware.get_gpu(key, ceilings=ceilings)
        return {"name": gpu.name, "flops_per_s": gpu.flops_per_s, "bytes_per_s": gpu.bytes_per_s,
                "source": getattr(gpu, "ceilings_source", ceilings)}
    except UserError:
        if ceilings == "measured":
            raise
        return None
    except ImportError:  # pragma: no cover
        return None


def _say(console, kind: str, text: str) -> None:
    """One ``warning:`` / ``note:`` line on the run's console (``text`` printed as is)."""
    console.print(Text.assemble((f"{kind}: ", "yellow"), text), soft_wrap=True)


def select_kernels(cases: list[Case], patterns: list[str] | None) -> list[Case]:
    """The cases whose kernel label or backend matches one of the glob ``patterns``
    (case-insensitive); all cases when ``patterns`` is empty or None.

    Raises UserError naming a pattern that matches no kernel, with the suite's labels."""
    if not patterns:
        return cases
    kept = []
    for pattern in patterns:
        hits = [c for c in cases if fnmatch.fnmatch(c.kernel.lower(), pattern.lower())
                or fnmatch.fnmatch(c.backend.lower(), pattern.lower())]
        if not hits:
            labels = ", ".join(sorted({c.kernel for c in cases}))
            raise UserError(f"--only {pattern!r} matches no kernel of the suite; labels: {labels}")
        kept.extend(c for c in hits if c not in kept)
    return [c for c in cases if c in kept]


def run_suite(
    loaded: LoadedSuite,
    *,
    out_root: str | Path = "results",
    resume: str | Path | None = None,
    gpus: list[str] | None = None,
    shard: str | None = None,
    only: list[str] | None = None,
    max_kernel_failures: int = 2,
    ceilings: str = "datasheet",
    device: str | None = None,
    console=None,
    progress: bool = True,
    triton_cache: str | Path | None = None,
    profile: bool = False,
    gpu_trace: bool = False,
) -> RunResult:
    """Run a validated suite end to end: expand, (shard), skip measured cases when
    resuming, run every case in workers with a progress bar, write the result set
    (rows.jsonl as it goes, then results.parquet, metadata.json). The figures are the
    caller's (:func:`tflabench.report.plots.benchmark.write_plots` on the result set).

    Args:
        out_root: root of new result sets (``<out_root>/<suite>/<timestamp>/``).
        resume: an existing result-set directory to finish (its measured cases are skipped).
        gpus: from :func:`parse_gpus`.
        shard: ``"K/N"`` (``tflabench.store.shard``).
        only: glob patterns (case-insensitive); keep only the kernels whose suite label or
            backend name matches one of them (e.g. ``["*mLSTMsig*", "mamba2"]``).
        max_kernel_failures: see :func:`run_cases`.
        ceilings: ``datasheet`` or ``measured`` (roofline columns).
        device: override the suite's device (``cpu`` / ``cuda``).
        console: rich Console for the progress bar (default: stderr).
        triton_cache: ``--triton-cache DIR`` (:func:`tflabench.run.triton_cache.configure`), set up
            once every check has passed.
        profile: after each case's timings, profile its kernels (the ``kernel_profile``
            column: :mod:`tflabench.run.kernel_profile`).
        gpu_trace: sample each case's GPU clock, power and slowdown reasons over its timings
            (the GPU trace columns: :mod:`tflabench.run.gpu_trace`).

    The result set is locked while the run writes it (:class:`~tflabench.store.lock.ResultSetLock`).
    A resume checks that the suite describes the same measurement
    (:func:`tflabench.store.resume.plan_resume`), sets a torn last line of ``rows.jsonl`` aside
    (:func:`~tflabench.store.results.repair_rows`) and lists the cases added to or removed from
    the suite since the set began.

    Raises UserError for a CUDA suite without a GPU, a bad shard, a resume directory that
    is not a result set of this suite or was measured under other conditions, a result set
    another run is writing; :class:`~tflabench.store.files.ResultWriteError` (a UserError) when
    the result set cannot be written; every refusal comes before anything on disk changes.
    A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one) becomes
    :class:`~tflabench.run.pool.RunInterrupted`, saying where the run stood; a result set
    this run created and had not yet written to is removed.
    """
    state = {"directory": None, "written": False, "created": False}
    try:
        return _run_suite(loaded, state, out_root=out_root, resume=resume, gpus=gpus, shard=shard, only=only,
                          max_kernel_failures=max_kernel_failures, ceilings=ceilings, device=device,
                          console=console, progress=progress, triton_cache=triton_cache, profile=profile,
                          gpu_trace=gpu_trace)
    except KeyboardInterrupt:
        directory = state["directory"]
        if directory is not None and state["created"]:  # stopped inside write_metadata: the file decides
            state["written"] = state["written"] or (directory / R.METADATA_FILE).exists()
        if directory is not None and state["created"] and not state["written"]:
            try:  # created for this run, nothing written yet: leave no empty set behind
                directory.rmdir()
                directory = None
            except OSError:
                pass
        rows = len(R.measured_case_ids(directory)) if directory is not None and state["written"] else 0
        raise RunInterrupted(directory, written=state["written"], rows=rows, resume=resume is not None) from None


def _run_suite(loaded: LoadedSuite, state: dict, *, out_root, resume, gpus, shard, only, max_kernel_failures,
               ceilings, device, console, progress, triton_cache, profile=False, gpu_trace=False) -> RunResult:
    """:func:`run_suite` itself; ``state`` records the result set and whether it was written."""
    suite = loaded.suite
    dev = device or resolve_device(suite.device)
    require_device(suite.name, dev)
    if suite.timing.cuda_graph and dev != "cuda":
        raise UserError(f"suite {suite.name!r}: timing.cuda_graph replays CUDA graphs, but this run is on "
                        f"the {dev.upper()}; set timing.cuda_graph: false to time it there, or run on a GPU")
    all_cases = expand_cases(loaded, device=dev)
    only_kept = False
    if resume is not None and not only:
        only = resume_mod.stored_only(resume)      # finish the selection the run was given
        only_kept = bool(only)
    cases = select_kernels(all_cases, only)
    shard_text = None
    if shard:
        k, n = parse_shard(shard)
        cases = select_shard(cases, k, n, case_cost)
        shard_text = format_shard(k, n)
    if profile or gpu_trace:
        cases = [dataclasses.replace(c, profile=profile, gpu_trace=gpu_trace) for c in cases]

    env = environment.collect()
    ceil = _ceilings(env.get("gpu_name") if dev == "cuda" else None, ceilings)
    conditions = resume_mod.measurement(loaded, dev, all_cases)
    console = console or Console(stderr=True)
    if only_kept:
        _say(console, "note", f"--resume keeps the run's --only {','.join(only)} "
             "(pass --only to choose others)")
    if resume is not None:
        directory = Path(resume)
        if not (directory / R.ROWS_FILE).exists() and not (directory / R.METADATA_FILE).exists():
            raise UserError(f"--resume {str(directory)!r}: not a result set (no {R.ROWS_FILE})")
    else:
        directory = R.new_result_directory(out_root, suite.name)
        state["created"] = True
    state["directory"] = directory
    lock = ResultSetLock(directory).acquire()
    try:
        return _run_locked(loaded, directory, lock, console, state, resume=resume is not None,
                           conditions=conditions, env=env, ceil=ceil, all_cases=all_cases, cases=cases, dev=dev,
                           gpus=gpus, shard_text=shard_text, only=only, max_kernel_failures=max_kernel_failures,
                           progress=progress, triton_cache=triton_cache)
    except UserError:
        if state["created"] and not state["written"]:
            lock.release()
            try:  # refused before writing anything: the new directory goes again
                directory.rmdir()
            except OSError:
                pass
        raise
    finally:
        lock.release()


def _run_locked(loaded: LoadedSuite, directory: Path, lock, console, state: dict, *, resume: bool,
                conditions: dict, env: dict, ceil: dict | None, all_cases: list[Case], cases: list[Case],
                dev: str, gpus: list[str] | None, shard_text: str | None, only: list[str] | None,
                max_kernel_failures: int, progress: bool, triton_cache: str | Path | None) -> RunResult:
    """:func:`run_suite` once the result set is locked: check a resume, set torn lines
    aside, write the metadata, run, write the table."""
    suite = loaded.suite
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    if lock.note:
        _say(console, "note", lock.note)
    resumed: list[dict] = []
    threads = cpu_threads(len(gpus or [None]))  # part of the timing method a resume checks
    if resume:
        # every check first: a refused resume leaves the set as it was
        try:
            old_meta = R.read_metadata(directory)
        except UserError as exc:
            raise UserError(f"--resume: {exc}; start a fresh run (the same command without --resume)") from None
        plan = resume_mod.plan_resume(directory, loaded, old_meta, conditions, env, all_cases,
                                      shard=shard_text, ceilings=ceil, cpu_threads=threads)
        R.remove_stale_temporaries(directory)
        for line in R.repair_rows(directory):
            _say(console, "warning", line)
        for line in plan.report_lines():
            console.print(line, markup=False, soft_wrap=True)
        done = plan.done
        date = old_meta.get("date") or now
        resumed = list(old_meta.get("resumed") or []) + [{
            "date": now, "git_revision": env.get("git_revision"), "hostname": env.get("hostname"),
            "suite_sha256": loaded.sha256, "cases_added": len(plan.added), "cases_removed": len(plan.removed)}]
    else:
        R.remove_stale_temporaries(directory)
        done = set()
        date = now
    todo = [c for c in cases if c.case_id not in done]
    skipped = len(cases) - len(todo)
    metadata = {
        "suite": suite.name, "suite_path": str(loaded.path), "suite_sha256": loaded.sha256,
        "date": date, **env, "shard": shard_text, "ceilings": ceil,
        "device": dev, "gpus": gpus, "cpu_threads": threads,
        "gpus_used": environment.gpus_used(gpus) if dev == "cuda" else [],
        "profile": any(c.profile for c in cases),
        "gpu_trace": any(c.gpu_trace for c in cases),
        "cpu_allocator": cpu_allocator() if dev == "cpu" else None,
        "compare": suite.compare.model_dump(exclude_none=True),
        "only": list(only) if only else None,
        "measurement": conditions,
        "case_ids": sorted({c.case_id for c in cases}),  # what this run is to measure (merge checks it)
    }
    if resumed:
        metadata["resumed"] = resumed
    if triton_cache is not None:  # the last check (the cache directory must be creatable)
        from tflabench.run import triton_cache as tc

        cache_dir = tc.configure(triton_cache)
        console.print(f"triton cache: {cache_dir} ({len(tc.autotune_entries(cache_dir))} autotune results)",
                      markup=False)
    R.write_metadata(directory, metadata)
    state["written"] = True

    console.print(f"writing to {directory} ({len(todo)} cases to run"
                  + (f", {skipped} already measured" if skipped else "") + ")", markup=False)
    t0 = time.perf_counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}", justify="left", markup=False), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    rows: list[dict] = []
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(f"{suite.name}", total=len(todo))

        def on_start(slot: int, case: Case) -> None:
            bar.update(task, description=f"[{slot}] {case.describe()}")

        def on_done(row: dict) -> None:
            bar.advance(task)

        try:
            rows = run_cases(todo, directory, gpus=gpus, ceilings=ceil, on_start=on_start, on_done=on_done,
                             max_kernel_failures=max_kernel_failures, threads=threads["per_worker"])
        finally:
            if (directory / R.ROWS_FILE).exists():
                try:
                    R.finalize(directory)
                except UserError as exc:  # e.g. a full disk: rows.jsonl still holds every row
                    _say(console, "warning", f"{exc} (rows.jsonl holds every row; report, compare and "
                         "merge read it)")
        bar.update(task, description=f"{suite.name}: done")
    wall = time.perf_counter() - t0
    return RunResult(directory=directory, rows=rows, skipped=skipped, wall_s=wall)


__all__ = ["run_suite", "select_kernels", "case_cost", "RunResult"]
