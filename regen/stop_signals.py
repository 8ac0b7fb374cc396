"""Ctrl-C and SIGTERM during a regen run: one handler for the whole run, installed by ``stop_signals()``.

Where the run is in plain code (reading settings, starting a server, opening the output), a signal raises
:class:`Interrupted`, so every cleanup on the way out runs (a server regen started is stopped). While
:meth:`StopSignals.until_signal` runs the conversations, a signal instead cancels that work at its next
``await`` (between requests, never in the middle of a write) and is kept in ``caught``: the run then writes its
summary and raises ``Interrupted`` itself (:meth:`StopSignals.raise_if_caught`). The exit status is 128 + the
signal number (130 for SIGINT, 143 for SIGTERM).

Before that, from the first line of ``regen/main.py`` (imports, Hydra composing the config), ``stop_at_start_up()``
makes both signals raise :class:`Interrupted` with the start-up line, so a signal then ends with 130 / 143 and that
one line too, never a ``KeyboardInterrupt`` traceback or a bare kill by SIGTERM; ``start_up_interrupts()`` keeps it
so when the signal cut a library's code and another error came out of it.

Only in the main thread, and only over Python's default handlers (or the start-up one): a second ``stop_signals()`` inside the first
(a multirun's shared server holds one for every job) returns the first, and under a handler someone else
installed nothing is changed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from common.user_errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
MESSAGE = "regen: interrupted ({signal}); finished conversations are kept, continue with resume=true"
START_UP_MESSAGE = "regen: interrupted ({signal}) while starting; no conversation was started"


def _quiet_finalizers() -> None:
    """A signal raised in plain code can land inside a constructor (an asyncio transport, a socket) and leave a
    half-built object whose ``__del__`` then fails: Python reports that as "Exception ignored ... Traceback". The run
    is ending with its one line, so such reports are dropped from here on (``HYDRA_FULL_ERROR=1`` keeps them)."""
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        sys.unraisablehook = lambda unraisable: None


class _StartUp:
    """The start-up signal, once one came, and the stderr it found (``start_up_interrupts``)."""

    signum: int | None = None
    stderr = None


def _interrupt_start_up(signum: int, frame: Any) -> None:
    _quiet_finalizers()
    if _StartUp.signum is None:
        _StartUp.signum, _StartUp.stderr = signum, sys.stderr
        if os.environ.get("HYDRA_FULL_ERROR") != "1":  # what the cut library prints on its way out is dropped
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process, which is ending
    raise Interrupted(signum, START_UP_MESSAGE.format(signal=signal.Signals(signum).name))


@contextmanager
def start_up_interrupts() -> Iterator[None]:
    """Whatever ends the block after a start-up signal ends it as that signal's ``Interrupted``: the signal can land
    in a library's cleanup-guarded code, whose cleanup then fails on the half-changed state and raises another
    error instead (CI once saw omegaconf's ``flag_override`` end in ``AttributeError`` while Hydra composed the
    config; Hydra printed it and exited 1). The stderr the signal found is back for the one line."""
    try:
        yield
    except BaseException:
        if _StartUp.signum is None:
            raise
        sys.stderr = _StartUp.stderr
        raise Interrupted(_StartUp.signum,
                          START_UP_MESSAGE.format(signal=signal.Signals(_StartUp.signum).name)) from None


def stop_at_start_up() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` with the start-up line (main thread, default handlers
    only); ``stop_signals()`` takes over from it for the run."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) == default:
            signal.signal(signum, _interrupt_start_up)


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
            _quiet_finalizers()
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
    """Handle SIGINT and SIGTERM as the module doc says while the block runs; yields the handler."""
    current = signal.getsignal(signal.SIGTERM)
    if isinstance(getattr(current, "__self__", None), StopSignals):  # already handled: the outer block's
        yield current.__self__
        return
    handler = StopSignals()
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    if (threading.current_thread() is not threading.main_thread()
            or previous[signal.SIGTERM] not in (signal.SIG_DFL, _interrupt_start_up)
            or previous[signal.SIGINT] not in (signal.default_int_handler, _interrupt_start_up)):
        yield handler  # someone else's handling stays; until_signal then just runs the work
        return
    for signum in SIGNALS:
        signal.signal(signum, handler._handle)
    try:
        yield handler
    finally:
        for signum, restored in previous.items():
            signal.signal(signum, restored)
