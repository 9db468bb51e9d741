"""The one exception type for user mistakes, and the one wording of an unreadable file.

Library code raises :class:`UserError` (a ``ValueError``) for bad input that a user can
fix: a bad option value, an invalid suite, an unknown GPU, an unreadable file. The CLI
turns it into one line on stderr and exit status 2 (see ``tflabench.cli.user_errors``).
:func:`read_text` reads a file a user named (or one of a result set) as UTF-8 text and
says in one such line why it cannot; :func:`read_bytes` is its byte-level core, which also
refuses a link or a file that is not a regular file (a FIFO, a device) and a file larger
than a limit, for the files of a result set (docs/result-sets.md, "Result sets from elsewhere");
:func:`io_reason` words an ``OSError`` for a message.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class UserError(ValueError):
    """Bad input that the user can fix; the message is one line naming what and how."""


def io_reason(exc: OSError) -> str:
    """Why an operating-system call failed, for a message: ``<strerror> (<errno name>)``,
    e.g. ``Permission denied (EACCES)``; the exception's text where it has no strerror."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def read_bytes(path: str | os.PathLike, where: str, *, what: str = "a file", fix: str = "",
               limit: int | None = None, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, read through one descriptor.

    The file is opened without blocking (a FIFO cannot hang the read) and checked on that
    descriptor before a byte is read: it must be a regular file of at most ``limit`` bytes
    (no limit when None; the read stops past it). With ``follow_links=False`` a symbolic
    link at ``path`` (``O_NOFOLLOW``) and anything but a regular file are refused: the
    files of a result set from elsewhere are read, never what they point at. A file a user
    names (``follow_links=True``) may be a link or a pipe (``<(...)``).

    Args:
        where: the start of every message (usually the path).
        what: the kind of file expected, for a directory or another kind of file in its place.
        fix: how to go on, appended as ``; <fix>`` to the directory and type messages.

    Raises:
        UserError: one line: ``<where>: file does not exist``, ``<where>: is a directory, not
            <what>``, ``<where>: is a symbolic link ...``, ``<where>: is a FIFO/device/socket,
            not <what>``, ``<where>: N bytes, more than the L a file here may hold``,
            ``<where>: cannot be read (<io_reason>)``.
    """
    tail = f"; {fix}" if fix else ""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UserError(f"{where}: file does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{where}: is a directory, not {what}{tail}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise UserError(f"{where}: is a symbolic link; the files of a result set are read only as regular "
                            f"files, never through a link{tail}") from None
        raise UserError(f"{where}: cannot be read ({io_reason(exc)})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{where}: is a directory, not {what}{tail}")
        if not stat.S_ISREG(st.st_mode) and not follow_links:
            raise UserError(f"{where}: is a {file_kind(st.st_mode)}, not {what} (a regular file){tail}")
        if limit is not None and st.st_size > limit:
            raise UserError(f"{where}: {st.st_size} bytes, more than the {limit} bytes a file here may hold{tail}")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if limit is not None and total > limit:  # grew while read
                raise UserError(f"{where}: more than the {limit} bytes a file here may hold{tail}")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise UserError(f"{where}: cannot be read ({io_reason(exc)})") from None
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """The kind of file an ``st_mode`` names, in words: ``regular file``, ``directory``,
    ``symbolic link``, ``FIFO``, ``character device``, ``block device``, ``socket``."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def read_text(path: str | os.PathLike, where: str, *, what: str = "a file", fix: str = "",
              limit: int | None = None, follow_links: bool = True) -> str:
    """The content of the file at ``path``, decoded as UTF-8 (:func:`read_bytes`, whose
    ``limit`` and ``follow_links`` it takes).

    Args:
        where: the start of every message (usually the path, e.g. ``--thresholds x.yaml``).
        what: the kind of file expected, for a directory in its place (``a YAML file``).
        fix: how to go on, appended as ``; <fix>`` to the directory and encoding messages.

    Raises:
        UserError: one line: ``<where>: file does not exist``, ``<where>: is a directory,
            not <what>``, ``<where>: cannot be read (<io_reason>)``, ``<where>: not UTF-8 text``,
            and those of :func:`read_bytes` (a link, a FIFO or device, too large).
    """
    tail = f"; {fix}" if fix else ""
    data = read_bytes(path, where, what=what, fix=fix, limit=limit, follow_links=follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text{tail}") from None
