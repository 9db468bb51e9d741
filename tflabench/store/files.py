"""The files of a result set, written and read safely: whole or not at all, never through
a link, fsynced, and read within a bound.

:func:`atomic_write` (a temporary file beside the target, fsynced and renamed over it),
:func:`open_append` (records appended with ``O_NOFOLLOW``), :func:`write_all`,
:func:`install_file`, :func:`real_directory`, :func:`fsync` / :func:`fsync_dir`; the
bounds of what is read (:data:`MAX_ROWS_FILE_BYTES`, :data:`MAX_METADATA_BYTES`;
:func:`tflabench.errors.read_bytes` reads within them); :func:`check_plain_name`, the rule
for a name that becomes a directory. A file that cannot be written raises
:class:`ResultWriteError`.

Source: ``docs/harness.md``, "Crash safety"; ``docs/result-sets.md``, "Result sets from
elsewhere".
"""

from __future__ import annotations

import errno
import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable

from tflabench.errors import UserError, file_kind, io_reason

#: ``os.O_NOFOLLOW`` where the system has it (0 elsewhere): open without following a link.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: Longest suite name (it becomes a directory name).
NAME_MAX_CHARS = 128
#: Largest file of rows a result set may hold (``rows.jsonl``, its table, the set-aside
#: file), in bytes: far above what a suite of ``max_cases`` 10,000 cases writes at its
#: iteration counts, and a bound on what reading a set from elsewhere costs
#: (docs/result-sets.md, "Result sets from elsewhere").
MAX_ROWS_FILE_BYTES = 2**31
#: Largest ``metadata.json`` (and ``.lock``) read, in bytes.
MAX_METADATA_BYTES = 64 * 2**20


class ResultWriteError(UserError):
    """A result-set file could not be written (full disk, no permission, read-only file
    system). What was written before it is intact; the message says which file, why, and
    how to go on."""


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written (raises OSError)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync(fd: int) -> None:
    """``os.fsync(fd)``; a file system that cannot fsync (EINVAL, ENOTSUP, EROFS) is no
    error. Raises OSError otherwise."""
    try:
        os.fsync(fd)
    except OSError as exc:  # file systems that cannot fsync (EINVAL) are not an error
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        fsync(fd)
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
    none) and a stale temporary file, which :func:`tflabench.store.results.remove_stale_temporaries` deletes.
    Raises :class:`ResultWriteError`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644))
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            fsync(fd)
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
    fsync_dir(path.parent)
    return path



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



def open_append(path: str | os.PathLike) -> int:
    """A descriptor appending to ``path`` (created where missing, mode 0644), opened without
    following a link (``O_NOFOLLOW``: a link planted at ``path`` is refused with ELOOP).
    The caller writes whole records (:func:`write_all`), fsyncs and closes it. Raises OSError."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o644)


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
