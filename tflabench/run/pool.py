"""The worker pool: each case of a run in a worker process, so that no case can end the run.

Each case runs in a worker process (``multiprocessing`` spawn) that calls the per-case
work, :func:`tflabench.run.measure.measure_case` (a timing case) or
:func:`tflabench.run.verify_case.verify_case` (a case whose ``verify`` field is set). The
parent waits for the result with the case's timeout:

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

Each worker's stdout and stderr go through a pipe to ``<result dir>/logs/worker-<slot>.log``,
at most :data:`LOG_HEAD_BYTES` + :data:`LOG_TAIL_BYTES` per case (:class:`_LogPump`): a kernel
that prints in a loop cannot fill the disk, and the end of its output, where the error is,
is kept.

No process a case starts outlives it (docs/result-sets.md, "Processes of a run"): each worker
leads its own process group (``os.setsid``) and asks the kernel for SIGKILL when the
thread that started it ends (``PR_SET_PDEATHSIG``, Linux); a timeout, a crash or the end
of a worker kills its whole group (``os.killpg``), and a small reaper process
(:class:`_GroupReaper`) kills the groups still registered when the run itself dies, even
by SIGKILL (it sees its pipe from the run close). What a run
does around the pool (the suite, resume, metadata, the result table) is
:mod:`tflabench.run.suite_run` and :mod:`tflabench.run.verify_run`.
"""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import gc
import multiprocessing
import os
import pickle
import platform
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from tflabench.store import files, results as R, schema
from tflabench.run import triton_cache
from tflabench.backends import get_backend
from tflabench.environment import gpu_info, gpus_used, visible_gpus
from tflabench.errors import UserError
from tflabench.store.suite import Case

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
#: Bytes of one case's output a worker log keeps from its start, and from its end; what lies
#: between is left out and counted in one line.
LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 256 << 10

# --------------------------------------------------------------------------- worker side


PR_SET_PDEATHSIG = 1


def _own_group_and_parent_death(parent_pid: int) -> None:
    """Make this worker the leader of its own process group (so a timeout can kill every
    process its case started with one ``os.killpg``) and ask the kernel to SIGKILL it when
    the thread that started it ends (``prctl(PR_SET_PDEATHSIG)``, Linux; it works even while
    this process holds the GIL in C code, where :func:`_watch_parent` cannot run). Exits at
    once when the parent is already gone."""
    try:
        os.setsid()
    except OSError:  # already a group leader
        pass
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the parent watch remains
            pass
    if os.getppid() != parent_pid:
        os._exit(3)


_REAPER_CODE = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line[:1] == "+" and line[1:].isdigit():
        groups.add(int(line[1:]))
    elif line[:1] == "-" and line[1:].isdigit():
        groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class _GroupReaper:
    """A small process that kills the workers' process groups when the run dies.

    The run tells it each worker's group (``+pgid`` when started, ``-pgid`` once killed)
    through a pipe; when the pipe closes (the run ended, however: SIGKILL included, the
    kernel closes it) the reaper kills every group still registered, so that a process a
    case started (a kernel's helper, a compiler) does not outlive the run. It runs in its
    own session, so Ctrl-C on the terminal does not end it first. Posix only; elsewhere a
    no-op."""

    def __init__(self):
        import subprocess

        self._lock = threading.Lock()
        self._process = None
        if os.name != "posix":  # pragma: no cover
            return
        try:
            self._process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER_CODE],
                                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError:  # pragma: no cover - cannot start a process: the pool fails next anyway
            self._process = None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._process is None or self._process.stdin is None:
                return
            try:
                self._process.stdin.write(line.encode() + b"\n")
                self._process.stdin.flush()
            except (OSError, ValueError):
                pass

    def add(self, pgid: int) -> None:
        """Register a worker's process group."""
        self._send(f"+{pgid}")

    def remove(self, pgid: int) -> None:
        """Forget a group that was killed (its id may be reused later)."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Close the pipe (the reaper kills what is still registered) and wait for it."""
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:  # pragma: no cover
            pass
        try:
            process.wait(10)
        except Exception:  # pragma: no cover - it is in its own session; leave it
            pass


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by worker ``pid`` (the worker and every process its
    cases started that stayed in the group); nothing when the group is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    except OSError:  # pragma: no cover
        pass


def _watch_parent(parent_pid: int) -> None:
    """Exit the worker when its parent is gone (never leave an orphan on a GPU)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(3)


#: Environment variables of the CPU thread pools (OpenMP, MKL, OpenBLAS) a worker sets.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_threads(workers: int = 1, environ=None) -> dict:
    """How many CPU threads each worker's torch (and OpenMP/MKL) may use.

    Workers that share the cores must not fight over them: a thread pool as wide as the
    machine, beside the parent process and other workers, waits in the scheduler's 4 ms
    ticks and turns medians into noise. Each worker gets ``(cores - 1) // workers``
    threads (one core left to the parent and the system), at least 1; ``OMP_NUM_THREADS``
    set by the user wins.

    Returns:
        ``{"per_worker", "cores", "workers", "set_by"}`` (recorded in the result set's
        metadata as ``cpu_threads``).
    """
    environ = os.environ if environ is None else environ
    cores = usable_cores()
    given = str(environ.get("OMP_NUM_THREADS", "")).strip()
    if given.isdigit() and int(given) > 0:
        return {"per_worker": int(given), "cores": cores, "workers": workers, "set_by": "OMP_NUM_THREADS"}
    return {"per_worker": max(1, (cores - 1) // max(1, workers)), "cores": cores, "workers": workers,
            "set_by": "tflabench: (cores - 1) // workers"}


#: glibc malloc settings of every CPU worker (``mallopt``), so that the tensors a case
#: allocates and frees on each call reuse the heap instead of fresh ``mmap`` pages: with
#: glibc's defaults every call of a CPU kernel that frees a buffer above the (moving) mmap
#: threshold pays its page faults again, and a case's median then depends on where that
#: threshold happened to stand in its process (docs/harness.md, "CPU threads: workers share
#: the cores").
#: Bytes; the keys are glibc's ``mallopt`` parameter names.
CPU_MALLOC_SETTINGS: dict[str, int] = {
    "M_MMAP_THRESHOLD": 32 << 20,   # glibc's largest: only buffers above 32 MiB get their own mmap
    "M_TRIM_THRESHOLD": 256 << 20,  # keep up to 256 MiB of freed heap instead of returning it
    "M_TOP_PAD": 64 << 20,          # grow the heap in steps of 64 MiB
}
_MALLOPT_PARAM = {"M_TRIM_THRESHOLD": -1, "M_TOP_PAD": -2, "M_MMAP_THRESHOLD": -3}


def cpu_allocator() -> dict:
    """What CPU workers do to the C allocator (recorded in the result set's metadata as
    ``cpu_allocator``): ``{"library", "mallopt"}`` with :data:`CPU_MALLOC_SETTINGS` on
    glibc, ``{"library", "mallopt": None}`` elsewhere (the allocator is left as it is)."""
    library = platform.libc_ver()[0] or "unknown"
    return {"library": library, "mallopt": dict(CPU_MALLOC_SETTINGS) if library == "glibc" else None}


def steady_allocator() -> bool:
    """Apply :data:`CPU_MALLOC_SETTINGS` to this process's glibc malloc (``mallopt``).

    Returns True when every setting was taken; False on another C library or when glibc
    refused one (the process then keeps its defaults for that setting).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - no dynamic loader
        return False
    return all(libc.mallopt(_MALLOPT_PARAM[name], value) == 1 for name, value in CPU_MALLOC_SETTINGS.items())


def _worker_main(conn, output, gpu: str | None, parent_pid: int, device: str, threads: int = 0) -> None:
    """Worker loop: receive :class:`~tflabench.store.suite.Case` objects (pickled whole, their
    typed ``params`` with them: nothing is parsed again here), send back outcome dicts, until
    None or EOF.

    ``output`` is the writing end of the pipe that becomes the worker's stdout and stderr
    (the parent's :class:`_LogPump` copies it into the log). ``gpu`` pins the worker
    (``CUDA_VISIBLE_DEVICES``); on the CPU, Triton kernels run in Triton's interpreter
    (``TRITON_INTERPRET=1``, set before anything imports triton).
    ``threads`` (> 0): the width of the worker's CPU thread pools (:func:`cpu_threads`),
    set before torch loads and with ``torch.set_num_threads``. CPU workers also set the C
    allocator for steady timings (:func:`steady_allocator`).
    """
    _own_group_and_parent_death(parent_pid)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if threads > 0:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(threads)
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        steady_allocator()
    scope = triton_cache.prepare_worker(os.environ)
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr, all_threads=False)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        # Imported here, not at the top: the environment above (CUDA_VISIBLE_DEVICES,
        # TRITON_INTERPRET) must be set before torch and triton load; the start-up cost is
        # paid before the first case.
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        from tflabench.run import measure, verify_case
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
        case: Case = msg
        print(f"--- case {case.describe()} pid={os.getpid()} params={case.params_json}", flush=True)
        if scope == "case":     # tune at this case's shape (triton_cache: autotuning scope)
            triton_cache.forget_autotuning()
        try:
            outcome = verify_case.verify_case(case) if case.verify else measure.measure_case(case)
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
        backend = get_backend(case.backend)
        return backend.classify_error(case.params, case.mode, exc)
    except Exception:  # classification must never hide the original error
        return None


def _exception_reason(exc: BaseException) -> str:
    """``Type: message`` first, then the innermost frames (file:line in function)."""
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = " | ".join(ln.strip() for ln in head if ln.strip())
    return (text + (f" (at {where})" if where else ""))[:1500]


# --------------------------------------------------------------------------- parent side


class _LogPump:
    """Copies a worker's output (the reading end of its pipe) into its log file, keeping
    per case the first :data:`LOG_HEAD_BYTES` and the last :data:`LOG_TAIL_BYTES`; what
    lies between is replaced by one line saying how much was left out. :meth:`new_case`
    starts the count of the next case; :meth:`close` waits for the worker's end of the
    pipe to close (the output of a worker that died is complete then) and writes the tail."""

    def __init__(self, reader, log_path: Path):
        self._reader = reader  # a multiprocessing Connection: its fd is read raw
        # appended, never through a link planted in the set (the logs of a resumed set)
        self._file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                       | getattr(os, "O_NOFOLLOW", 0), 0o644), "ab")
        self._lock = threading.Lock()
        self._head = 0
        self._tail = bytearray()
        self._dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._pump, daemon=True, name=f"log-{log_path.name}")
        self._thread.start()

    def _pump(self) -> None:
        fd = self._reader.fileno()
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            with self._lock:
                if not self._closed:
                    self._take(data)
        with self._lock:
            self._write_tail()

    def _take(self, data: bytes) -> None:
        room = LOG_HEAD_BYTES - self._head
        if room > 0:
            part = data[:room]
            self._write(part)
            self._head += len(part)
            data = data[room:]
        if data:
            self._tail += data
            excess = len(self._tail) - LOG_TAIL_BYTES
            if excess > 0:
                del self._tail[:excess]
                self._dropped += excess

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
            self._file.flush()
        except (OSError, ValueError):  # a full disk: the log is the least of it; rows decide
            pass

    def _write_tail(self) -> None:
        if self._dropped:
            self._write(f"\n[... {self._dropped} bytes of this case's output left out: a worker log keeps "
                        f"the first {LOG_HEAD_BYTES} and the last {LOG_TAIL_BYTES} bytes of each case ...]\n"
                        .encode())
        if self._tail:
            self._write(bytes(self._tail))
        self._tail = bytearray()
        self._dropped = 0

    def new_case(self) -> None:
        """Write what the last case left in the tail; count the next case from zero."""
        with self._lock:
            self._write_tail()
            self._head = 0

    def close(self, wait_s: float = 5.0) -> None:
        """Wait up to ``wait_s`` for the pipe to close, write the tail, close the log."""
        self._thread.join(wait_s)
        with self._lock:
            if not self._closed:
                self._write_tail()
                self._closed = True
                self._file.close()
        if not self._thread.is_alive():
            with self._lock:  # the slot thread and an interrupted run may both close a worker
                if self._reader is not None:
                    reader, self._reader = self._reader, None
                    try:
                        reader.close()
                    except OSError:  # already closed underneath: nothing left to release
                        pass


class _Worker:
    """One worker process and its pipe (parent side)."""

    def __init__(self, ctx, slot: int, gpu: str | None, log_path: Path, device: str = "cuda", threads: int = 0,
                 reaper: _GroupReaper | None = None):
        self.slot, self.gpu, self.log_path = slot, gpu, log_path
        self.reaper = reaper
        self.backend: str | None = None
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.conn = parent_conn
        log_reader, log_writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_worker_main, args=(child_conn, log_writer, gpu, os.getpid(), device, threads),
            name=f"tflabench-worker-{slot}", daemon=True)
        self._log_offset = self._log_size()
        self.log = _LogPump(log_reader, log_path)
        self.process.start()
        if self.reaper is not None:
            self.reaper.add(self.process.pid)
        child_conn.close()
        log_writer.close()
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
        self.log.close()  # the worker's last words are in the log now
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
        self.log.new_case()
        self._log_offset = self._log_size()
        try:
            self.conn.send(case)   # pickled whole: the typed params cross as they are
        except (BrokenPipeError, OSError):
            return {"status": "crash", "reason": self._death_reason("worker was gone before the case")}
        except (pickle.PicklingError, TypeError, AttributeError) as exc:   # nothing was sent
            return {"status": "error", "reason": f"the case cannot be sent to its worker ({exc})"}
        if self.conn.poll(case.timeout_s):
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                return {"status": "crash", "reason": self._death_reason("worker died")}
        self.kill()
        self.log.close()
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
        """Kill the worker's whole process group (the worker and what its cases started)."""
        pid = self.process.pid
        if pid is not None:
            kill_group(pid)  # after a clean exit too: a case's helper may still run
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        if pid is not None and self.reaper is not None:
            self.reaper.remove(pid)
        try:
            self.conn.close()
        except OSError:  # pragma: no cover
            pass
        self.log.close()


def parse_gpus(text: str | None) -> list[str] | None:
    """``--gpus``: None (one worker, default device), ``all`` (every GPU this process may
    use, ``CUDA_VISIBLE_DEVICES`` applied) or a comma list of GPU indices (``0,1``) of this
    host. Returns the list of ``CUDA_VISIBLE_DEVICES`` values, one worker slot each.

    Raises UserError for anything else, on a machine without GPUs, and for an index that
    names no GPU of this host."""
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    info = gpu_info()
    if text == "all":
        visible = visible_gpus(info)
        if not visible:
            raise UserError("--gpus='all': no GPU is visible here (nvidia-smi and torch see none); "
                            "leave --gpus out to run on this machine's CPU")
        return [d.index for d in visible]
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise UserError(f"--gpus={text!r}: give 'all' or distinct GPU indices separated by commas (e.g. 0,1)")
    if not info.devices:
        raise UserError(f"--gpus={text!r}: no GPU is visible here (nvidia-smi and torch see none); "
                        "leave --gpus out to run on this machine's CPU")
    known = [d.index for d in info.devices]
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise UserError(f"--gpus={text!r}: GPU {unknown[0]} does not exist here; {len(known)} visible "
                        f"({', '.join(known)}; or --gpus all)")
    return parts


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run (``run``, ``verify``), and where it stood then.

    Attributes:
        directory: the result set holding the rows measured so far (for the ``--resume`` a
            user is told to give), or None when none was created yet.
        written: whether the run had written to it (its metadata, then rows as they came);
            a resume interrupted before that left the set as it was.
        rows: cases with a whole row in it now (this run's and earlier), None when not counted.
        resume: whether the run resumed ``directory``.
    """

    def __init__(self, directory: Path | None, *, written: bool = True, rows: int | None = None,
                 resume: bool = False):
        super().__init__(str(directory))
        self.directory, self.written, self.rows, self.resume = directory, written, rows, resume


def _base_row(case: Case) -> dict:
    return schema.new_row(**case.identity())


def _kernel_key(case: Case) -> tuple:
    """What makes cases one kernel for the crash / timeout streaks: backend, label, params."""
    return (case.backend, case.kernel, case.params_json)


def _restarts_worker(case: Case, outcome: dict) -> bool:
    """Whether the worker that ran ``case`` to ``outcome`` is replaced before the next case."""
    restart = RESTART_AFTER | (RESTART_AFTER_ON_GPU if case.device.startswith("cuda") else set())
    return outcome.get("status") in restart


def _open_row_writer(directory: Path) -> R.RowWriter:
    """The set's row writer, once its ``logs`` folder is a real directory (never a link
    planted in a resumed set)."""
    writer = R.RowWriter(directory)
    try:
        files.real_directory(directory / "logs")
    except BaseException:
        writer.close()
        raise
    return writer


class _SlotRun:
    """What the slots of one :func:`run_cases` share: the queue of cases, each slot's worker,
    the row writer, each kernel's streak of crash / timeout rows, and the event that stops
    every slot. Each slot runs :meth:`slot_loop` in its own thread."""

    def __init__(self, ctx, cases: list[Case], directory: Path, writer: R.RowWriter, reaper: _GroupReaper, *,
                 per_worker: int, slot_gpu: dict, ceilings: dict | None, max_kernel_failures: int,
                 on_start: Callable[[int, Case], None] | None, on_done: Callable[[dict], None] | None):
        self.ctx, self.directory, self.writer, self.reaper = ctx, directory, writer, reaper
        self.per_worker, self.slot_gpu, self.max_kernel_failures = per_worker, slot_gpu, max_kernel_failures
        self.on_start, self.on_done = on_start, on_done
        self.flops_per_s = (ceilings or {}).get("flops_per_s")
        self.bytes_per_s = (ceilings or {}).get("bytes_per_s")
        self.queue = collections.deque(cases)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.done_rows: list[dict] = []
        self.workers: dict[int, _Worker] = {}
        self.failures: dict[tuple, list[dict]] = collections.defaultdict(list)  # consecutive crash/timeout
        self.errors: list[BaseException] = []

    def given_up(self, case: Case) -> dict | None:
        """The ``not_run`` outcome of a case whose kernel's last cases crashed or timed out
        ``max_kernel_failures`` times in a row; None where it runs. Called under the lock."""
        streak = self.failures[_kernel_key(case)]
        if self.max_kernel_failures <= 0 or len(streak) < self.max_kernel_failures:
            return None
        last = streak[-1]
        first_line = str(last.get("reason") or "").strip().splitlines()[:1]
        return {"status": schema.NOT_RUN,
                "reason": f"not run: this kernel's last {len(streak)} cases ended in "
                          f"{last['status']} ({first_line[0] if first_line else 'no reason'}); "
                          "a --resume runs it (--max-kernel-failures 0 runs every case)"}

    def next_case(self) -> Case | None:
        """The next case of the queue, or None when it is empty."""
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def record(self, row: dict, streak_of: Case | None = None) -> None:
        """Fill the row's model columns, append it to the set and report it; with
        ``streak_of``, count it in (or end) that case's kernel's crash / timeout streak."""
        schema.fill_model_columns(row, self.flops_per_s, self.bytes_per_s)
        with self.lock:
            if streak_of is not None:
                streak = self.failures[_kernel_key(streak_of)]
                if row.get("status") in ("crash", "timeout"):
                    streak.append(row)
                else:
                    streak.clear()
            written = self.writer.append(row)
            self.done_rows.append(written)
        if self.on_done is not None:
            self.on_done(written)

    def worker_for(self, slot: int, gpu: str | None, case: Case) -> _Worker:
        """The slot's worker for ``case``: the one it has while that one lives and ran the same
        backend, else a new one (the old one stopped)."""
        worker = self.workers.get(slot)
        if worker is not None and (worker.backend != case.backend or not worker.alive()):
            worker.stop()
            worker = None
        if worker is None:
            log_path = self.directory / "logs" / f"worker-{slot}.log"
            worker = _Worker(self.ctx, slot, gpu, log_path, case.device, self.per_worker, self.reaper)
            self.workers[slot] = worker
        return worker

    def outcome_row(self, slot: int, case: Case, outcome: dict) -> dict:
        """The row of a case a worker ran: the case's identity, the outcome's result columns,
        and on CUDA the GPU it ran on (the worker's own columns, else the slot's)."""
        row = _base_row(case)
        for key, value in outcome.items():   # the identity is the case's, never the outcome's
            if key in schema.COLUMNS and key not in schema.IDENTITY_COLUMNS:
                row[key] = value
        if case.device.startswith("cuda") and row.get("status") != "unavailable":
            where = self.slot_gpu.get(slot) or {}  # the worker's own columns win; a dead one has none
            row["gpu_index"] = row.get("gpu_index") or where.get("index")
            row["gpu_name"] = row.get("gpu_name") or where.get("name")
        return row

    def slot_cases(self, slot: int, gpu: str | None) -> None:
        """Take cases from the queue until it is empty or the run stops; write each one's row."""
        while not self.stop.is_set():
            case = self.next_case()
            if case is None:
                break
            if self.on_start is not None:
                self.on_start(slot, case)
            with self.lock:
                skipped = self.given_up(case)
            if skipped is not None:
                row = _base_row(case)
                row.update(skipped)
                self.record(row)
                continue
            worker = self.worker_for(slot, gpu, case)
            if worker.start_error:
                outcome = {"status": "crash", "reason": worker.start_error}
            else:
                worker.backend = case.backend
                outcome = worker.run(case)
            if self.stop.is_set():
                break
            if _restarts_worker(case, outcome) or worker.start_error:
                worker.kill()
                self.workers.pop(slot, None)
            self.record(self.outcome_row(slot, case, outcome), streak_of=case)
        w = self.workers.pop(slot, None)
        if w is not None:
            w.stop()

    def slot_loop(self, slot: int, gpu: str | None) -> None:
        """:meth:`slot_cases`; an exception there (e.g. ResultWriteError) stops every slot and
        is raised in the caller."""
        try:
            self.slot_cases(slot, gpu)
        except BaseException as exc:
            self.errors.append(exc)
            self.stop.set()
            w = self.workers.pop(slot, None)
            if w is not None:
                w.kill()

    def run_slots(self, slots: list) -> None:
        """One thread per slot until all end; the first slot's exception is raised. On any
        exception (Ctrl-C too) every slot stops and every worker is killed."""
        threads = [threading.Thread(target=self.slot_loop, args=(n, gpu), daemon=True, name=f"slot-{n}")
                   for n, gpu in enumerate(slots)]
        try:
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)
            if self.errors:
                raise self.errors[0]
        except BaseException:
            self.stop.set()
            for w in list(self.workers.values()):
                w.kill()
            raise


def run_cases(
    cases: list[Case],
    directory: Path,
    *,
    gpus: list[str] | None = None,
    ceilings: dict | None = None,
    on_start: Callable[[int, Case], None] | None = None,
    on_done: Callable[[dict], None] | None = None,
    max_kernel_failures: int = 2,
    threads: int | None = None,
) -> list[dict]:
    """Run ``cases`` in worker processes, appending each row to ``directory/rows.jsonl`` as
    it completes; returns the rows in completion order.

    Each slot runs its own worker, pinned to its GPU; a slot whose worker dies or hangs
    records that one case (``crash`` / ``timeout``), starts a new worker and goes on, and the
    other slots never wait for it. A CUDA row names the GPU it ran on (``gpu_index``,
    ``gpu_name``: the worker's, or the slot's where the worker died).

    Args:
        gpus: one worker slot per entry (its ``CUDA_VISIBLE_DEVICES``); None: one slot.
        max_kernel_failures: after this many consecutive ``crash`` / ``timeout`` rows of one
            kernel (same backend, label and params), its remaining cases are not run: each
            becomes a row of status ``not_run`` whose reason says why (a peer that aborts
            while compiling, or autotunes past the timeout, would otherwise cost a worker
            start or a whole timeout per case); a ``--resume`` runs them. 0 runs every case.
        ceilings: ``{"flops_per_s", "bytes_per_s"}`` for the roofline columns (or None).
        threads: CPU threads per worker; None: :func:`cpu_threads` for this many slots.
        on_start(slot, case) / on_done(row): progress callbacks (called from slot threads).

    KeyboardInterrupt stops the slots, kills the workers and propagates. A row that cannot
    be written (a full disk) stops the run the same way and raises
    :class:`~tflabench.store.files.ResultWriteError`; the rows written before it stay.
    """
    ctx = multiprocessing.get_context("spawn")
    writer = _open_row_writer(directory)
    reaper = _GroupReaper()
    slots = gpus if gpus else [None]
    per_worker = threads if threads is not None else cpu_threads(len(slots))["per_worker"]
    # the GPU each slot's worker runs on, for the rows (also those of a worker that died)
    on_gpu = any(c.device.startswith("cuda") for c in cases)
    slot_gpu = dict(enumerate(gpus_used(gpus))) if on_gpu else {}
    run = _SlotRun(ctx, cases, directory, writer, reaper, per_worker=per_worker, slot_gpu=slot_gpu,
                   ceilings=ceilings, max_kernel_failures=max_kernel_failures, on_start=on_start, on_done=on_done)
    try:
        run.run_slots(slots)
    finally:
        writer.close()
        reaper.close()
    return run.done_rows


__all__ = ["RunInterrupted", "run_cases", "parse_gpus", "cpu_threads", "cpu_allocator", "steady_allocator", "CPU_MALLOC_SETTINGS", "usable_cores", "THREAD_VARIABLES", "REASON_LINES", "RESTART_AFTER", "RESTART_AFTER_ON_GPU",
           "WORKER_START_TIMEOUT_S"]
