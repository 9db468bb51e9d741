"""The one exception type for user mistakes, and the one wording of an unreadable file.

Library code raises :class:`UserError` (a ``ValueError``) for bad input that a user can
fix: a bad option value, an invalid suite, an unknown GPU, an unreadable file. The CLI
turns it into one line on stderr and exit status 2 (see ``tflabench.cli.user_errors``).
:func:`read_text` reads a file a user named (or one of a result set) as UTF-8 text and
says in one such line why it cannot; :func:`io_reason` words an ``OSError`` for a message.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class UserError(ValueError):
    """Bad input that the user can fix; the message is one line naming what and how."""


def io_reason(exc: OSError) -> str:
    """Why an operating-system call failed, for a message: ``<strerror> (<errno name>)``,
    e.g. ``Permission denied (EACCES)``; the exception's text where it has no strerror."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def read_text(path: str | os.PathLike, where: str, *, what: str = "a file", fix: str = "") -> str:
    """The content of the file at ``path``, decoded as UTF-8.

    Args:
        where: the start of every message (usually the path, e.g. ``--thresholds x.yaml``).
        what: the kind of file expected, for a directory in its place (``a YAML file``).
        fix: how to go on, appended as ``; <fix>`` to the directory and encoding messages.

    Raises:
        UserError: one line: ``<where>: file does not exist``, ``<where>: is a directory,
            not <what>``, ``<where>: cannot be read (<io_reason>)``, ``<where>: not UTF-8 text``.
    """
    tail = f"; {fix}" if fix else ""
    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{where}: file does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{where}: is a directory, not {what}{tail}") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot be read ({io_reason(exc)})") from None
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text{tail}") from None
