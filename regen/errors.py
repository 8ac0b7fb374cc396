"""What a person running regen sees when it stops: one or two ``error:`` lines, never a traceback.

:class:`UserError` (the repo's one, ``common.user_errors``) is a problem the person can fix (a setting, an input
file, an output that exists, a server that would not start); its message says what is wrong and its
``hint`` what to type instead.
:class:`Interrupted` is Ctrl-C or SIGTERM. ``reported_to_user()`` wraps an entry point: it prints
those and exits (1 for an error, 128 + the signal number for an interrupt); ``HYDRA_FULL_ERROR=1``
shows the traceback of an error as well.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from common.user_errors import UserError, error_lines
from launch.server_process import ServerStartError


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM; cleanup that runs for Ctrl-C runs for it too."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _error_lines(error: BaseException) -> list[str]:
    if isinstance(error, UserError):
        return error_lines(error)
    # ServerStartError: the first line says what happened, the rest is the server's log tail
    first, _, tail = str(error).partition("\n")
    if tail.strip():
        print(tail.rstrip(), file=sys.stderr)
    return error_lines(UserError(first))


@contextmanager
def reported_to_user() -> Iterator[None]:
    """Turn user errors and interrupts raised in the block into ``error:`` lines and an exit status."""
    try:
        yield
    except (UserError, ServerStartError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print("\n".join(_error_lines(error)), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as interrupt:
        signum = interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT
        print(f"regen: interrupted ({signal.Signals(signum).name}); finished conversations are kept, "
              "continue with resume=true", file=sys.stderr)
        sys.exit(128 + signum)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise :class:`Interrupted`, so cleanup always happens.

    Only in the main thread; a block nested in another one (or under a handler someone else installed)
    leaves the handlers as they are.
    """
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    if (threading.current_thread() is not threading.main_thread() or previous[signal.SIGTERM] != signal.SIG_DFL
            or previous[signal.SIGINT] is not signal.default_int_handler):
        yield
        return

    def interrupt(signum, frame):
        raise Interrupted(signum)

    for signum in previous:
        signal.signal(signum, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

