"""One run per output: an exclusive ``flock`` on a lock file beside it, held for the whole run.

The OS drops the lock when the holder exits however it exits (``kill -9`` included), so a stale lock file
never blocks a later run. A second run on the same output is refused at once, naming the pid the
holder wrote into the lock file.

A holder may remove its lock file when it lets go (``remove_on_release``: regen does, so a finished or refused run
leaves no ``.lock`` behind). It removes it while still holding the lock, and only when the path still names the
file it locked; and every acquirer, once it holds a lock, checks that the path still names the file it locked (a
run that opened the file just before its holder removed it would otherwise hold a lock on a file no other run can
find, while the next one locks a new file there), and otherwise locks again.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from common.user_errors import UserError


class OutputLockedError(UserError):
    """Another run holds this output."""


class OutputLock:
    """``acquire()`` takes the lock (or raises :class:`OutputLockedError`); ``release()`` lets it go."""

    def __init__(self, path: Path, output: Path, *, job: str, hint: str, remove_on_release: bool = False):
        """``path`` is the lock file, ``output`` what it guards; ``job`` names the holder's kind in the refusal
        (``regen``, ``opd/train.py``) and ``hint`` says what to do instead."""
        self.path, self.output, self.job, self.hint = path, output, job, hint
        self.remove_on_release = remove_on_release
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise OutputLockedError(f"{self.output} is being written by another {self.job} run (pid {holder}, "
                                   f"lock {self.path})", self.hint) from None
            if self._path_names(fd):
                break
            os.close(fd)  # its holder removed it before we locked it: lock the file the path names now
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _path_names(self, fd: int) -> bool:
        """Whether ``self.path`` names the file open as ``fd``."""
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self._fd is not None:
            try:
                if self.remove_on_release and self._path_names(self._fd):
                    os.unlink(self.path)  # still held: whoever opened it meanwhile sees it gone and locks anew
            except OSError as error:  # a folder turned read-only: the file stays, unlocked, and the next run takes it
                if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
            finally:
                os.close(self._fd)  # closing the only descriptor drops the flock
                self._fd = None
