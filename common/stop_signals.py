"""A job's own Ctrl-C and SIGTERM handling once it runs: ``handling(handler)`` makes one handler take both signals
while a block runs and gives the previous handlers back after it; ``held()`` holds them back while a process is spawned.

regen's run (``regen.cancel_on_signal``: the conversations in flight are cancelled, the finished ones kept) and opd's
training loop (``opd.training.stop_and_save``: the step in progress finishes and is saved) each install theirs with it; before
that, the start-up handler of ``common.start_up`` (or Python's default) has them.

Only in the main thread, and each signal only over Python's default handler or ``common.start_up``'s (the start-up
one, or ``interrupt_job`` once the job runs): a signal someone else handles (a program that embeds the job, an outer
block) or ignores (SIGINT of a job a shell started in the background) stays so.
"""

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
    """SIGINT and SIGTERM that arrive in the block take effect as it ends, by the handlers they would have met (taken
    as ``handling`` takes them). For starting a spawned process: ``multiprocessing`` starts the child, then writes it
    its instructions, so a signal in between leaves the child reading an empty pipe and printing that traceback."""
    arrived: list[int] = []
    try:
        with handling(lambda signum, frame: arrived.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)
