"""The lock of a result set being written (:class:`ResultSetLock`, the file ``.lock``): at
most one run writes a result set at a time.

Source: ``docs/harness.md``, "Crash safety".
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import socket
import sys
import uuid
from pathlib import Path

from tflabench.errors import UserError, io_reason, read_text
from tflabench.store.files import MAX_METADATA_BYTES, NOFOLLOW, ResultWriteError, fsync, fsync_dir

#: The lock file of a result set being written (owner's pid, host, start, command).
LOCK_FILE = ".lock"


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
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
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
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
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
            fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise ResultWriteError(f"cannot lock result set {self.directory}: {io_reason(exc)}; "
                                   "free space or fix the directory's permissions") from None
        self._fd, self._token = fd, token
        fsync_dir(self.directory)
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
