"""One run per ``out_dir``: opd's entries make the folder and lock it (``common.run_lock``) before anything loads, for
the whole run; that is also the check that it can be written. A second run on it is refused at once. Under torchrun
only global rank 0 takes the lock (it alone writes); if refused it exits before joining, so torchrun stops the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

from common.config_schema import parse_config
from common.run_folders import discard_unless_checked, note_new_folder
from common.run_lock import OutputLock
from common.start_up import started
from common.user_errors import UserError, exit_on_user_error, full_disk_is_one_error

LOCK_NAME = ".lock"


@contextmanager
def hold_out_dir(out_dir: str | Path) -> Iterator[None]:
    """Hold ``out_dir`` (made if missing) for the block; ``UserError`` when unwritable or held by another run."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    folder = Path(out_dir).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"out_dir {out_dir} is not a folder", "choose another out_dir=")
    note_new_folder(folder, (LOCK_NAME,))  # a run that stops at its checks removes it again (common.run_folders)
    lock = OutputLock(folder / LOCK_NAME, folder, job="opd",
                      hint="wait for it to finish (or stop it), or choose another out_dir=")
    try:
        lock.acquire()
    except OSError as error:  # the folder cannot be made, or written
        raise UserError(f"cannot write to out_dir {out_dir} ({error.strerror or error})",
                        "choose another out_dir=") from None
    try:
        yield
    finally:
        lock.release()


DISK_FULL_HINT = ("make room on that disk; a training run continues from its last checkpoint with resume= (the "
                  "checkpoints saved before are intact)")


def checked_run(schema: type, cfg: DictConfig, work: Callable) -> None:
    """An entry's run: ``cfg`` parsed and checked as ``schema``, then ``work(settings)`` with ``out_dir`` held. User
    errors (a full disk too) end it with ``error:`` lines; a run stopped at its checks leaves no folder behind."""
    started()
    with exit_on_user_error(), discard_unless_checked(), full_disk_is_one_error(DISK_FULL_HINT):
        settings = parse_config(schema, cfg)
        with hold_out_dir(settings.out_dir):  # one run per out_dir, checked writable before anything loads
            work(settings)
