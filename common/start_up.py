"""Ctrl-C and SIGTERM while a command starts (importing torch and Hydra, composing the config): one line and exit
status 130 / 143, never a ``KeyboardInterrupt`` traceback or a silent kill by SIGTERM.

Every entry (regen's, opd's, the embedded server's, the experiments') calls ``stop_at_start_up()`` before its heavy
imports and runs them and Hydra inside ``exit_on_user_error()`` and ``start_up_interrupts()`` (``run_entry`` does all
three for a module's ``main``): from then on both signals raise :class:`~common.user_errors.Interrupted` with its
line (``{signal}`` in it is the signal's name). Once the job runs, ``started()`` gives SIGINT back to Python's
default (``error: interrupted``) and SIGTERM to ``interrupt_job`` (``error: interrupted (SIGTERM)``, 143, where
Python's default is a silent kill), or the job's own handler takes over (``common.stop_signals``: regen's run, opd's
step loop), so the start-up line is never said of a run that had begun; a start-up signal whose exception a library
lost stops the job there (``raise_if_signalled``).

Only in the main thread, only over Python's default handlers, and not under torchrun: there SIGTERM is torchrun
stopping a rank because another one failed, and what the job says is up to ``python -m opd.torchrun``.
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
    """A signal raised in plain code can land inside a constructor (an asyncio transport, a socket) and leave a
    half-built object whose ``__del__`` then fails: Python reports that as "Exception ignored ... Traceback". The run
    is ending with its one line, so such reports are dropped from here on (``HYDRA_FULL_ERROR=1`` keeps them)."""
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
    """SIGTERM once the job runs, where it has no handler of its own (loading, an evaluation, a summary):
    ``Interrupted`` with ``JOB_LINE``, as Ctrl-C is a ``KeyboardInterrupt`` there."""
    quiet_finalizers()
    raise Interrupted(signum, JOB_LINE.format(signal=signal.Signals(signum).name))


def stop_at_start_up(message: str = LINE) -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` with ``message`` (main thread, default handlers only, not
    under torchrun)."""
    if threading.current_thread() is not threading.main_thread() or under_torchrun():
        return
    _StartUp.message = message
    for signum, default in DEFAULTS.items():
        if signal.getsignal(signum) == default:
            signal.signal(signum, interrupt_start_up)


def raise_if_signalled() -> None:
    """Stop here if a start-up signal came and what it raised was lost. A handler runs wherever the main thread is,
    and in a finalizer (``__del__``, a weakref callback) Python only reports what it raises (``quiet_finalizers``
    drops that), so the start-up went on: seen once, ``python -m opd.torchrun`` started its workers after a Ctrl-C
    while torch imported. Called where the job begins, outside its own ``exit_on_user_error``."""
    if _StartUp.signum is not None:
        raise _StartUp.interrupted()


RUNNING = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: interrupt_job}


def started() -> None:
    """The job runs (unless a start-up signal came: ``raise_if_signalled``): a signal is no longer one that stopped
    its start-up (``RUNNING``'s handlers, where the start-up one was installed)."""
    raise_if_signalled()
    if threading.current_thread() is threading.main_thread():
        for signum, running in RUNNING.items():
            if signal.getsignal(signum) == interrupt_start_up:
                signal.signal(signum, running)


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
        raise _StartUp.interrupted() from None


def run_entry(module: str, message: str = LINE) -> None:
    """Import ``module`` and run its ``main()``, its start-up (the import included) under the start-up handler, and
    any user error, interrupt or refusal of the command line by Hydra (``common.hydra_errors``) ending in its
    ``error:`` lines."""
    stop_at_start_up(message)
    with exit_on_user_error(), start_up_interrupts(), composition_errors_as_user_errors():
        importlib.import_module(module).main()
