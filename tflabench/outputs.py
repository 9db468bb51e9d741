"""Report files a command writes at a path the user names (``compare --markdown``,
``--json``, ``$GITHUB_STEP_SUMMARY``, ``report --html``): checked before anything is
written, then written whole.

A command checks every output it will write with :func:`check_writable` before it prints
or writes anything, so an unwritable path (a read-only directory or file system, a path
that is a directory, a parent that is a file) ends the command with one line and exit
status 2 and leaves nothing half done. :func:`write_text` then writes through a temporary
file and a rename (or appends, for the step summary); a failure there (a full disk) is a
UserError too.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tflabench.errors import UserError, io_reason


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Raise UserError (``<what> <path>: cannot be written (<why>)``) unless ``path`` can
    be written: an existing regular file that opens for appending, or a new file whose
    nearest existing parent directory accepts a new file. Changes nothing on disk (a probe
    file is created and removed at once). Returns ``path`` as a Path."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    try:
        if p.exists() or p.is_symlink():
            if p.is_dir():
                raise UserError(f"{where}: is a directory; give a file name")
            with open(p, "a", encoding="utf-8"):
                pass
            return p
        parent = p.parent
        while not parent.exists():
            if parent == parent.parent:
                break
            parent = parent.parent
        if not parent.is_dir():
            raise UserError(f"{where}: cannot be written ({parent} is not a directory)")
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise UserError(f"{where}: cannot be written ({io_reason(exc)}); choose a writable path") from None
    return p


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str, what: str, append: bool = False) -> Path:
    """Write ``text`` to ``path``: whole, through a temporary file and a rename, or appended
    when ``append``. A missing directory is created, and said on stderr (``created directory
    D for --html``), the same for every report file (``--html``, ``--markdown``, ``--json``),
    so a mistyped path is seen. Raises UserError naming ``what`` and the path."""
    p = Path(path)
    try:
        if not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            sys.stderr.write(f"created directory {str(p.parent)!r} for {what}\n")
        if append:
            with open(p, "a", encoding="utf-8") as handle:
                handle.write(text)
            return p
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # as open() would create it (mkstemp: 0600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise UserError(f"{what} {str(p)!r}: cannot be written ({io_reason(exc)}); choose a writable path") from None
    return p
