"""``tflabench verify``: the grid of a suite's verify cases and its run.

The grid (the suite's ``numerics.verify`` section, :class:`tflabench.numerics.VerifySettings`):
per kernel configuration of the suite, every dtype x regime x sequence length x
with/without initial state x mode; the regimes that apply to a family are
:func:`tflabench.run.verify_case.regimes_for`. Default lengths per kernel with chunk L:
``L // 2 + 1`` (shorter than one chunk), ``2 L`` (whole chunks), ``2 L + L // 2 + 1``
(a partial last chunk).

Each case runs in the worker pool of ``tflabench run`` (a kernel that aborts is a
``crash`` row; the worker calls :func:`tflabench.run.verify_case.verify_case`), at batch 1 and
``verify.heads`` heads. Rows: ``ok`` (every tensor within budget), ``wrong`` (reason: the
deciding tensor, its error, budget and relF; or the non-finite count), ``unavailable``
(the kernel cannot run this length, mode or state here), ``crash`` / ``timeout`` /
``error``. The result set (``results/<suite>-verify/<timestamp>/``) is read by ``report``
and ``compare`` like any other; the heat map and the table are drawn from it
(:mod:`tflabench.report.plots.numerics`, :mod:`tflabench.report.tables`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from tflabench import environment
from tflabench.store import results as R
from tflabench.store.lock import ResultSetLock
from tflabench.backends import get_backend
from tflabench.errors import UserError
from tflabench.numerics import BUDGET_REASONS, DEFAULT_BUDGETS, VerifySettings
from tflabench.store.suite import Case, LoadedSuite, expand_cases, require_device, resolve_device
from tflabench.run.suite_run import select_kernels
from tflabench.run.verify_case import regimes_for, takes_state
from tflabench.analysis.verify_summary import FAILING
from tflabench.run.pool import RunInterrupted, cpu_threads, run_cases

#: Suffix of a verify result set's suite name (``<suite>-verify``): ``compare`` refuses to
#: match a verify set against a timing set of the same suite.
SUITE_SUFFIX = "-verify"
#: Chunk length used for the default lengths of kernels without a chunk (attention).
DEFAULT_LENGTH_UNIT = 64


def default_seq_lens(chunk_size: int | None) -> list[int]:
    """``[L // 2 + 1, 2 L, 2 L + L // 2 + 1]`` for chunk L (:data:`DEFAULT_LENGTH_UNIT`
    without one): shorter than a chunk, whole chunks, a partial last chunk."""
    L = chunk_size or DEFAULT_LENGTH_UNIT
    return [L // 2 + 1, 2 * L, 2 * L + L // 2 + 1]



def verify_suite_name(name: str) -> str:
    """The suite name of a verify result set: ``<suite>-verify``."""
    return name + SUITE_SUFFIX


def verify_cases(
    loaded: LoadedSuite,
    *,
    device: str | None = None,
    only: list[str] | None = None,
    settings: VerifySettings | None = None,
) -> list[Case]:
    """The verify grid of a suite, in run order (kernels as in the suite, then dtype,
    regime, length, initial state, mode). A kernel whose ``fwdbw`` is refused here
    (``Backend.unsupported_mode``, e.g. FLA's gated backward on Hopper with triton 3.6)
    is checked in ``fwd`` instead when the settings ask for ``fwdbw`` only.

    Args:
        device: ``cpu`` / ``cuda`` (default: the suite's, ``auto`` resolved).
        only: glob patterns on kernel label or backend (``tflabench run --only``).
        settings: overrides the suite's ``numerics.verify``.

    Raises UserError for a pattern that matches no kernel, or an empty grid.
    """
    suite = loaded.suite
    settings = settings or suite.numerics.verify
    device = device or resolve_device(suite.device)
    base = select_kernels(expand_cases(loaded, device=device), only)
    configs: dict[tuple, tuple[Case, set]] = {}
    for c in base:
        key = (c.kernel, c.backend, c.params_json, c.embedding_dim)
        configs.setdefault(key, (c, set()))[1].add(c.dtype)
    cases: list[Case] = []
    name = verify_suite_name(suite.name)
    for c, suite_dtypes in configs.values():
        backend = get_backend(c.backend)
        params = c.params
        family = backend.family.numerics_family(params)
        dtypes = settings.dtypes or sorted(suite_dtypes)
        states = [s for s in settings.initial_state if not s or takes_state(backend)] or [False]
        modes = [m for m in settings.modes if m in backend.modes]
        if "fwdbw" in modes and "fwd" not in modes and backend.unsupported_mode(params, "fwdbw") is not None:
            modes = ["fwd"]  # the backward is refused here: check the forward (output, last state)
        for dtype in dtypes:
            for regime in regimes_for(family, settings):
                spec = settings.regime(regime)
                for S in settings.seq_lens or default_seq_lens(c.chunk_size):
                    for init in states:
                        verify = json.dumps({"name": regime + ("+init" if init else ""), "regime": regime,
                                             "spec": spec.model_dump(mode="json"), "initial_state": init,
                                             "family": family}, sort_keys=True)
                        for mode in modes:
                            cases.append(dataclasses.replace(
                                c, suite=name, dtype=dtype, mode=mode, batch=1, seq_len=S,
                                heads=min(c.heads, settings.heads), verify=verify,
                                warmup=0, iterations=1, check_numerics=True))
    if not cases:
        raise UserError(f"{loaded.path}: the verify grid is empty (no kernel, regime, length or mode left)")
    return cases


@dataclasses.dataclass
class VerifyResult:
    """What ``verify`` produced: the result-set directory, the rows (completion order),
    wall seconds."""

    directory: Path
    rows: list[dict]
    wall_s: float

    def exit_status(self) -> int:
        """1 when any case failed (``wrong``, ``crash``, ``timeout``, ``oom``, ``error``), else 0."""
        return int(any(r.get("status") in FAILING for r in self.rows))


def run_verify(
    loaded: LoadedSuite,
    cases: list[Case],
    *,
    out_root: str | Path = "results",
    gpus: list[str] | None = None,
    device: str | None = None,
    console=None,
    progress: bool = True,
    max_kernel_failures: int = 2,
) -> VerifyResult:
    """Run verify ``cases`` (:func:`verify_cases`) in worker processes with a progress
    bar; write the result set ``<out_root>/<suite>-verify/<timestamp>/`` (rows as they
    complete, table, metadata with the budgets); the heat map is the caller's
    (:func:`tflabench.report.plots.numerics.write_heatmap`). ``max_kernel_failures``:
    as :func:`tflabench.run.pool.run_cases` (a kernel that aborts twice in a row, e.g. while
    compiling, is not started again for each of its remaining cases).

    The result set is locked while verify writes it (:class:`tflabench.store.lock.ResultSetLock`,
    as ``run``): a second writer of the same directory is refused.

    Raises UserError for a CUDA suite without a GPU, or a result set another run holds.
    """
    suite = loaded.suite
    dev = device or resolve_device(suite.device)
    require_device(suite.name, dev)
    name = verify_suite_name(suite.name)
    directory = R.new_result_directory(out_root, name)
    lock = ResultSetLock(directory).acquire()   # as `run`: one writer per result set
    try:
        return _run_verify_locked(loaded, cases, directory, name, dev=dev, gpus=gpus, console=console,
                                  progress=progress, max_kernel_failures=max_kernel_failures,
                                  note=lock.note)
    except KeyboardInterrupt:
        raise RunInterrupted(directory) from None
    finally:
        lock.release()


def _run_verify_locked(loaded: LoadedSuite, cases: list[Case], directory: Path, name: str, *, dev: str,
                       gpus: list[str] | None, console, progress: bool,
                       max_kernel_failures: int, note: str | None = None) -> VerifyResult:
    """:func:`run_verify` once its result set is locked: metadata, the cases, the table."""
    suite = loaded.suite
    metadata = {
        "suite": name, "suite_path": str(loaded.path), "suite_sha256": loaded.sha256,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        **environment.collect(), "shard": None, "ceilings": None, "device": dev, "gpus": gpus,
        "cpu_threads": cpu_threads(len(gpus or [None])), "kind": "verify",
        "budgets": {k: v.model_dump() for k, v in DEFAULT_BUDGETS.items()},
        "budget_overrides": {k: v.model_dump(exclude_none=True) for k, v in suite.numerics.budgets.items()},
        "budget_reasons": BUDGET_REASONS,
    }
    R.write_metadata(directory, metadata)
    console = console or Console(stderr=True)
    if note:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    console.print(f"writing to {directory} ({len(cases)} verify cases)", markup=False)
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(name, total=len(cases))
        try:
            rows = run_cases(cases, directory, gpus=gpus,
                             on_start=lambda slot, c: bar.update(
                                 task, description=f"[{slot}] {c.describe()}"),
                             on_done=lambda row: bar.advance(task), max_kernel_failures=max_kernel_failures)
        finally:
            if (directory / R.ROWS_FILE).exists():
                R.finalize(directory)
    wall = time.perf_counter() - t0
    return VerifyResult(directory=directory, rows=rows, wall_s=wall)


__all__ = ["SUITE_SUFFIX", "default_seq_lens", "verify_suite_name", "verify_cases", "run_verify",
           "VerifyResult"]
