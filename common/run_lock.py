"""One run per output: an exclusive ``flock`` on a lock file beside it, held for the whole run (the OS drops it on any
exit); a second run is refused at once, naming the holder's pid. ``remove_on_release`` unlinks the file while still
locked, so every acquirer checks that the path still names the file it locked, and otherwise locks again."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from common.user_errors import UserError


class OutputLockedError(UserError):
    """Another run holds this output."""


class OutputLock:
    """``acquire()`` takes the lock (or raises :class:`OutputLockedError`); ``release()`` lets it go."""

    def __init__(self, path: Path, output: Path, *, job: str, hint: str, remove_on_release: bool = False):
        """``path`` is the lock file, ``output`` what it guards; ``job`` and ``hint`` word the refusal."""
        self.path, self.output, self.job, self.hint = path, output, job, hint
        self.remove_on_release = remove_on_release
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:  # never through a planted link: a symlink is refused, a file with other names is not written
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            except OSError as error:
                if error.errno != errno.ELOOP:
                    raise
                raise UserError(f"lock file {self.path} is a symbolic link; refusing to follow it",
                                "remove the link, then run again") from None
            held = os.fstat(fd)
            if not stat.S_ISREG(held.st_mode) or held.st_nlink > 1:  # 0: removed meanwhile (locked anew below)
                os.close(fd)
                raise UserError(f"lock file {self.path} is not a plain file of its own (a hard link or a special "
                                "file); refusing to write to it", "remove it, then run again")
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
