"""Result sets on disk: the set as a whole, its files and their rows.

A result set is a directory ``results/<suite>/<YYYYmmdd-HHMMSS>/`` holding

- ``rows.jsonl``: one JSON object per case and mode, appended and flushed as each case
  completes (an interrupted run keeps what it measured; ``--resume`` reads it back);
- ``results.parquet`` (or ``results.csv`` where pyarrow is absent): the same rows, written
  when the run ends (:func:`finalize`) or by :func:`write_results`;
- ``metadata.json``: the run's environment and suite (see
  :data:`tflabench.store.schema.METADATA_KEYS`).

Crash safety (``docs/harness.md``, "Crash safety"): a row is one complete line or absent
(:class:`RowWriter` writes whole lines, fsynced, and cuts a failed write back off); the
table and ``metadata.json`` are written to a temporary file and renamed
(:func:`tflabench.store.files.atomic_write`); a torn last line left by a killed run is
skipped with a warning on load and set aside into ``rows.jsonl.set-aside`` before a resumed
run appends (:func:`repair_rows`); one run at a time writes a result set
(:class:`tflabench.store.lock.ResultSetLock`).

Source: ``docs/ARCHITECTURE.md``, "Contract: result sets". Every other module reads and
writes result sets through the functions here: :class:`RowWriter`, :func:`write_results`,
:func:`finalize`, :func:`load_results`, :func:`measured_case_ids`, :func:`repair_rows`,
:func:`new_result_directory`; what a row holds is :mod:`tflabench.store.schema`'s.

Import-light: pandas is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from tflabench.errors import UserError, file_kind, io_reason, read_bytes, read_text
from tflabench.store import files
from tflabench.store.files import ResultWriteError, atomic_write, check_plain_name
from tflabench.store.lock import LOCK_FILE, ResultSetLock
from tflabench.store.schema import (
    METADATA_KEYS, NOT_RUN, case_id, complete_row, metadata_problem, normalise_frame, row_problem, rows_frame,
)

ROWS_FILE = "rows.jsonl"
PARQUET_FILE = "results.parquet"
CSV_FILE = "results.csv"
METADATA_FILE = "metadata.json"
#: Where torn or unreadable lines of ``rows.jsonl`` are moved (one JSON record per line:
#: ``date``, ``line``, ``why``, ``text``) before a resumed run appends.
SET_ASIDE_FILE = "rows.jsonl.set-aside"
#: How deep :func:`check_set_files` looks into a set's directories (``plots/``, ``logs/``).
SET_DEPTH = 3


@dataclasses.dataclass
class ResultSet:
    """A loaded result set.

    Attributes:
        rows: pandas DataFrame with exactly the columns of :data:`tflabench.store.schema.COLUMNS` (numeric columns
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


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files (``.<name>.<pid>.tmp``) that a run killed inside
    :func:`tflabench.store.files.atomic_write` left in ``directory``. Call only while holding its
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
            self._fd: int | None = files.open_append(self.path)
        except OSError as exc:
            raise ResultWriteError(f"cannot write {self.path}: {io_reason(exc)}; choose a writable "
                                   "output directory (--out) or fix its permissions") from None
        if created:
            files.fsync_dir(self.directory)
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
            files.write_all(self._fd, data)
            files.fsync(self._fd)
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
    return atomic_write(directory / METADATA_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))



def _write_table(directory: Path, frame) -> Path:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return atomic_write(directory / CSV_FILE, lambda tmp: frame.to_csv(tmp, index=False))
    return atomic_write(directory / PARQUET_FILE, lambda tmp: frame.to_parquet(tmp, index=False))


def write_results(
    directory: str | os.PathLike,
    rows: Iterable[Mapping[str, Any]],
    metadata: Mapping[str, Any],
) -> Path:
    """Write a complete result set into ``directory`` (created if needed): ``rows.jsonl``
    (replaced), ``results.parquet`` (``results.csv`` without pyarrow) and ``metadata.json``,
    each through a temporary file and a rename.

    Args:
        rows: dicts with keys from :data:`tflabench.store.schema.COLUMNS` (missing ones None; ``case_id`` computed
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
    atomic_write(directory / ROWS_FILE, lambda tmp: tmp.write_bytes(data))
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
    data = read_bytes(path, str(path), what="the file of result rows", limit=files.MAX_ROWS_FILE_BYTES,
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
            atomic_write(path, lambda tmp: tmp.write_bytes(b"".join(scan.kept)))
        return []
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    records = b"".join(
        (json.dumps({"date": now, "line": lineno, "why": why, "text": text}) + "\n").encode("utf-8")
        for lineno, why, text, _ in scan.bad)
    aside = directory / SET_ASIDE_FILE
    try:
        fd = files.open_append(aside)
    except OSError as exc:
        raise ResultWriteError(f"cannot write {aside}: {io_reason(exc)}; it must be a regular file") from None
    try:
        files.write_all(fd, records)
        files.fsync(fd)
    finally:
        os.close(fd)
    atomic_write(path, lambda tmp: tmp.write_bytes(b"".join(scan.kept)))
    return [f"{path}: line {lineno} is {why}: set aside into {aside}" for lineno, why, _, _ in scan.bad]



# --------------------------------------------------------------------------- names


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
    table larger than :data:`tflabench.store.files.MAX_ROWS_FILE_BYTES`: a set from elsewhere (a CI artifact, a
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
            elif entry.name in (PARQUET_FILE, CSV_FILE) and depth == 0 and st.st_size > files.MAX_ROWS_FILE_BYTES:
                raise UserError(f"{path}: {st.st_size} bytes, more than the {files.MAX_ROWS_FILE_BYTES} bytes a table of "
                                "result rows may hold")


def read_metadata(directory: str | os.PathLike) -> dict:
    """The ``metadata.json`` of a result set as a dict (empty when the file is absent).

    Raises UserError (one line naming the file) when it is a directory, cannot be read, is
    not UTF-8 JSON, is not a JSON object, or a key of :data:`tflabench.store.schema.METADATA_TYPES` holds a value
    of another type."""
    path = Path(directory) / METADATA_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    fix = "the file was edited or damaged (moved away, report and compare read the rows without it; a resume needs it)"
    text = read_text(path, str(path), what="a JSON file", fix=fix, limit=files.MAX_METADATA_BYTES, follow_links=False)
    try:
        metadata = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({getattr(exc, 'msg', 'nested too deeply')}); {fix}") from None
    problem = metadata_problem(metadata)
    if problem:
        raise UserError(f"{path}: {problem}; {fix}")
    return metadata



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
            frame = normalise_frame(pd.read_parquet(directory / PARQUET_FILE))
        else:
            frame = normalise_frame(pd.read_csv(directory / CSV_FILE))
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
