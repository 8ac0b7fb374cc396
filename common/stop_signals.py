"""A job's own Ctrl-C and SIGTERM handling: ``handling(handler)`` routes both to one handler while a block runs;
``held()`` defers them while a process is spawned. Main thread only, and only over Python's default handler or
``common.start_up``'s: a signal someone else handles or ignores stays so."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from common.start_up import DEFAULTS, interrupt_job, interrupt_start_up

SIGNALS = tuple(DEFAULTS)  # SIGINT, SIGTERM


@contextmanager
def handling(handler: Callable[[int, Any], None]) -> Iterator[set[int]]:
    """``handler`` takes SIGINT and SIGTERM while the block runs; yields the signals it takes (see the module doc)."""
    if threading.current_thread() is not threading.main_thread():
        yield set()
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    ours = (interrupt_start_up, interrupt_job)
    taken = {signum for signum, default in DEFAULTS.items() if previous[signum] in (default, *ours)}
    for signum in taken:
        signal.signal(signum, handler)
    try:
        yield taken
    finally:
        for signum in taken:
            signal.signal(signum, previous[signum])


@contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block are re-raised as it ends. For spawning a process: a signal between
    the child's start and its instructions leaves it reading an empty pipe and printing a traceback."""
    arrived: list[int] = []
    try:
        with handling(lambda signum, frame: arrived.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)
