"""Replacing a file so that a reader (or a crash) only ever sees the old or the new complete version: an fsynced temp
file beside it, renamed over it, the folder fsynced; permissions kept. ``stage`` and ``commit`` split the halves so
several files can be written first and renamed together."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _new_file_mode(path: Path) -> int:
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def no_space(path: str | Path, needed: int | None) -> OSError:
    """ENOSPC for ``path``, naming the bytes needed (when known) and free."""
    path = Path(path)
    try:
        free = f"{shutil.disk_usage(path.parent).free} bytes are free"
    except OSError:
        free = "its file system's free space cannot be read"
    wanted = f"needs {needed} bytes free, " if needed is not None else ""
    return OSError(errno.ENOSPC, f"no space left on device for {path}: the write {wanted}{free}")


def stage(path: str | Path, write: Callable[[BinaryIO], object], size: int | None = None) -> Path:
    """Write a temp file beside ``path`` with ``write(stream)``, fsynced; returns its path. ``size`` is for the
    full-disk message."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, _new_file_mode(path))
    except BaseException as error:
        Path(temp).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise no_space(path, size) from None
        raise
    return Path(temp)


def commit(temp: Path, path: str | Path) -> Path:
    """Rename a staged temp file over ``path`` and fsync the folder; returns ``path``."""
    path = Path(path)
    os.replace(temp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object], size: int | None = None) -> Path:
    """Replace ``path`` with what ``write(stream)`` writes, atomically; returns ``path``."""
    return commit(stage(path, write, size), path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text``, atomically."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda stream: stream.write(data), len(data))


def atomic_write_json(path: str | Path, payload) -> Path:
    """Replace ``path`` with ``payload`` as indented JSON (non-ASCII kept), atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
