"""Result sets on disk: the one module that knows the result schema.

A result set is a directory ``results/<suite>/<YYYYmmdd-HHMMSS>/`` holding

- ``rows.jsonl``: one JSON object per case and mode, appended and flushed as each case
  completes (an interrupted run keeps what it measured; ``--resume`` reads it back);
- ``results.parquet`` (or ``results.csv`` where pyarrow is absent): the same rows, written
  when the run ends (:func:`finalize`) or by :func:`write_results`;
- ``metadata.json``: the run's environment and suite (see :data:`METADATA_KEYS`).

Crash safety (``docs/harness.md``, "Crash safety"): a row is one complete line or absent
(:class:`RowWriter` writes whole lines, fsynced, and cuts a failed write back off); the
table and ``metadata.json`` are written to a temporary file and renamed; a torn last line
left by a killed run is skipped with a warning on load and set aside into
``rows.jsonl.set-aside`` before a resumed run appends (:func:`repair_rows`); one run at a
time writes a result set (:class:`ResultSetLock`, the file ``.lock``); a suite name becomes
a directory only when it is a plain name (:func:`check_plain_name`).

Source: ``docs/ARCHITECTURE.md``, "Contract: result sets". Every other module reads and
writes result sets through the functions here: :func:`new_row`, :func:`case_id`,
:class:`RowWriter`, :func:`write_results`, :func:`finalize`, :func:`load_results`,
:func:`measured_case_ids`, :func:`fill_model_columns`, :func:`repair_rows`,
:class:`ResultSetLock`, :func:`new_result_directory`.

Import-light: pandas is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import hashlib
import json
import math
import os
import re
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tflabench.errors import UserError, file_kind, io_reason, read_bytes, read_text
from tflabench.model.analysis import place_on_roofline

#: Identity columns: what a case *is*. ``case_id`` is a hash of all the others.
IDENTITY_COLUMNS: tuple[str, ...] = (
    "case_id",
    "suite",
    "kernel",
    "backend",
    "family",
    "params",
    "mode",
    "dtype",
    "device",
    "batch",
    "seq_len",
    "heads",
    "d_qk",
    "d_hv",
    "chunk_size",
    "embedding_dim",
    "numerics_case",
)
#: Identity columns added after result sets existed: left out of :func:`case_id` when None,
#: so that the ids of earlier rows do not change. ``numerics_case``: the verify case
#: (gate regime, length, initial state) of a ``tflabench verify`` row; None for ``run`` rows.
OPTIONAL_IDENTITY_COLUMNS: tuple[str, ...] = ("numerics_case",)
#: ``algorithm``: what the kernel actually ran where the backend says (``tfla``: one of
#: ``tfla.plan.ALGORITHMS``); None for other backends.
OUTCOME_COLUMNS: tuple[str, ...] = ("status", "reason", "algorithm")
TIMING_COLUMNS: tuple[str, ...] = (
    "ms_median",
    "ms_mean",
    "ms_min",
    "ms_max",
    "ms_q25",
    "ms_q75",
    "ms_samples",
    "n_iter",
    "first_call_s",
    "host_ms",
)
#: ``host_ms``: on a GPU, the host's time to issue one call (ms, median; measure.host_ms_per_call),
#: beside the GPU's ``ms_median``; None on the CPU and in sets that predate it.
MEMORY_COLUMNS: tuple[str, ...] = ("peak_mem_bytes",)
#: Where the case ran: ``gpu_index`` the GPU as ``CUDA_VISIBLE_DEVICES`` names it on the
#: host (``"1"``, or a UUID where the run was pinned by UUID), ``gpu_name`` its model as
#: the driver reports it (``NVIDIA H200``); both None on the CPU. Per row, so that a run
#: over several GPUs (``--gpus``, shards) or a host with mixed models says which row ran
#: where, and ``compare`` can warn when it would compare rows across GPU models.
DEVICE_COLUMNS: tuple[str, ...] = ("gpu_index", "gpu_name")
#: ``run --gpu-trace`` (:mod:`tflabench.run.gpu_trace`): over the case's timed calls, the lowest
#: SM clock while busy (MHz), the highest power draw (W) and the slowdown reasons the driver
#: reported (comma-separated, ``""`` none); None without ``--gpu-trace`` or ``nvidia-smi``.
GPU_TRACE_COLUMNS: tuple[str, ...] = ("gpu_sm_mhz_min", "gpu_power_w_max", "gpu_slowdowns")
#: Numerics (tflabench.numerics): ``numerics_err`` the max-normalised error of the tensor
#: that decides the verdict (largest error / budget), ``numerics_worst`` its name,
#: ``numerics_budget`` its budget, ``numerics_relf`` its relative Frobenius error,
#: ``numerics_nonfinite`` NaN/inf count where the reference is finite (all tensors),
#: ``numerics_detail`` JSON tensor -> [max_norm, rel_fro, budget, nonfinite] (plus the
#: normaliser, e.g. ``vs summand scale ...``, for a tensor not judged against its own max:
#: the mLSTM df), ``numerics_ref`` the reference and shape (``; df vs summand scale`` where
#: that applies), ``tf32`` (float32 rows) yes / no / unknown:
#: whether the kernel's dots used TF32.
NUMERICS_COLUMNS: tuple[str, ...] = (
    "numerics_err", "numerics_ref", "numerics_worst", "numerics_budget", "numerics_relf",
    "numerics_nonfinite", "numerics_detail", "tf32",
)
#: ``run --profile``: ``kernel_profile``, JSON text (None without ``--profile``): the time
#: of every kernel the case launched, per step, from torch's profiler; its form is
#: :func:`tflabench.run.kernel_profile.parse_profile`'s (``docs/ARCHITECTURE.md``).
PROFILE_COLUMNS: tuple[str, ...] = ("kernel_profile",)
MODEL_COLUMNS: tuple[str, ...] = (
    "flops",
    "bytes",
    "intensity_flop_per_byte",
    "tflops_per_s",
    "roofline_ms",
    "roofline_fraction",
)
#: Columns every row written by tflabench holds (identity columns added later excepted).
REQUIRED_COLUMNS: tuple[str, ...] = tuple(
    c for c in IDENTITY_COLUMNS if c not in OPTIONAL_IDENTITY_COLUMNS) + ("status",)
#: Columns that are never null in a row (what a resume and compare match and check on).
NON_NULL_COLUMNS: tuple[str, ...] = ("case_id", "suite", "kernel", "backend", "mode", "dtype", "device", "status")
#: Every column of a row, in the order they are written.
COLUMNS: tuple[str, ...] = (
    IDENTITY_COLUMNS
    + OUTCOME_COLUMNS
    + TIMING_COLUMNS
    + MEMORY_COLUMNS
    + NUMERICS_COLUMNS
    + MODEL_COLUMNS
    + DEVICE_COLUMNS
    + GPU_TRACE_COLUMNS
    + PROFILE_COLUMNS
)
#: Columns that hold text (or JSON text) once loaded into a DataFrame.
TEXT_COLUMNS: tuple[str, ...] = (
    "case_id", "suite", "kernel", "backend", "family", "params", "mode", "dtype", "device",
    "status", "reason", "algorithm", "ms_samples", "numerics_ref", "numerics_case", "numerics_worst",
    "numerics_detail", "tf32", "gpu_index", "gpu_name", "gpu_slowdowns", "kernel_profile",
)
#: Columns that are numbers (NaN where not applicable): every other column, in order.
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)
#: Row statuses. ``ok``: measured; ``wrong``: the numerics gate failed (no timings);
#: ``crash``: the worker process died (segfault, abort); ``timeout``: past the case's
#: timeout; ``oom``: out of device memory; ``error``: the kernel raised; ``unavailable``:
#: the backend or the mode cannot run here (reason says why and what to install);
#: ``not_run``: not attempted, because the run gave its kernel up after consecutive crashes
#: or timeouts (``--max-kernel-failures``); a ``--resume`` runs it.
STATUSES: tuple[str, ...] = ("ok", "wrong", "crash", "timeout", "oom", "error", "unavailable", "not_run")
#: The modes a row may hold (a suite's ``modes``: forward, forward and backward).
ROW_MODES: tuple[str, ...] = ("fwd", "fwdbw")
#: The status of a case recorded but never attempted (a resume runs it).
NOT_RUN = "not_run"
#: Keys of ``metadata.json``.
METADATA_KEYS: tuple[str, ...] = (
    "suite",
    "suite_path",
    "suite_sha256",
    "date",
    "git_revision",
    "sources_sha256",
    "hostname",
    "gpu_name",
    "gpu_count",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "peers",
    "tflabench",
    "shard",
    "ceilings",
    "gpus_used",
)

#: The type of each ``metadata.json`` key that tflabench reads (None is allowed for all): a
#: value of another type means the file was edited or damaged, and :func:`read_metadata`
#: refuses it rather than let a reader trip over it later.
METADATA_TYPES: dict[str, type | tuple[type, ...]] = {
    "suite": str, "suite_path": str, "suite_sha256": str, "date": str, "git_revision": str, "sources_sha256": str,
    "hostname": str, "gpu_name": str, "gpu_count": int, "driver": str, "cuda": str, "torch": str,
    "triton": str, "python": str, "cpu": str, "peers": dict, "tflabench": str, "shard": str,
    "ceilings": dict, "device": str, "gpus": list, "compare": dict, "only": list, "measurement": dict,
    "resumed": list, "merged_from": list, "shards_missing": list, "shards_incomplete": list,
    "case_ids": list, "git_commit_date": str,
}

#: Fields of a ``measurement``'s ``timing`` / ``numerics`` (``metadata.json``) that do not
#: change what ``run`` measures: the time limit of a case, and the grid of ``tflabench
#: verify`` (``numerics.verify``), which ``run`` does not use. ``--resume`` lets them change;
#: ``compare`` does not call two runs timed differently for them.
LIMIT_FIELDS: frozenset[str] = frozenset({"timeout_s", "verify"})

#: fields of a suite's ``timing`` added after result sets were first written, with the value
#: a set that does not record one was timed with (read so by :func:`recorded_timing` and
#: ``resume.differences``)
TIMING_DEFAULTS: dict = {"warmup_s": 0.0, "cuda_graph": False}
#: The JSON type of each field of ``measurement.timing`` that tflabench reads (the suite's
#: ``timing``, ``tflabench.store.suite.Timing``): :func:`metadata_problem` refuses another.
TIMING_FIELD_TYPES: dict[str, type] = {
    "warmup": float, "iterations": float, "timeout_s": float, "warmup_s": float,
    "flush_l2": bool, "sync_each": bool, "cuda_graph": bool,
}


def recorded_timing(metadata: Mapping[str, Any]) -> dict:
    """``metadata.json``'s ``measurement.timing`` (the suite's ``timing`` a set was measured
    with), a field the set predates read as :data:`TIMING_DEFAULTS`; {} where the set has
    no timing record."""
    measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
    timing = measurement.get("timing") if isinstance(measurement, Mapping) else None
    return {**TIMING_DEFAULTS, **timing} if isinstance(timing, Mapping) else {}


def timing_text(metadata: Mapping[str, Any]) -> str:
    """How a result set's cases were timed, in words (:func:`recorded_timing`), e.g.
    "median of 30 replays of one captured CUDA graph, after 10 warm-up calls";
    "not recorded" where the set has no timing record."""
    t = recorded_timing(metadata)
    if not t:
        return "not recorded"
    how = ("replays of one captured CUDA graph" if t.get("cuda_graph")
           else "calls, each after a synchronise" if t.get("sync_each") else "calls queued back to back")
    text = f"median of {t.get('iterations', '?')} {how}, after {t.get('warmup', '?')} warm-up calls"
    if t.get("warmup_s"):
        text += f" and {t['warmup_s']:g} s of them"
    if t.get("flush_l2"):
        text += ", L2 flushed before each"
    return text

ROWS_FILE = "rows.jsonl"
PARQUET_FILE = "results.parquet"
CSV_FILE = "results.csv"
METADATA_FILE = "metadata.json"
#: Where torn or unreadable lines of ``rows.jsonl`` are moved (one JSON record per line:
#: ``date``, ``line``, ``why``, ``text``) before a resumed run appends.
SET_ASIDE_FILE = "rows.jsonl.set-aside"
#: The lock file of a result set being written (owner's pid, host, start, command).
LOCK_FILE = ".lock"
#: Longest suite name (it becomes a directory name).
NAME_MAX_CHARS = 128
#: Largest file of rows a result set may hold (``rows.jsonl``, its table, the set-aside
#: file), in bytes: far above what a suite of ``max_cases`` 10,000 cases writes at its
#: iteration counts, and a bound on what reading a set from elsewhere costs
#: (docs/result-sets.md, "Result sets from elsewhere").
MAX_ROWS_FILE_BYTES = 2**31
#: Largest ``metadata.json`` (and ``.lock``) read, in bytes.
MAX_METADATA_BYTES = 64 * 2**20
#: How deep :func:`check_set_files` looks into a set's directories (``plots/``, ``logs/``).
SET_DEPTH = 3


@dataclasses.dataclass
class ResultSet:
    """A loaded result set.

    Attributes:
        rows: pandas DataFrame with exactly the columns of :data:`COLUMNS` (numeric columns
            as float64 with NaN where not applicable; ``params``, ``ms_samples`` as JSON text).
        metadata: the parsed ``metadata.json`` (empty dict when the file is absent).
        path: the result-set directory.
        warnings: lines skipped while loading and why (empty for an intact set).
    """

    rows: Any
    metadata: dict
    path: Path
    #: One line each: what was skipped while loading (a torn last line of a killed run).
    warnings: list[str] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------- rows


def params_json(params: Mapping[str, Any]) -> str:
    """The canonical JSON text of a parameter dict (sorted keys, compact): the ``params`` column."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)


def case_id(identity: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit hash of a case's identity columns (all of
    :data:`IDENTITY_COLUMNS` except ``case_id``; ``params`` may be a dict or its JSON text).

    The same case in two runs (or two shards) has the same id; ``--resume``, ``compare``
    and ``merge`` match rows by it. Missing identity keys count as None.
    """
    parts = {}
    for col in IDENTITY_COLUMNS[1:]:
        value = identity.get(col)
        if col == "params" and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if col == "params" and isinstance(value, Mapping):
            value = params_json(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, float) and math.isnan(value):
            value = None
        if value is None and col in OPTIONAL_IDENTITY_COLUMNS:
            continue
        parts[col] = value
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_row(**identity: Any) -> dict:
    """A complete row: the identity columns given (``params`` as dict or JSON text), every
    other column None, ``case_id`` computed. Unknown keys raise ValueError.
    """
    unknown = set(identity) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    row = {col: None for col in COLUMNS}
    row.update(identity)
    if isinstance(row["params"], Mapping):
        row["params"] = params_json(row["params"])
    row["case_id"] = case_id(row)
    return row


def complete_row(row: Mapping[str, Any]) -> dict:
    """``row`` with every column of :data:`COLUMNS` present (missing ones None), in order;
    ``case_id`` filled when absent. Extra keys raise ValueError."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    out = {col: row.get(col) for col in COLUMNS}
    if isinstance(out["params"], Mapping):
        out["params"] = params_json(out["params"])
    if isinstance(out["ms_samples"], (list, tuple)):
        out["ms_samples"] = json.dumps([float(x) for x in out["ms_samples"]])
    if isinstance(out["kernel_profile"], Mapping):
        out["kernel_profile"] = json.dumps(out["kernel_profile"], sort_keys=True)
    if isinstance(out["gpu_index"], float) and math.isnan(out["gpu_index"]):
        out["gpu_index"] = None
    elif out["gpu_index"] is not None and not isinstance(out["gpu_index"], str):
        out["gpu_index"] = str(out["gpu_index"])  # an index given as a number
    if not out["case_id"]:
        out["case_id"] = case_id(out)
    return out


def fill_model_columns(
    row: dict, flops_per_s: float | None = None, bytes_per_s: float | None = None
) -> dict:
    """Fill the derived model columns of ``row`` in place (and return it).

    From ``flops`` and ``bytes`` (analytic counts, set by the backend):
    ``intensity_flop_per_byte = flops / bytes``; with ``ms_median``:
    ``tflops_per_s = flops / (ms_median * 1e-3) / 1e12``; with the ceilings
    ``flops_per_s`` (FLOP/s) and ``bytes_per_s`` (byte/s): the roofline bound
    ``roofline_ms = max(flops / flops_per_s, bytes / bytes_per_s) * 1e3`` (the paper's
    runtime model, App. G eq. 112) and ``roofline_fraction = roofline_ms / ms_median``.
    Columns whose inputs are missing stay None. The arithmetic is
    :func:`tflabench.model.place_on_roofline`'s.
    """
    flops, nbytes, ms = number(row.get("flops")), number(row.get("bytes")), number(row.get("ms_median"))
    if flops is None:
        return row
    placed = place_on_roofline(flops, nbytes, ms, peak_flops_per_s=flops_per_s, beta=bytes_per_s)
    for column, key, scale in (("intensity_flop_per_byte", "intensity_flop_per_byte", 1.0),
                               ("tflops_per_s", "achieved_flops_per_s", 1e-12),
                               ("roofline_ms", "roofline_ms", 1.0), ("roofline_fraction", "fraction", 1.0)):
        if key in placed:
            row[column] = placed[key] * scale
    return row


def number(value: Any) -> float | None:
    """A cell of a result row as a float; None when it is missing, not a number, NaN or
    +-inf. The one parser of numeric cells (rows come from JSON, pandas or CSV): a
    non-finite value is never a measurement or a count (rows store NaN and inf as null),
    so a quantity derived from one stays empty rather than becoming inf or NaN."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def case_label(record: Mapping[str, Any], *, shape_only: bool = False) -> str:
    """The one short label of a case, from a result row or a :class:`tflabench.store.suite.Case`'s
    identity: ``kernel mode dtype B8 S8192 NH8 d256/512 L128`` and, for a ``tflabench
    verify`` row, its case (``f_closed+init``). Parts whose columns are empty are left out
    (``d?/512`` where one head dimension is unknown). ``shape_only``: the shape part alone
    (``B8 S8192 NH8 d256/512 L128``), for tables whose other columns name kernel and mode."""
    def text(column: str) -> str | None:
        value = record.get(column)
        return value if isinstance(value, str) and value else None

    def whole(column: str) -> str | None:
        value = number(record.get(column))
        return None if value is None else str(int(value))

    parts = [] if shape_only else [text("kernel") or text("backend") or "?", text("mode"), text("dtype")]
    parts += [f"{prefix}{whole(column)}" if whole(column) else None
              for column, prefix in (("batch", "B"), ("seq_len", "S"), ("heads", "NH"))]
    if whole("d_qk") or whole("d_hv"):
        parts.append(f"d{whole('d_qk') or '?'}/{whole('d_hv') or '?'}")
    parts.append(f"L{whole('chunk_size')}" if whole("chunk_size") else None)
    if not shape_only:
        parts.append(text("numerics_case"))
    return " ".join(p for p in parts if p)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        try:
            return _json_safe(value.item())
        except (TypeError, ValueError):
            pass
    return value


# --------------------------------------------------------------------------- writing


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class ResultWriteError(UserError):
    """A result-set file could not be written (full disk, no permission, read-only file
    system). What was written before it is intact; the message says which file, why, and
    how to go on."""


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written (raises OSError)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:  # file systems that cannot fsync (EINVAL) are not an error
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        _fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Write ``path`` whole or not at all, never through a link: the one way tflabench
    writes a file into a result set (rows, table, metadata, figures, a merge).

    ``write(tmp)`` fills a temporary file beside ``path`` (``.<name>.<pid>.<random>.tmp``,
    created here exclusively and without following links, so a link planted under that
    name is never written through), which is fsynced and renamed over ``path``: a link at
    ``path`` is replaced, not followed. A run killed mid-write leaves the old file (or
    none) and a stale temporary file, which :func:`remove_stale_temporaries` deletes.
    Raises :class:`ResultWriteError`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            _fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise ResultWriteError(f"cannot write {path}: {io_reason(exc)}; free space or fix the "
                               "directory's permissions, then write it again") from None
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


_atomic_write = atomic_write


def install_file(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Copy the file ``source`` (a figure drawn in a scratch directory) to ``target``
    through :func:`atomic_write`: a link at ``target`` is replaced, never written through.
    ``target``'s directory is created where missing and must not be a link. Returns
    ``target``. Raises :class:`ResultWriteError`."""
    import shutil

    target = Path(target)
    real_directory(target.parent)
    return atomic_write(target, lambda tmp: shutil.copyfile(source, tmp))


def real_directory(directory: str | os.PathLike) -> Path:
    """``directory``, created where missing; raises :class:`ResultWriteError` when it (the
    last component) is a symbolic link or not a directory, so that nothing is written
    through a link planted in a set (``plots/``, ``logs/``)."""
    import stat as _stat

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        raise ResultWriteError(f"cannot create {directory}: {io_reason(exc)}; choose a writable directory") from None
    if not _stat.S_ISDIR(st.st_mode):
        raise ResultWriteError(f"{directory} is a {file_kind(st.st_mode)}, not a directory; nothing is written "
                               "through it: remove it, or write elsewhere (--out)")
    return directory


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files (``.<name>.<pid>.tmp``) that a run killed inside
    :func:`_atomic_write` left in ``directory``. Call only while holding its
    :class:`ResultSetLock`. Returns the paths removed."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        if tmp.name.startswith(LOCK_FILE + "."):
            continue  # a lock being taken (ResultSetLock's own temporary)
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def _row_line(row: Mapping[str, Any]) -> bytes:
    return (json.dumps({k: _json_safe(v) for k, v in row.items()}) + "\n").encode("utf-8")


class RowWriter:
    """Appends rows to ``<directory>/rows.jsonl``, one whole JSON line each, fsynced per
    row, so that a killed run keeps every row written so far and nothing else.

    Usage::

        with RowWriter(directory) as w:
            w.append(row)          # row: dict with keys from COLUMNS (missing -> None)

    The file is opened for appending: resuming a run appends to the existing file, after
    :func:`repair_rows` has set aside a torn last line (``set_aside`` lists what was moved).
    A failed write (full disk, I/O error) is cut back off the file, so the file still ends
    in a whole line, and raises :class:`ResultWriteError`. The caller holds the set's
    :class:`ResultSetLock`.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / ROWS_FILE
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.set_aside: list[str] = repair_rows(self.directory)
            created = not self.path.exists()
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError as exc:
            raise ResultWriteError(f"cannot write {self.path}: {io_reason(exc)}; choose a writable "
                                   "output directory (--out) or fix its permissions") from None
        if created:
            _fsync_dir(self.directory)
        self.rows_written = 0

    def append(self, row: Mapping[str, Any]) -> dict:
        """Write one row (completed with :func:`complete_row`) as one line, fsynced; returns
        the written row. Raises :class:`ResultWriteError` (the file keeps its earlier rows)."""
        full = complete_row(row)
        data = _row_line(full)
        if self._fd is None:
            raise ValueError("RowWriter is closed")
        start = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, data)
            _fsync(self._fd)
        except OSError as exc:
            try:  # a partial line must not stay: cut the file back to its last whole row
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise ResultWriteError(
                f"cannot write {self.path}: {io_reason(exc)}; the rows written before it are kept "
                "(this case's measurement is lost); free space, then finish the run with --resume "
                f"{self.directory}") from None
        self.rows_written += 1
        return full

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_metadata(directory: str | os.PathLike, metadata: Mapping[str, Any]) -> Path:
    """Write ``metadata.json`` (keys of :data:`METADATA_KEYS`, missing ones null, extra
    keys kept) through a temporary file and a rename. Returns its path. Raises
    :class:`ResultWriteError`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {key: metadata.get(key) for key in METADATA_KEYS}
    meta.update({k: v for k, v in metadata.items() if k not in meta})
    text = json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n"
    return _atomic_write(directory / METADATA_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def rows_frame(rows: Iterable[Mapping[str, Any]]):
    """A pandas DataFrame of ``rows`` with exactly :data:`COLUMNS` and numeric columns as
    float64 (NaN where not applicable)."""
    import pandas as pd

    frame = pd.DataFrame([complete_row(r) for r in rows], columns=list(COLUMNS))
    return _normalise_frame(frame)


def _normalise_frame(frame):
    import pandas as pd

    for col in COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    frame = frame[list(COLUMNS)].copy()
    for col in NUMERIC_COLUMNS:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    for col in TEXT_COLUMNS:
        frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    return frame.reset_index(drop=True)


def _write_table(directory: Path, frame) -> Path:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return _atomic_write(directory / CSV_FILE, lambda tmp: frame.to_csv(tmp, index=False))
    return _atomic_write(directory / PARQUET_FILE, lambda tmp: frame.to_parquet(tmp, index=False))


def write_results(
    directory: str | os.PathLike,
    rows: Iterable[Mapping[str, Any]],
    metadata: Mapping[str, Any],
) -> Path:
    """Write a complete result set into ``directory`` (created if needed): ``rows.jsonl``
    (replaced), ``results.parquet`` (``results.csv`` without pyarrow) and ``metadata.json``,
    each through a temporary file and a rename.

    Args:
        rows: dicts with keys from :data:`COLUMNS` (missing ones None; ``case_id`` computed
            when absent; ``params`` as dict or JSON text; ``ms_samples`` as list or JSON text).
        metadata: run metadata (keys of :data:`METADATA_KEYS`).

    Returns the directory. Raises ValueError for unknown row columns,
    :class:`ResultWriteError` when a file cannot be written.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultWriteError(f"cannot create {directory}: {io_reason(exc)}; choose a writable directory") from None
    full = [complete_row(r) for r in rows]
    data = b"".join(_row_line(row) for row in full)
    _atomic_write(directory / ROWS_FILE, lambda tmp: tmp.write_bytes(data))
    _write_table(directory, rows_frame(full))
    write_metadata(directory, metadata)
    return directory


def finalize(directory: str | os.PathLike) -> Path:
    """Write ``results.parquet`` (or ``.csv``) from ``rows.jsonl`` at the end of a run,
    through a temporary file and a rename (a run killed here keeps the previous table or
    none; ``load_results`` reads ``rows.jsonl`` either way).

    When a case appears more than once (a resumed run that re-measured it), the last row
    wins. A torn last line is left out. Returns the table's path.
    """
    directory = Path(directory)
    rows = _scan_rows(directory / ROWS_FILE).rows
    return _write_table(directory, rows_frame(_last_per_case(rows)))


def _last_per_case(rows: list[dict]) -> list[dict]:
    seen: dict[str, dict] = {}
    for row in rows:
        seen[row.get("case_id") or case_id(row)] = row
    return list(seen.values())


# --------------------------------------------------------------------------- torn lines


@dataclasses.dataclass
class _Scan:
    """``rows.jsonl`` read leniently: the rows, the text of each whole row line (bytes,
    newline included), and the pieces that are not rows: (line number, why, text,
    fatal). ``fatal``: a line in the middle that no crash of a writer explains."""

    rows: list[dict]
    kept: list[bytes]
    bad: list[tuple[int, str, str, bool]]
    #: The line number of each row of ``rows``.
    linenos: list[int] = dataclasses.field(default_factory=list)


_ROW_START = b'{"case_id"'


def _scan_rows(path: Path) -> _Scan:
    """Read ``rows.jsonl`` line by line, telling rows from what a killed writer leaves:

    - a last line without its newline that is not a JSON object: a torn row (a run died
      while writing it);
    - a line whose tail is a whole row (``{"case_id"...``) glued onto a torn row (what a
      resumed run of an earlier tflabench wrote after a torn line): the row is kept, the
      torn head set aside;
    - any other line that is not a JSON object: ``fatal`` (the file was edited or damaged).

    Trailing NUL bytes (a file system that lost the end of a file on power loss) count as
    part of the torn last line. Empty lines are dropped.
    """
    scan = _Scan(rows=[], kept=[], bad=[])
    path = Path(path)
    if not path.exists():
        return scan
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not the file of result rows; the result set is damaged "
                        "(move that directory away)")
    data = read_bytes(path, str(path), what="the file of result rows", limit=MAX_ROWS_FILE_BYTES,
                      follow_links=False)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in a newline
    for lineno, raw in enumerate(lines, 1):
        _scan_line(scan, lineno, raw, last=False)
    _scan_line(scan, len(lines) + 1, tail, last=True)
    return scan


def _parse_row(raw: bytes) -> dict | None:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # nested too deeply: not a row
        return None
    return obj if isinstance(obj, dict) else None


def _scan_line(scan: _Scan, lineno: int, raw: bytes, last: bool) -> None:
    stripped = raw.strip(b"\x00 \t\r")
    if not stripped:
        return
    row = _parse_row(stripped)
    if row is not None:
        scan.rows.append(row)
        scan.kept.append(stripped + b"\n")
        scan.linenos.append(lineno)
        return
    text = raw.rstrip(b"\x00").decode("utf-8", errors="replace")  # set aside as it was
    start = stripped.rfind(_ROW_START)
    glued = _parse_row(stripped[start:]) if start > 0 else None
    if glued is not None:
        scan.rows.append(glued)
        scan.kept.append(stripped[start:] + b"\n")
        scan.linenos.append(lineno)
        scan.bad.append((lineno, "a torn row with a whole row appended to it (the whole row is kept)",
                         stripped[:start].decode("utf-8", errors="replace"), False))
    elif last:
        scan.bad.append((lineno, "a torn last row (a run died while writing it)", text, False))
    else:
        scan.bad.append((lineno, "not a JSON row", text, True))


def row_problem(row: Mapping[str, Any]) -> str | None:
    """Why ``row`` (one parsed line of ``rows.jsonl``) is not a result row, or None: a key
    that is not a column, an identity column or ``status`` missing (every row is written
    whole), one of :data:`NON_NULL_COLUMNS` null, a text column holding something else than text, a numeric column holding
    something else than a (finite) number, an unknown ``status`` or ``mode`` (:data:`ROW_MODES`)."""
    for key in REQUIRED_COLUMNS:
        if key not in row:
            return f"lacks the field {key!r}, which every result row has"
        if row[key] is None and key in NON_NULL_COLUMNS:
            return f"has no value for {key!r}, which every result row has"
    for key, value in row.items():
        if key not in COLUMNS:
            return f"has the field {str(key)[:60]!r}, which is not a result column"
        if value is None:
            continue
        if key == "ms_samples" and isinstance(value, list):
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) or x is None for x in value):
                return "has ms_samples that are not all numbers"
            if not all(x is None or math.isfinite(x) for x in value):
                return "has ms_samples that are not all finite numbers"
        elif key == "params" and isinstance(value, dict):
            continue
        elif key in TEXT_COLUMNS:
            if not isinstance(value, str):
                return f"has {key} = {str(value)[:40]!r}, not text"
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"has {key} = {str(value)[:40]!r}, not a number"
        elif isinstance(value, int) and abs(value) > 2**63:
            return f"has {key} = {str(value)[:40]}, out of range"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"has {key} = {value}, not a finite number (tflabench writes null where there is none)"
    status = row.get("status")
    if status is not None and status not in STATUSES:
        return f"has status {str(status)[:40]!r}, not one of {', '.join(STATUSES)}"
    mode = row.get("mode")
    if mode is not None and mode not in ROW_MODES:
        return f"has mode {str(mode)[:40]!r}, not one of {', '.join(ROW_MODES)}"
    return None


def check_rows(path: str | os.PathLike, scan: "_Scan", before: int | None = None) -> None:
    """Raise UserError naming the first line of ``scan`` (read from ``path``; only lines
    before ``before`` when given) that is JSON but not a result row (:func:`row_problem`):
    the file was edited or written by another tool, and neither loading nor a resume can
    tell what it measured."""
    for lineno, row in zip(scan.linenos, scan.rows):
        if before is not None and lineno > before:
            break
        problem = row_problem(row)
        if problem:
            raise UserError(f"{path}: line {lineno} {problem}; the file was edited or damaged: fix or delete "
                            "that line")


def repair_rows(directory: str | os.PathLike) -> list[str]:
    """Make ``<directory>/rows.jsonl`` whole lines only before a run appends to it: every
    piece :func:`_scan_rows` finds that is not a row (a torn last line, a torn head glued to
    a row, an unreadable line) is appended to ``rows.jsonl.set-aside`` (one JSON record:
    ``date``, ``line``, ``why``, ``text``), then ``rows.jsonl`` is rewritten with the whole
    rows (temporary file and rename). Call only while holding the set's
    :class:`ResultSetLock`.

    Returns one line per piece set aside (empty when the file was whole).
    """
    directory = Path(directory)
    path = directory / ROWS_FILE
    scan = _scan_rows(path)
    if not scan.bad:
        if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            # a whole last row that lost only its newline: give it one
            _atomic_write(path, lambda tmp: tmp.write_bytes(b"".join(scan.kept)))
        return []
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    records = b"".join(
        (json.dumps({"date": now, "line": lineno, "why": why, "text": text}) + "\n").encode("utf-8")
        for lineno, why, text, _ in scan.bad)
    aside = directory / SET_ASIDE_FILE
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as exc:
        raise ResultWriteError(f"cannot write {aside}: {io_reason(exc)}; it must be a regular file") from None
    try:
        _write_all(fd, records)
        _fsync(fd)
    finally:
        os.close(fd)
    _atomic_write(path, lambda tmp: tmp.write_bytes(b"".join(scan.kept)))
    return [f"{path}: line {lineno} is {why}: set aside into {aside}" for lineno, why, _, _ in scan.bad]


# --------------------------------------------------------------------------- names and locks


_PLAIN_NAME = re.compile(r"\w[\w.+-]*", re.ASCII)


def check_plain_name(value: str, what: str = "suite name", becomes: str = "a directory name") -> str:
    """``value`` when it is a plain file name: ASCII letters, digits, ``_``, ``-``, ``.``,
    ``+``, starting with a letter, digit or ``_``, at most :data:`NAME_MAX_CHARS` characters (so no
    path separator, no ``..``, no hidden name). A suite name becomes the directory
    ``<out>/<name>/``; a plain name cannot point anywhere else.

    Raises UserError naming what is wrong and what is allowed."""
    if not isinstance(value, str) or not value:
        raise UserError(f"{what} is empty; use a plain name such as my_suite")
    if "/" in value or "\\" in value:
        why = "contains a path separator"
    elif ".." in value:
        why = "contains '..'"
    elif len(value) > NAME_MAX_CHARS:
        why = f"is {len(value)} characters long (at most {NAME_MAX_CHARS})"
    elif not _PLAIN_NAME.fullmatch(value):
        why = "is not a plain name"
    else:
        return value
    raise UserError(f"{what} {value[:120]!r} {why}; it becomes {becomes}, so use ASCII letters, "
                    "digits, '_', '-', '.' and '+' only (e.g. my_suite)")


def new_result_directory(root: str | os.PathLike, suite: str, now: _dt.datetime | None = None) -> Path:
    """``<root>/<suite>/<YYYYmmdd-HHMMSS>/`` (created; a suffix ``-2``, ``-3``... when taken,
    also by a run starting at the same second).

    Raises UserError when ``suite`` is not a plain name (:func:`check_plain_name`), and
    :class:`ResultWriteError` when the directory cannot be created (naming ``root``)."""
    check_plain_name(suite)
    now = now or _dt.datetime.now()
    root = Path(root)
    base = root / suite / now.strftime("%Y%m%d-%H%M%S")
    if not base.resolve().is_relative_to(root.resolve()):  # a symlinked name cannot escape
        raise UserError(f"suite name {suite!r} resolves outside {str(root)!r}; use a plain name")
    n = 1
    while True:
        directory = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            directory.mkdir(parents=True)
            return directory
        except FileExistsError:
            n += 1
        except OSError as exc:
            raise ResultWriteError(f"cannot create a result set under {str(root)!r}: {io_reason(exc)}; "
                                   "choose a writable --out directory") from None


def _command_line() -> str:
    """This process's command line as a user typed it (``python -m tflabench`` shows as
    ``tflabench``), at most 300 characters."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":
        program = "tflabench"
    return " ".join([program] + sys.argv[1:])[:300]


class ResultSetLock:
    """The lock of a result set being written: at most one run writes a result set at a time.

    The lock is an OS file lock (``flock``, exclusive) on the file ``<directory>/.lock``,
    held on an open descriptor while the run writes. The kernel drops it when the owner
    exits, however it ends (SIGKILL, the OOM killer), so a stale lock is free at once and a
    live one cannot be taken over, also not by a process in another PID namespace of the
    same host. The file says who holds it (JSON: ``pid``, ``host``, ``started``,
    ``command``, ``token``), for the message that refuses a second run. A lock file whose
    owner was on another host (the set lies on a shared file system where locks may not
    reach across hosts) is refused: delete it when that run is known to be gone. A lock
    left by a run that is gone (a run killed with SIGKILL) is taken over, and :attr:`note`
    says so.

    Usage: ``with ResultSetLock(directory) as lock: ...`` or :meth:`acquire` /
    :meth:`release`.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.note: str | None = None
        self._token: str | None = None
        self._fd: int | None = None

    def _owner(self) -> dict | None:
        try:
            owner = json.loads(read_text(self.path, str(self.path), limit=MAX_METADATA_BYTES, follow_links=False))
        except UserError:
            return None if not os.path.lexists(self.path) else {}
        except (ValueError, RecursionError):
            return {}
        return owner if isinstance(owner, dict) else {}

    def _flocked(self) -> bool:
        """Whether a live process holds the OS lock on ``.lock`` now."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken here
        return False

    def held(self) -> bool:
        """Whether another run may be writing the set now: a live process holds its lock,
        or its lock file names another host (which cannot be checked from here)."""
        if self._flocked():
            return True
        owner = self._owner()
        return bool(owner) and owner.get("host") not in (None, socket.gethostname())

    def acquire(self) -> "ResultSetLock":
        """Take the lock. Raises UserError when another live run holds it (or a lock file of
        another host is there), and :class:`ResultWriteError` when the directory is not
        writable."""
        import fcntl

        token = uuid.uuid4().hex
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UserError(f"{self.path} is a symbolic link; a result set holds plain files only: "
                                    "remove it") from None
                raise ResultWriteError(f"cannot lock result set {self.directory}: {io_reason(exc)}; "
                                       "choose a writable output directory (--out) or fix its permissions") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise UserError(self._held_message(self._owner() or {})) from None
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except OSError:
                same = False
            if not same:  # released (and removed) between our open and our lock: again
                os.close(fd)
                continue
            break
        else:  # pragma: no cover - lost the race twenty times
            raise UserError(f"result set {self.directory} is being locked by another run; try again")
        owner = self._owner()
        if owner and owner.get("host") not in (None, socket.gethostname()):
            os.close(fd)
            raise UserError(self._held_message(owner))
        if owner:
            self.note = (f"{self.directory}: took over the lock of pid {owner.get('pid', '?')} "
                         f"(started {owner.get('started', '?')}), which no longer runs; "
                         "its run was killed before it could finish")
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "command": _command_line(), "token": token}
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)  # a few hundred bytes: one write
            _fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise ResultWriteError(f"cannot lock result set {self.directory}: {io_reason(exc)}; "
                                   "free space or fix the directory's permissions") from None
        self._fd, self._token = fd, token
        _fsync_dir(self.directory)
        return self

    def _held_message(self, owner: dict) -> str:
        who = (f"pid {owner.get('pid')} on host {owner.get('host')}, started {owner.get('started')}"
               + (f": {owner['command']}" if owner.get("command") else ""))
        if owner.get("host") in (None, socket.gethostname()):
            how = "wait for it to finish, or run without --resume to start a new result set"
        else:
            how = f"if that run is gone, delete {self.path}; otherwise wait for it"
        return f"result set {self.directory} is being written by another run ({who}); {how}"

    def release(self) -> None:
        """Remove the lock file (still holding the lock, so no other run is between) and
        drop the lock."""
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_ino == os.lstat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd, self._token = None, None

    def __enter__(self) -> "ResultSetLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# --------------------------------------------------------------------------- reading


def _read_jsonl(path: Path, warnings: list[str] | None = None) -> list[dict]:
    """The rows of ``rows.jsonl``. A torn last line (a killed run) is skipped and described
    in ``warnings``; any other line that is not a JSON object raises UserError."""
    scan = _scan_rows(Path(path))
    first_fatal = min((lineno for lineno, _, _, fatal in scan.bad if fatal), default=None)
    check_rows(path, scan, before=first_fatal)
    for lineno, why, _text, fatal in scan.bad:
        if fatal:
            raise UserError(
                f"{path}: line {lineno} is not JSON; `tflabench run SUITE --resume {Path(path).parent}` "
                f"sets such lines aside into {SET_ASIDE_FILE}, or delete the line")
        if warnings is not None and ResultSetLock(Path(path).parent).held():
            warnings.append(f"{path}: line {lineno} is not whole yet: skipped (a run holds "
                            f"{Path(path).parent / LOCK_FILE} and may be writing it now)")
        elif warnings is not None:
            warnings.append(f"{path}: line {lineno} is {why}: skipped; `tflabench run SUITE --resume "
                            f"{Path(path).parent}` sets it aside into {SET_ASIDE_FILE}")
    return scan.rows


def resolve_directory(path: str | os.PathLike) -> Path:
    """The result-set directory for ``path`` (the directory itself or one of its files).
    Raises UserError when it does not exist or holds no rows."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"results path {str(p)!r} does not exist")
    directory = p if p.is_dir() else p.parent
    if not any((directory / f).exists() for f in (ROWS_FILE, PARQUET_FILE, CSV_FILE)):
        raise UserError(
            f"{str(directory)!r} is not a result set (no {ROWS_FILE}, {PARQUET_FILE} or {CSV_FILE})"
        )
    return directory


def check_set_files(directory: str | os.PathLike) -> None:
    """Refuse a result set that holds a symbolic link or a file that is not a regular file
    (a FIFO, a device, a socket) anywhere in it (down to :data:`SET_DEPTH` levels), or a
    table larger than :data:`MAX_ROWS_FILE_BYTES`: a set from elsewhere (a CI artifact, a
    colleague's run) is read only as the plain files tflabench writes, and nothing is
    written through it (docs/result-sets.md, "Result sets from elsewhere"). The directory
    itself may be reached through a link the user named.

    Raises UserError naming the path and what it is."""
    import stat as _stat

    fix = "a result set holds plain files only: remove it, or copy the set without links"
    pending = [(Path(directory), 0)]
    while pending:
        folder, depth = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise UserError(f"{folder}: cannot be read ({io_reason(exc)})") from None
        for entry in entries:
            path = Path(entry.path)
            try:
                st = os.lstat(path)
            except OSError as exc:
                raise UserError(f"{path}: cannot be read ({io_reason(exc)})") from None
            if _stat.S_ISDIR(st.st_mode):
                if depth + 1 < SET_DEPTH:
                    pending.append((path, depth + 1))
            elif not _stat.S_ISREG(st.st_mode):
                raise UserError(f"{path}: is a {file_kind(st.st_mode)} inside a result set; {fix}")
            elif entry.name in (PARQUET_FILE, CSV_FILE) and depth == 0 and st.st_size > MAX_ROWS_FILE_BYTES:
                raise UserError(f"{path}: {st.st_size} bytes, more than the {MAX_ROWS_FILE_BYTES} bytes a table of "
                                "result rows may hold")


def read_metadata(directory: str | os.PathLike) -> dict:
    """The ``metadata.json`` of a result set as a dict (empty when the file is absent).

    Raises UserError (one line naming the file) when it is a directory, cannot be read, is
    not UTF-8 JSON, is not a JSON object, or a key of :data:`METADATA_TYPES` holds a value
    of another type."""
    path = Path(directory) / METADATA_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    fix = "the file was edited or damaged (moved away, report and compare read the rows without it; a resume needs it)"
    text = read_text(path, str(path), what="a JSON file", fix=fix, limit=MAX_METADATA_BYTES, follow_links=False)
    try:
        metadata = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({getattr(exc, 'msg', 'nested too deeply')}); {fix}") from None
    problem = metadata_problem(metadata)
    if problem:
        raise UserError(f"{path}: {problem}; {fix}")
    return metadata


def metadata_problem(metadata: Any) -> str | None:
    """Why ``metadata`` (parsed ``metadata.json``) cannot be read as a result set's
    metadata, or None: not a JSON object, or a key of :data:`METADATA_TYPES` holding a
    value of another type."""
    if not isinstance(metadata, dict):
        return f"{_json_type(metadata)}, not an object"
    for key, kind in METADATA_TYPES.items():
        value = metadata.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"{key!r} is {_json_type(value)}, not {_json_type(kind)}"
    timing = (metadata.get("measurement") or {}).get("timing")  # not an object: resume.measurement_problem
    for field, value in (timing if isinstance(timing, dict) else {}).items():
        kind = TIMING_FIELD_TYPES.get(field)
        if kind is bool and value is not None and not isinstance(value, bool):
            return f"'measurement.timing.{field}' is {_json_type(value)}, not a boolean"
        if kind is float and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                    or not math.isfinite(value)):
            return f"'measurement.timing.{field}' is {_json_type(value)}, not a finite number"
    for key in ("shards_incomplete",):  # read field by field by compare (merged_from, resumed: as given)
        for n, item in enumerate(metadata.get(key) or ()):
            if not isinstance(item, dict):
                return f"'{key}[{n}]' is {_json_type(item)}, not an object"
            for field in ("cases_missing", "cases_expected"):
                value = item.get(field)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    return f"'{key}[{n}].{field}' is {_json_type(value)}, not an integer"
    return None


def _json_type(value: Any) -> str:
    """The JSON name of a value's type (or of a Python type) with its article: an object,
    an array, a string..."""
    kind = value if isinstance(value, type) else type(value)
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(kind, f"a {kind.__name__}")


def load_results(path: str | os.PathLike) -> ResultSet:
    """Load a result set from its directory or any of its files.

    Rows come from ``rows.jsonl`` when present (the file appended as cases complete, so an
    interrupted run loads too, with or without its table; the last row per ``case_id``
    wins; a torn last line is skipped and named in ``warnings``), else from
    ``results.parquet``, else ``results.csv``. Loading changes no file.

    Returns a :class:`ResultSet`. Raises UserError when the path is missing, is not a
    result set, or a file is corrupt (a row with a field no row has, a value of the wrong
    type, metadata that is not a JSON object: :func:`row_problem`, :func:`read_metadata`).
    """
    import pandas as pd

    directory = resolve_directory(path)
    check_set_files(directory)
    warnings: list[str] = []
    try:
        if (directory / ROWS_FILE).exists():
            frame = rows_frame(_last_per_case(_read_jsonl(directory / ROWS_FILE, warnings)))
        elif (directory / PARQUET_FILE).exists():
            frame = _normalise_frame(pd.read_parquet(directory / PARQUET_FILE))
        else:
            frame = _normalise_frame(pd.read_csv(directory / CSV_FILE))
    except UserError:
        raise
    except Exception as exc:  # pyarrow / pandas parse errors
        raise UserError(f"{str(directory)!r}: cannot read result rows ({type(exc).__name__}: {exc})") from None
    metadata = read_metadata(directory)
    return ResultSet(rows=frame, metadata=metadata, path=directory, warnings=warnings)


def measured_case_ids(directory: str | os.PathLike) -> set[str]:
    """The ``case_id`` of every whole row in ``<directory>/rows.jsonl`` whose case was
    attempted (empty set when the file is absent; torn lines and ``not_run`` rows do not
    count, unless a later row of the case does); ``--resume`` skips these cases."""
    return attempted_case_ids(_scan_rows(Path(directory) / ROWS_FILE).rows)


def attempted_case_ids(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The ids of the cases ``rows`` attempted: the last row of each case (rows in file
    order) not :data:`NOT_RUN`."""
    last = {}
    for row in rows:
        last[row.get("case_id") or case_id(row)] = row.get("status")
    return {cid for cid, status in last.items() if status != NOT_RUN}
