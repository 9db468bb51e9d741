"""Running a suite's cases in worker processes, so that no case can end the run.

Each case runs in a worker process (``multiprocessing`` spawn) that
:func:`tflabench.measure.measure_case` runs in. The parent waits for the result with the
case's timeout:

- the worker dies (segfault, ``abort()``, an LLVM assertion) -> row ``crash`` with the
  signal and the last lines of the worker's output;
- no result within ``timeout_s`` -> the worker is killed, row ``timeout``;
- the kernel raises an out-of-memory error -> ``oom``; any other exception -> ``error``
  with the last lines of the traceback;
- the backend or mode cannot run here -> ``unavailable``; numerics gate fails -> ``wrong``.

Workers are reused for consecutive cases of the same backend while they stay healthy; a
worker is replaced after a crash or timeout (on a GPU also after an exception or OOM, which
can leave the CUDA context unusable), and when the backend changes (peers' global state
stays with their own worker). Before each case a worker forgets every Triton autotuner's
results, so that each case tunes at its own shape (``triton_cache``: autotuning scope;
``run --triton-cache`` keeps them). With ``gpus=[0, 1]`` one worker per GPU
runs, pinned with ``CUDA_VISIBLE_DEVICES``; the rows are the same in form.

Each worker's stdout and stderr go to ``<result dir>/logs/worker-<slot>.log``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from tflabench import results as R
from tflabench.errors import UserError
from tflabench.suite import Case, LoadedSuite, expand_cases, require_device, resolve_device

#: Seconds a fresh worker may take to start (import torch, initialise) before it counts
#: as crashed.
WORKER_START_TIMEOUT_S = 180.0
#: Lines of a worker's output or traceback kept in a row's ``reason``.
REASON_LINES = 8
#: Statuses after which the worker process is replaced: always after a crash or timeout
#: (the process is gone or killed); on a GPU also after an exception or OOM, since a CUDA
#: error can leave the context unusable for every later case in that process.
RESTART_AFTER = {"crash", "timeout"}
RESTART_AFTER_ON_GPU = {"oom", "error"}


# --------------------------------------------------------------------------- worker side


def _watch_parent(parent_pid: int) -> None:
    """Exit the worker when its parent is gone (never leave an orphan on a GPU)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(3)


def _worker_main(conn, log_path: str, gpu: str | None, parent_pid: int, device: str) -> None:
    """Worker loop: receive case dicts, send back outcome dicts, until None or EOF.

    ``gpu`` pins the worker (``CUDA_VISIBLE_DEVICES``); on the CPU, Triton kernels run in
    Triton's interpreter (``TRITON_INTERPRET=1``, set before anything imports triton).
    """
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from tflabench import triton_cache

    scope = triton_cache.prepare_worker(os.environ)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=False)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        import torch  # noqa: F401  (the start-up cost is paid before the first case)

        from tflabench import measure
    except BaseException as exc:  # pragma: no cover - broken installs
        conn.send({"ready": False, "error": "".join(traceback.format_exception_only(type(exc), exc))})
        return
    conn.send({"ready": True, "pid": os.getpid()})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        case = Case(**msg)
        print(f"--- case {case.describe()} pid={os.getpid()} params={case.params}", flush=True)
        if scope == "case":     # tune at this case's shape (triton_cache: autotuning scope)
            triton_cache.forget_autotuning()
        try:
            outcome = measure.measure_case(case)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a row
            status = "oom" if measure.is_oom(exc) else "error"
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            print("".join(tb), file=sys.stderr, flush=True)
            refusal = _refusal_reason(case, exc)
            if refusal is not None:
                outcome = {"status": "unavailable", "reason": refusal}
            else:
                outcome = {"status": status, "reason": _exception_reason(exc)}
        finally:
            _free_device_memory()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send(outcome)
        except (TypeError, ValueError) as exc:  # unpicklable outcome
            conn.send({"status": "error", "reason": f"worker could not return the result ({exc})"})


def _free_device_memory() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


def _tail_text(text: str, lines: int = REASON_LINES, max_chars: int = 1500) -> str:
    """The informative end of a worker's output, on one line (`` | `` between lines).

    For a fatal error (faulthandler's ``Fatal Python error: ...``, printed after e.g. an
    LLVM assertion message) the lines just before it and its innermost frames; else the
    last ``lines`` lines. Our own ``--- case`` markers are dropped."""
    kept = [ln.rstrip() for ln in text.strip().splitlines()
            if ln.strip() and not ln.startswith("--- case ")]
    fatal = [n for n, ln in enumerate(kept) if ln.startswith("Fatal Python error")]
    if fatal:
        n = fatal[-1]
        frames = [ln for ln in kept[n + 1:] if ln.lstrip().startswith("File ")][:3]
        picked = kept[max(0, n - 4):n + 1] + frames
    else:
        picked = kept[-lines:]
    return " | ".join(ln.strip() for ln in picked)[-max_chars:]


def _refusal_reason(case: Case, exc: BaseException) -> str | None:
    """The backend's reason when ``exc`` is an environment refusal (``classify_error``)."""
    try:
        from tflabench.backends import get_backend

        backend = get_backend(case.backend)
        return backend.classify_error(backend.parse_params(json.loads(case.params)), case.mode, exc)
    except Exception:  # classification must never hide the original error
        return None


def _exception_reason(exc: BaseException) -> str:
    """``Type: message`` first, then the innermost frames (file:line in function)."""
    import traceback as tb

    head = "".join(tb.format_exception_only(type(exc), exc)).strip().splitlines()
    frames = tb.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = " | ".join(ln.strip() for ln in head if ln.strip())
    return (text + (f" (at {where})" if where else ""))[:1500]


# --------------------------------------------------------------------------- parent side


class _Worker:
    """One worker process and its pipe (parent side)."""

    def __init__(self, ctx, slot: int, gpu: str | None, log_path: Path, device: str = "cuda"):
        self.slot, self.gpu, self.log_path = slot, gpu, log_path
        self.backend: str | None = None
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.conn = parent_conn
        self.process = ctx.Process(
            target=_worker_main, args=(child_conn, str(log_path), gpu, os.getpid(), device),
            name=f"tflabench-worker-{slot}", daemon=True)
        self._log_offset = self._log_size()
        self.process.start()
        child_conn.close()
        self.start_error: str | None = None
        if self.conn.poll(WORKER_START_TIMEOUT_S):
            try:
                hello = self.conn.recv()
                if not hello.get("ready"):
                    self.start_error = f"worker failed to start: {hello.get('error')}"
            except (EOFError, OSError):
                self.start_error = self._death_reason("worker died while starting")
        else:
            self.start_error = f"worker did not start within {WORKER_START_TIMEOUT_S:.0f} s"

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return _tail_text(text)

    def _death_reason(self, what: str) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            how = f"killed by {sig}"
        else:
            how = f"exit status {code}"
        tail = self._log_tail()
        return f"{what} ({how})" + (f": {tail}" if tail else "")

    def run(self, case: Case) -> dict:
        """Send one case; wait at most its timeout. Returns the outcome dict."""
        self._log_offset = self._log_size()
        try:
            self.conn.send(case.to_dict())
        except (BrokenPipeError, OSError):
            return {"status": "crash", "reason": self._death_reason("worker was gone before the case")}
        if self.conn.poll(case.timeout_s):
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                return {"status": "crash", "reason": self._death_reason("worker died")}
        self.kill()
        tail = self._log_tail()
        return {"status": "timeout",
                "reason": f"no result within {case.timeout_s:g} s; worker killed" + (f": {tail}" if tail else "")}

    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within 5 s."""
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(5)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        try:
            self.conn.close()
        except OSError:  # pragma: no cover
            pass


@dataclasses.dataclass
class RunResult:
    """What a run produced: the result-set directory, the rows written by this run (in
    completion order), cases skipped by ``--resume``, wall seconds."""

    directory: Path
    rows: list[dict]
    skipped: int
    wall_s: float
    plots: list[Path] = dataclasses.field(default_factory=list)

    def status_counts(self) -> dict[str, int]:
        return dict(collections.Counter(r["status"] for r in self.rows))


def parse_gpus(text: str | None) -> list[str] | None:
    """``--gpus``: None (one worker, default device), ``all`` (every visible GPU) or a comma
    list of GPU indices (``0,1``). Returns the list of ``CUDA_VISIBLE_DEVICES`` values.
    Raises UserError for anything else or ``all`` without GPUs."""
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    if text == "all":
        from tflabench.environment import gpu_info

        n = len(gpu_info().names)
        if n == 0:
            raise UserError("--gpus=all: no GPU visible (nvidia-smi / torch see none)")
        return [str(i) for i in range(n)]
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise UserError(f"--gpus={text!r}: give 'all' or distinct GPU indices separated by commas (e.g. 0,1)")
    return parts


def case_cost(case: Case) -> float:
    """Predicted cost of a case for shard balancing: the model's FLOPs / 1e12 + bytes / 1e9
    where the backend has counts, else tokens x heads x d_qk x d_hv x (3 for fwdbw)."""
    try:
        from tflabench.backends import get_backend
        from tflabench.backends.base import Shape

        backend = get_backend(case.backend)
        params = backend.parse_params(json.loads(case.params))
        counts = backend.model_counts(params, Shape(case.batch, case.seq_len, case.heads,
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
        from tflabench import hardware

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
    from rich.text import Text

    console.print(Text.assemble((f"{kind}: ", "yellow"), text), soft_wrap=True)


def _base_row(case: Case) -> dict:
    return R.new_row(**case.identity())


def run_cases(
    cases: list[Case],
    directory: Path,
    *,
    gpus: list[str] | None = None,
    ceilings: dict | None = None,
    on_start: Callable[[int, Case], None] | None = None,
    on_done: Callable[[dict], None] | None = None,
    max_kernel_failures: int = 2,
) -> list[dict]:
    """Run ``cases`` in worker processes, appending each row to ``directory/rows.jsonl`` as
    it completes; returns the rows in completion order.

    Args:
        gpus: one worker slot per entry (its ``CUDA_VISIBLE_DEVICES``); None: one slot.
        max_kernel_failures: after this many consecutive ``crash`` / ``timeout`` rows of one
            kernel (same backend, label and params), its remaining cases are not run: each
            becomes a row with the same status and a reason saying so (a peer that aborts
            while compiling, or autotunes past the timeout, would otherwise cost a worker
            start or a whole timeout per case). 0 runs every case.
        ceilings: ``{"flops_per_s", "bytes_per_s"}`` for the roofline columns (or None).
        on_start(slot, case) / on_done(row): progress callbacks (called from slot threads).

    KeyboardInterrupt stops the slots, kills the workers and propagates. A row that cannot
    be written (a full disk) stops the run the same way and raises
    :class:`~tflabench.results.ResultWriteError`; the rows written before it stay.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    writer = R.RowWriter(directory)
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    slots = gpus if gpus else [None]
    queue = collections.deque(cases)
    lock = threading.Lock()
    stop = threading.Event()
    done_rows: list[dict] = []
    workers: dict[int, _Worker] = {}
    flops_per_s = (ceilings or {}).get("flops_per_s")
    bytes_per_s = (ceilings or {}).get("bytes_per_s")
    failures: dict[tuple, list[dict]] = collections.defaultdict(list)  # consecutive crash/timeout

    def given_up(case: Case) -> dict | None:
        streak = failures[(case.backend, case.kernel, case.params)]
        if max_kernel_failures <= 0 or len(streak) < max_kernel_failures:
            return None
        last = streak[-1]
        first_line = str(last.get("reason") or "").strip().splitlines()[:1]
        return {"status": last["status"],
                "reason": f"not run: this kernel's last {len(streak)} cases ended in "
                          f"{last['status']} ({first_line[0] if first_line else 'no reason'}); "
                          "--max-kernel-failures 0 runs every case"}

    errors: list[BaseException] = []

    def slot_loop(slot: int, gpu: str | None) -> None:
        try:
            slot_cases(slot, gpu)
        except BaseException as exc:  # e.g. ResultWriteError: stop every slot, raise in the caller
            errors.append(exc)
            stop.set()
            w = workers.pop(slot, None)
            if w is not None:
                w.kill()

    def slot_cases(slot: int, gpu: str | None) -> None:
        log_path = directory / "logs" / f"worker-{slot}.log"
        while not stop.is_set():
            with lock:
                if not queue:
                    break
                case = queue.popleft()
            if on_start is not None:
                on_start(slot, case)
            with lock:
                skipped = given_up(case)
            if skipped is not None:
                row = _base_row(case)
                row.update(skipped)
                R.fill_model_columns(row, flops_per_s, bytes_per_s)
                with lock:
                    written = writer.append(row)
                    done_rows.append(written)
                if on_done is not None:
                    on_done(written)
                continue
            worker = workers.get(slot)
            if worker is not None and (worker.backend != case.backend or not worker.alive()):
                worker.stop()
                worker = None
            if worker is None:
                worker = _Worker(ctx, slot, gpu, log_path, case.device)
                workers[slot] = worker
            if worker.start_error:
                outcome = {"status": "crash", "reason": worker.start_error}
            else:
                worker.backend = case.backend
                outcome = worker.run(case)
            if stop.is_set():
                break
            restart = RESTART_AFTER | (RESTART_AFTER_ON_GPU if case.device.startswith("cuda") else set())
            if outcome.get("status") in restart or worker.start_error:
                worker.kill()
                workers.pop(slot, None)
            row = _base_row(case)
            for key, value in outcome.items():
                if key in R.COLUMNS and key not in R.IDENTITY_COLUMNS:
                    row[key] = value
            R.fill_model_columns(row, flops_per_s, bytes_per_s)
            with lock:
                streak = failures[(case.backend, case.kernel, case.params)]
                if row.get("status") in ("crash", "timeout"):
                    streak.append(row)
                else:
                    streak.clear()
                written = writer.append(row)
                done_rows.append(written)
            if on_done is not None:
                on_done(written)
        w = workers.pop(slot, None)
        if w is not None:
            w.stop()

    threads = [threading.Thread(target=slot_loop, args=(n, gpu), daemon=True, name=f"slot-{n}")
               for n, gpu in enumerate(slots)]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
        if errors:
            raise errors[0]
    except BaseException:
        stop.set()
        for w in list(workers.values()):
            w.kill()
        raise
    finally:
        writer.close()
    return done_rows


def select_kernels(cases: list[Case], patterns: list[str] | None) -> list[Case]:
    """The cases whose kernel label or backend matches one of the glob ``patterns``
    (case-insensitive); all cases when ``patterns`` is empty or None.

    Raises UserError naming a pattern that matches no kernel, with the suite's labels."""
    import fnmatch

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
    plots: bool = True,
) -> RunResult:
    """Run a validated suite end to end: expand, (shard), skip measured cases when
    resuming, run every case in workers with a progress bar, write the result set
    (rows.jsonl as it goes, then results.parquet, metadata.json, plots).

    Args:
        out_root: root of new result sets (``<out_root>/<suite>/<timestamp>/``).
        resume: an existing result-set directory to finish (its measured cases are skipped).
        gpus: from :func:`parse_gpus`.
        shard: ``"K/N"`` (``tflabench.shard``).
        only: glob patterns (case-insensitive); keep only the kernels whose suite label or
            backend name matches one of them (e.g. ``["*mLSTMsig*", "mamba2"]``).
        max_kernel_failures: see :func:`run_cases`.
        ceilings: ``datasheet`` or ``measured`` (roofline columns).
        device: override the suite's device (``cpu`` / ``cuda``).
        console: rich Console for the progress bar (default: stderr).

    The result set is locked while the run writes it (:class:`~tflabench.results.ResultSetLock`).
    A resume checks that the suite describes the same measurement
    (:func:`tflabench.resume.plan_resume`), sets a torn last line of ``rows.jsonl`` aside
    (:func:`~tflabench.results.repair_rows`) and lists the cases added to or removed from
    the suite since the set began.

    Raises UserError for a CUDA suite without a GPU, a bad shard, a resume directory that
    is not a result set of this suite or was measured under other conditions, a result set
    another run is writing; :class:`~tflabench.results.ResultWriteError` (a UserError) when
    the result set cannot be written.
    """
    from rich.console import Console

    from tflabench import environment
    from tflabench import resume as resume_mod

    suite = loaded.suite
    dev = device or resolve_device(suite.device)
    require_device(suite.name, dev, "run the CPU default (`tflabench run`) or set device: auto in the suite")
    all_cases = expand_cases(loaded, device=dev)
    cases = select_kernels(all_cases, only)
    shard_text = None
    if shard:
        from tflabench.shard import format_shard, parse_shard, select_shard

        k, n = parse_shard(shard)
        cases = select_shard(cases, k, n, case_cost)
        shard_text = format_shard(k, n)

    env = environment.collect()
    ceil = _ceilings(env.get("gpu_name") if dev == "cuda" else None, ceilings)
    conditions = resume_mod.measurement(loaded, dev, all_cases)
    console = console or Console(stderr=True)
    if resume is not None:
        directory = Path(resume)
        if not (directory / R.ROWS_FILE).exists() and not (directory / R.METADATA_FILE).exists():
            raise UserError(f"--resume {str(directory)!r}: not a result set (no {R.ROWS_FILE})")
    else:
        directory = R.new_result_directory(out_root, suite.name)
    lock = R.ResultSetLock(directory).acquire()
    try:
        return _run_locked(loaded, directory, lock, console, resume=resume is not None, conditions=conditions,
                           env=env, ceil=ceil, all_cases=all_cases, cases=cases, dev=dev, gpus=gpus,
                           shard_text=shard_text, only=only, max_kernel_failures=max_kernel_failures,
                           progress=progress, plots=plots)
    finally:
        lock.release()


def _run_locked(loaded: LoadedSuite, directory: Path, lock, console, *, resume: bool, conditions: dict,
                env: dict, ceil: dict | None, all_cases: list[Case], cases: list[Case], dev: str,
                gpus: list[str] | None, shard_text: str | None, only: list[str] | None,
                max_kernel_failures: int, progress: bool, plots: bool) -> RunResult:
    """:func:`run_suite` once the result set is locked: check a resume, set torn lines
    aside, write the metadata, run, write the table and the plots."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn)

    from tflabench import resume as resume_mod

    suite = loaded.suite
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    if lock.note:
        _say(console, "note", lock.note)
    R.remove_stale_temporaries(directory)
    resumed: list[dict] = []
    if resume:
        old_meta = {}
        if (directory / R.METADATA_FILE).exists():
            try:
                old_meta = json.loads((directory / R.METADATA_FILE).read_text())
            except ValueError as exc:
                raise UserError(f"--resume {str(directory)!r}: {R.METADATA_FILE} is not valid JSON ({exc}); "
                                "start a fresh run (the same command without --resume)") from None
        plan = resume_mod.plan_resume(directory, loaded, old_meta, conditions, env, all_cases,
                                      shard=shard_text, ceilings=ceil)
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
        done = set()
        date = now
    todo = [c for c in cases if c.case_id not in done]
    skipped = len(cases) - len(todo)
    metadata = {
        "suite": suite.name, "suite_path": str(loaded.path), "suite_sha256": loaded.sha256,
        "date": date, **env, "shard": shard_text, "ceilings": ceil,
        "device": dev, "gpus": gpus,
        "compare": suite.compare.model_dump(exclude_none=True),
        "only": list(only) if only else None,
        "measurement": conditions,
    }
    if resumed:
        metadata["resumed"] = resumed
    R.write_metadata(directory, metadata)

    console.print(f"writing to {directory} ({len(todo)} cases to run"
                  + (f", {skipped} already measured" if skipped else "") + ")")
    t0 = time.perf_counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}", justify="left"), BarColumn(),
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
                             max_kernel_failures=max_kernel_failures)
        finally:
            if (directory / R.ROWS_FILE).exists():
                try:
                    R.finalize(directory)
                except UserError as exc:  # e.g. a full disk: rows.jsonl still holds every row
                    _say(console, "warning", f"{exc} (rows.jsonl holds every row; report, compare and "
                         "merge read it)")
        bar.update(task, description=f"{suite.name}: done")
    wall = time.perf_counter() - t0
    written_plots: list[Path] = []
    if plots and (directory / R.ROWS_FILE).exists():
        try:
            from tflabench.plots.benchmark import write_plots

            written_plots = write_plots(directory)
        except Exception as exc:  # a plot problem must not lose the measurements
            console.print(f"[yellow]warning:[/] plots not written ({type(exc).__name__}: {exc})")
    return RunResult(directory=directory, rows=rows, skipped=skipped, wall_s=wall, plots=written_plots)


def summary_table(frame, title: str | None = None):
    """A rich Table of result rows (kernel, mode, shape, status, ms_median, peak GiB,
    first-call s, numerics error and its tensor, TFLOP/s, reason), in row order."""
    import math

    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col, kw in (("kernel", {}), ("mode", {}), ("B", {"justify": "right"}), ("S", {"justify": "right"}),
                    ("NH x d_qk/d_hv", {}), ("L", {"justify": "right"}), ("status", {}),
                    ("ms median", {"justify": "right"}), ("peak GiB", {"justify": "right"}),
                    ("1st call s", {"justify": "right"}), ("err", {"justify": "right"}),
                    ("TFLOP/s", {"justify": "right"}), ("reason", {"overflow": "fold", "max_width": 60})):
        table.add_column(col, **kw)
    colour = {"ok": "green", "wrong": "red", "crash": "red", "timeout": "yellow", "oom": "yellow",
              "error": "red", "unavailable": "dim"}

    def fmt(x, spec):
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return ""
        return format(x, spec)

    for r in frame.to_dict("records"):
        status = r.get("status") or ""
        peak = r.get("peak_mem_bytes")
        table.add_row(
            str(r.get("kernel")), str(r.get("mode")), fmt(r.get("batch"), ".0f"), fmt(r.get("seq_len"), ".0f"),
            f"{fmt(r.get('heads'), '.0f')} x {fmt(r.get('d_qk'), '.0f')}/{fmt(r.get('d_hv'), '.0f')}",
            fmt(r.get("chunk_size"), ".0f"), f"[{colour.get(status, 'white')}]{status}[/]",
            fmt(r.get("ms_median"), ".3f"), fmt(peak / 2**30 if peak is not None and peak == peak else None, ".2f"),
            fmt(r.get("first_call_s"), ".2f"),
            " ".join(x for x in (fmt(r.get("numerics_err"), ".1e"), str(r.get("numerics_worst") or "")) if x),
            fmt(r.get("tflops_per_s"), ".3g"), str(r.get("reason") or "")[:160],
        )
    return table


__all__ = ["run_suite", "run_cases", "parse_gpus", "case_cost", "summary_table", "RunResult"]
