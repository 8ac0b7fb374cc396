"""One run per output: the flock beside it refuses a second holder (another process) naming the first's pid, and
the OS drops it when the holder exits, kill -9 included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from common.run_lock import OutputLock, OutputLockedError
from common.user_errors import UserError
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import wait_for_file

ROLE = {"job": "regen", "hint": "choose another output="}
HOLD = """
import sys, time
from pathlib import Path
from common.run_lock import OutputLock
OutputLock(Path(sys.argv[1]), Path(sys.argv[2]), job="regen", hint="").acquire()
Path(sys.argv[3]).write_text("held")
time.sleep(300)
"""


def hold_in_another_process(tmp_path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out.lock"), str(tmp_path / "out.jsonl"),
                               str(tmp_path / "held")], cwd=REPO_ROOT)
    wait_for_file(tmp_path / "held", holder)
    return holder


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_second_holder_is_refused_until_the_first_is_gone(tmp_path, signum):
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(OutputLockedError) as refused:
            OutputLock(tmp_path / "out.lock", tmp_path / "out.jsonl", **ROLE).acquire()
        assert str(refused.value) == (f"{tmp_path / 'out.jsonl'} is being written by another regen run "
                                      f"(pid {holder.pid}, lock {tmp_path / 'out.lock'})")
    finally:
        os.kill(holder.pid, signum)
        holder.wait(timeout=60)
    lock = OutputLock(tmp_path / "out.lock", tmp_path / "out.jsonl", **ROLE).acquire()  # the OS let go of it
    assert (tmp_path / "out.lock").read_text() == f"{os.getpid()}\n"
    lock.release()


def test_release_lets_the_next_run_in(tmp_path):
    first = OutputLock(tmp_path / "deep" / "out.lock", tmp_path / "deep" / "out.jsonl", **ROLE).acquire()
    first.release()
    second = OutputLock(tmp_path / "deep" / "out.lock", tmp_path / "deep" / "out.jsonl", **ROLE).acquire()
    second.release()


def test_a_run_that_removes_its_lock_file_does_it_while_holding_it(tmp_path):
    first = OutputLock(tmp_path / "out.lock", tmp_path / "out.jsonl", **ROLE, remove_on_release=True).acquire()
    first.release()
    assert not (tmp_path / "out.lock").exists()
    kept = OutputLock(tmp_path / "kept.lock", tmp_path / "kept.jsonl", **ROLE).acquire()  # opd keeps its .lock
    kept.release()
    assert (tmp_path / "kept.lock").exists()


def test_a_lock_file_removed_between_open_and_flock_is_not_held_twice(tmp_path, monkeypatch):
    """The holder removes its file and lets go after the next run opened it but before that run's flock: that run
    then holds a lock on a file no path names, and must lock the file the path names instead (or a third run
    could lock a new file beside it)."""
    lock, output = tmp_path / "out.lock", tmp_path / "out.jsonl"
    first = OutputLock(lock, output, **ROLE, remove_on_release=True).acquire()
    real_open = os.open

    def open_then_the_holder_finishes(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        if first._fd is not None:
            first.release()
        return fd

    monkeypatch.setattr(os, "open", open_then_the_holder_finishes)
    second = OutputLock(lock, output, **ROLE, remove_on_release=True).acquire()
    monkeypatch.undo()
    with pytest.raises(OutputLockedError):
        OutputLock(lock, output, **ROLE, remove_on_release=True).acquire()
    assert lock.read_text() == f"{os.getpid()}\n"
    second.release()
    assert not lock.exists()


def test_a_planted_link_as_lock_file_is_refused_and_its_target_left_alone(tmp_path):
    """A symlink (or a hard link) planted where the lock goes would have been truncated and written with the pid."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out.lock").symlink_to(victim)
    with pytest.raises(UserError, match=r"lock file .*out.lock is a symbolic link; refusing to follow it"):
        OutputLock(tmp_path / "out.lock", tmp_path / "out.jsonl", **ROLE).acquire()
    (tmp_path / "out.lock").unlink()
    os.link(victim, tmp_path / "out.lock")
    with pytest.raises(UserError, match=r"is not a plain file of its own \(a hard link"):
        OutputLock(tmp_path / "out.lock", tmp_path / "out.jsonl", **ROLE).acquire()
    assert victim.read_text() == "precious"
