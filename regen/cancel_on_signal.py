"""Ctrl-C and SIGTERM during a regen run: one handler for the whole run, installed by ``stop_signals()``.

In plain code a signal raises :class:`Interrupted`, so cleanups run. While :meth:`StopSignals.until_signal` runs the
conversations, it cancels that work at its next ``await`` (never mid-write) and is kept in ``caught``; the run writes
its summary, then :meth:`StopSignals.raise_if_caught`. Exit status 128 + the signal. A nested ``stop_signals()``
yields the outer handler.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from common.start_up import quiet_finalizers
from common.stop_signals import SIGNALS, handling
from common.user_errors import Interrupted

MESSAGE = "regen: interrupted ({signal}); finished conversations are kept, continue with resume=true"
START_UP_MESSAGE = "regen: interrupted ({signal}) while starting; no conversation was started"


class StopSignals:
    """The run's handler: raises :class:`Interrupted`, or cancels the work :meth:`until_signal` runs."""

    def __init__(self) -> None:
        self.caught: int | None = None  # the signal that cancelled the work
        self._work: asyncio.Future | None = None

    def interrupted(self, signum: int) -> Interrupted:
        return Interrupted(signum, MESSAGE.format(signal=signal.Signals(signum).name))

    def _handle(self, signum: int, frame: Any) -> None:
        work = self._work
        if work is None or work.done():
            quiet_finalizers()
            raise self.interrupted(signum)
        self.caught = self.caught or signum
        work.get_loop().call_soon_threadsafe(work.cancel)  # as asyncio.Runner does for Ctrl-C

    async def until_signal(self, work: Coroutine) -> Any:
        """Run ``work`` to its end and return its result, or until a signal cancels it (then ``caught`` says which
        and the result is None)."""
        self.caught = None
        self._work = asyncio.ensure_future(work)
        try:
            return await self._work
        except asyncio.CancelledError:
            if self.caught is None:  # cancelled by something else: not ours to swallow
                raise
            return None
        finally:
            self._work = None

    def raise_if_caught(self) -> None:
        if self.caught is not None:
            raise self.interrupted(self.caught)


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Handle SIGINT and SIGTERM while the block runs; yields the handler."""
    for signum in SIGNALS:
        current = getattr(signal.getsignal(signum), "__self__", None)
        if isinstance(current, StopSignals):  # already handled: the outer block's
            yield current
            return
    handler = StopSignals()
    with handling(handler._handle):  # a signal it does not take: until_signal just runs the work
        yield handler
