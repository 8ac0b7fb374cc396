"""Ctrl-C and SIGTERM while a command starts (imports, Hydra composing): one line and status 130 / 143, never a
traceback or a silent kill.

Entries call ``stop_at_start_up()`` before heavy imports, inside ``exit_on_user_error()`` and
``start_up_interrupts()`` (``run_entry`` does all three); ``started()`` hands the signals back once the job runs.
Main thread and default handlers only; not under torchrun (``python -m opd.torchrun`` speaks there).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from common.hydra_errors import composition_errors_as_user_errors
from common.user_errors import Interrupted, exit_on_user_error, under_torchrun

DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
LINE = "error: interrupted ({signal}) while starting"  # opd's; regen says more
JOB_LINE = "error: interrupted ({signal})"  # SIGTERM once the job runs, outside its own handler (``interrupt_job``)


def quiet_finalizers() -> None:
    """Drop "Exception ignored" reports from a half-built object's ``__del__`` (``HYDRA_FULL_ERROR=1`` keeps them)."""
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        sys.unraisablehook = lambda unraisable: None


class _StartUp:
    """The start-up line, the signal once one came, and the stderr it found (``start_up_interrupts``)."""

    message = LINE
    signum: int | None = None
    stderr = None

    @classmethod
    def interrupted(cls, signum: int | None = None) -> Interrupted:
        """The start-up ``Interrupted`` for ``signum`` (the first start-up signal by default)."""
        signum = cls.signum if signum is None else signum
        return Interrupted(signum, cls.message.format(signal=signal.Signals(signum).name))


def interrupt_start_up(signum: int, frame: Any) -> None:
    """The start-up handler: raise the start-up ``Interrupted`` (and keep the signal for ``start_up_interrupts``)."""
    quiet_finalizers()
    if _StartUp.signum is None:
        _StartUp.signum, _StartUp.stderr = signum, sys.stderr
        if os.environ.get("HYDRA_FULL_ERROR") != "1":  # what the cut library prints on its way out is dropped
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process, which is ending
    raise _StartUp.interrupted(signum)


def interrupt_job(signum: int, frame: Any) -> None:
    """SIGTERM once the job runs, outside its own handler: ``Interrupted`` with ``JOB_LINE``."""
    quiet_finalizers()
    raise Interrupted(signum, JOB_LINE.format(signal=signal.Signals(signum).name))


def stop_at_start_up(message: str = LINE) -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` with ``message`` (where the module doc says)."""
    if threading.current_thread() is not threading.main_thread() or under_torchrun():
        return
    _StartUp.message = message
    for signum, default in DEFAULTS.items():
        if signal.getsignal(signum) == default:
            signal.signal(signum, interrupt_start_up)


def raise_if_signalled() -> None:
    """Stop here if a start-up signal's exception was lost (raised in a finalizer); called where the job begins."""
    if _StartUp.signum is not None:
        raise _StartUp.interrupted()


RUNNING = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: interrupt_job}


def started() -> None:
    """The job runs (after ``raise_if_signalled``): ``RUNNING``'s handlers replace the start-up one."""
    raise_if_signalled()
    if threading.current_thread() is threading.main_thread():
        for signum, running in RUNNING.items():
            if signal.getsignal(signum) == interrupt_start_up:
                signal.signal(signum, running)


@contextmanager
def start_up_interrupts() -> Iterator[None]:
    """Whatever ends the block after a start-up signal ends it as that signal's ``Interrupted`` (a library's cleanup
    may fail on the half-changed state and raise something else); stderr is restored for the one line."""
    try:
        yield
    except BaseException:
        if _StartUp.signum is None:
            raise
        sys.stderr = _StartUp.stderr
        raise _StartUp.interrupted() from None


def run_entry(module: str, message: str = LINE) -> None:
    """Import ``module`` and run its ``main()`` under the start-up handler, errors ending in ``error:`` lines."""
    stop_at_start_up(message)
    with exit_on_user_error(), start_up_interrupts(), composition_errors_as_user_errors():
        importlib.import_module(module).main()
