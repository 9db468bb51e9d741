"""Result sets on disk: the one module that knows the result schema.

A result set is a directory ``results/<suite>/<YYYYmmdd-HHMMSS>/`` holding

- ``rows.jsonl``: one JSON object per case and mode, appended and flushed as each case
  completes (an interrupted run keeps what it measured; ``--resume`` reads it back);
- ``results.parquet`` (or ``results.csv`` where pyarrow is absent): the same rows, written
  when the run ends (:func:`finalize`) or by :func:`write_results`;
- ``metadata.json``: the run's environment and suite (see :data:`METADATA_KEYS`).

Source: ``docs/ARCHITECTURE.md``, "Contract: result sets". Every other module reads and
writes result sets through the functions here: :func:`new_row`, :func:`case_id`,
:class:`RowWriter`, :func:`write_results`, :func:`finalize`, :func:`load_results`,
:func:`measured_case_ids`, :func:`fill_model_columns`.

Import-light: pandas is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from tflabench.errors import UserError

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
OUTCOME_COLUMNS: tuple[str, ...] = ("status", "reason")
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
)
MEMORY_COLUMNS: tuple[str, ...] = ("peak_mem_bytes",)
#: Numerics (tflabench.numerics): ``numerics_err`` the max-normalised error of the tensor
#: that decides the verdict (largest error / budget), ``numerics_worst`` its name,
#: ``numerics_budget`` its budget, ``numerics_relf`` its relative Frobenius error,
#: ``numerics_nonfinite`` NaN/inf count where the reference is finite (all tensors),
#: ``numerics_detail`` JSON tensor -> [max_norm, rel_fro, budget, nonfinite],
#: ``numerics_ref`` the reference and shape, ``tf32`` (float32 rows) yes / no / unknown:
#: whether the kernel's dots used TF32.
NUMERICS_COLUMNS: tuple[str, ...] = (
    "numerics_err", "numerics_ref", "numerics_worst", "numerics_budget", "numerics_relf",
    "numerics_nonfinite", "numerics_detail", "tf32",
)
MODEL_COLUMNS: tuple[str, ...] = (
    "flops",
    "bytes",
    "intensity_flop_per_byte",
    "tflops_per_s",
    "roofline_ms",
    "roofline_fraction",
)
#: Every column of a row, in the order they are written.
COLUMNS: tuple[str, ...] = (
    IDENTITY_COLUMNS
    + OUTCOME_COLUMNS
    + TIMING_COLUMNS
    + MEMORY_COLUMNS
    + NUMERICS_COLUMNS
    + MODEL_COLUMNS
)
#: Columns that hold text (or JSON text) once loaded into a DataFrame.
TEXT_COLUMNS: tuple[str, ...] = (
    "case_id", "suite", "kernel", "backend", "family", "params", "mode", "dtype", "device",
    "status", "reason", "ms_samples", "numerics_ref", "numerics_case", "numerics_worst",
    "numerics_detail", "tf32",
)
#: Columns that are numbers (NaN where not applicable): every other column, in order.
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)
#: Row statuses. ``ok``: measured; ``wrong``: the numerics gate failed (no timings);
#: ``crash``: the worker process died (segfault, abort); ``timeout``: past the case's
#: timeout; ``oom``: out of device memory; ``error``: the kernel raised; ``unavailable``:
#: the backend or the mode cannot run here (reason says why and what to install).
STATUSES: tuple[str, ...] = ("ok", "wrong", "crash", "timeout", "oom", "error", "unavailable")
#: Keys of ``metadata.json``.
METADATA_KEYS: tuple[str, ...] = (
    "suite",
    "suite_path",
    "suite_sha256",
    "date",
    "git_revision",
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
)

ROWS_FILE = "rows.jsonl"
PARQUET_FILE = "results.parquet"
CSV_FILE = "results.csv"
METADATA_FILE = "metadata.json"


@dataclasses.dataclass
class ResultSet:
    """A loaded result set.

    Attributes:
        rows: pandas DataFrame with exactly the columns of :data:`COLUMNS` (numeric columns
            as float64 with NaN where not applicable; ``params``, ``ms_samples`` as JSON text).
        metadata: the parsed ``metadata.json`` (empty dict when the file is absent).
        path: the result-set directory.
    """

    rows: Any
    metadata: dict
    path: Path


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
    Columns whose inputs are missing stay None.
    """
    flops, nbytes, ms = _num(row.get("flops")), _num(row.get("bytes")), _num(row.get("ms_median"))
    if flops is not None and nbytes:
        row["intensity_flop_per_byte"] = flops / nbytes
    if flops is not None and ms:
        row["tflops_per_s"] = flops / (ms * 1e-3) / 1e12
    if flops is not None and nbytes is not None and flops_per_s and bytes_per_s:
        row["roofline_ms"] = max(flops / flops_per_s, nbytes / bytes_per_s) * 1e3
        if ms:
            row["roofline_fraction"] = row["roofline_ms"] / ms
    return row


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


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


class RowWriter:
    """Appends rows to ``<directory>/rows.jsonl``, one JSON line each, flushed and fsynced
    per row so that a killed run keeps every row written so far.

    Usage::

        with RowWriter(directory) as w:
            w.append(row)          # row: dict with keys from COLUMNS (missing -> None)

    The file is opened in append mode: resuming a run appends to the existing file.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / ROWS_FILE
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, row: Mapping[str, Any]) -> dict:
        """Write one row (completed with :func:`complete_row`); returns the written row."""
        full = complete_row(row)
        self._fh.write(json.dumps({k: _json_safe(v) for k, v in full.items()}) + "\n")
        self._fh.flush()
        try:
            os.fsync(self._fh.fileno())
        except OSError:  # pragma: no cover - e.g. some network filesystems
            pass
        return full

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_metadata(directory: str | os.PathLike, metadata: Mapping[str, Any]) -> Path:
    """Write ``metadata.json`` (keys of :data:`METADATA_KEYS`, missing ones null, extra
    keys kept). Returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {key: metadata.get(key) for key in METADATA_KEYS}
    meta.update({k: v for k, v in metadata.items() if k not in meta})
    path = directory / METADATA_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


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
        path = directory / CSV_FILE
        frame.to_csv(path, index=False)
        return path
    path = directory / PARQUET_FILE
    frame.to_parquet(path, index=False)
    return path


def write_results(
    directory: str | os.PathLike,
    rows: Iterable[Mapping[str, Any]],
    metadata: Mapping[str, Any],
) -> Path:
    """Write a complete result set into ``directory`` (created if needed): ``rows.jsonl``
    (replaced), ``results.parquet`` (``results.csv`` without pyarrow) and ``metadata.json``.

    Args:
        rows: dicts with keys from :data:`COLUMNS` (missing ones None; ``case_id`` computed
            when absent; ``params`` as dict or JSON text; ``ms_samples`` as list or JSON text).
        metadata: run metadata (keys of :data:`METADATA_KEYS`).

    Returns the directory. Raises ValueError for unknown row columns.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    full = [complete_row(r) for r in rows]
    with open(directory / ROWS_FILE, "w", encoding="utf-8") as fh:
        for row in full:
            fh.write(json.dumps({k: _json_safe(v) for k, v in row.items()}) + "\n")
    _write_table(directory, rows_frame(full))
    write_metadata(directory, metadata)
    return directory


def finalize(directory: str | os.PathLike) -> Path:
    """Write ``results.parquet`` (or ``.csv``) from ``rows.jsonl`` at the end of a run.

    When a case appears more than once (a resumed run that re-measured it), the last row
    wins. Returns the table's path.
    """
    directory = Path(directory)
    rows = _read_jsonl(directory / ROWS_FILE)
    return _write_table(directory, rows_frame(_last_per_case(rows)))


def _last_per_case(rows: list[dict]) -> list[dict]:
    seen: dict[str, dict] = {}
    for row in rows:
        seen[row.get("case_id") or case_id(row)] = row
    return list(seen.values())


# --------------------------------------------------------------------------- reading


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            # A run killed mid-write leaves at most one partial last line: skip it.
            if lineno == len(lines):
                break
            raise UserError(f"{path}: line {lineno} is not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}: line {lineno} is not a JSON object")
        rows.append(obj)
    return rows


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


def load_results(path: str | os.PathLike) -> ResultSet:
    """Load a result set from its directory or any of its files.

    Rows come from ``rows.jsonl`` when present (the file appended as cases complete, so an
    interrupted run loads too; the last row per ``case_id`` wins), else from
    ``results.parquet``, else ``results.csv``.

    Returns a :class:`ResultSet`. Raises UserError when the path is missing, is not a
    result set, or a file is corrupt.
    """
    import pandas as pd

    directory = resolve_directory(path)
    try:
        if (directory / ROWS_FILE).exists():
            frame = rows_frame(_last_per_case(_read_jsonl(directory / ROWS_FILE)))
        elif (directory / PARQUET_FILE).exists():
            frame = _normalise_frame(pd.read_parquet(directory / PARQUET_FILE))
        else:
            frame = _normalise_frame(pd.read_csv(directory / CSV_FILE))
    except UserError:
        raise
    except Exception as exc:  # pyarrow / pandas parse errors
        raise UserError(f"{str(directory)!r}: cannot read result rows ({type(exc).__name__}: {exc})") from None
    metadata: dict = {}
    meta_path = directory / METADATA_FILE
    if meta_path.exists():
        try:
            metadata = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{meta_path}: not valid JSON ({exc.msg})") from None
        if not isinstance(metadata, dict):
            raise UserError(f"{meta_path}: not a JSON object")
    return ResultSet(rows=frame, metadata=metadata, path=directory)


def measured_case_ids(directory: str | os.PathLike) -> set[str]:
    """The ``case_id`` of every row already in ``<directory>/rows.jsonl`` (empty set when
    the file is absent); ``--resume`` skips these cases."""
    path = Path(directory) / ROWS_FILE
    if not path.exists():
        return set()
    return {row.get("case_id") or case_id(row) for row in _read_jsonl(path)}


def new_result_directory(root: str | os.PathLike, suite: str, now: _dt.datetime | None = None) -> Path:
    """``<root>/<suite>/<YYYYmmdd-HHMMSS>/`` (created; a suffix ``-2``, ``-3``... when taken)."""
    now = now or _dt.datetime.now()
    base = Path(root) / suite / now.strftime("%Y%m%d-%H%M%S")
    directory, n = base, 1
    while directory.exists():
        n += 1
        directory = base.with_name(f"{base.name}-{n}")
    directory.mkdir(parents=True)
    return directory
