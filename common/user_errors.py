"""What a person sees when a job stops: ``error:`` lines and an exit status, never a traceback.

``exit_on_user_error()`` wraps every entry: a ``UserError`` (or ``FileNotFoundError``) exits 1, an ``Interrupted``
128 + the signal (a bare Ctrl-C: 130); ``HYDRA_FULL_ERROR=1`` re-raises instead. Under torchrun only rank 0 prints;
every rank writes ``$TORCHELASTIC_ERROR_FILE``, which ``python -m opd.torchrun`` reads.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


class UserError(ValueError):
    """Bad input a person can fix: the message says what is wrong, ``hint`` what to do instead, ``details`` (printed
    above the error lines) what to read first."""

    def __init__(self, message: str, hint: str | None = None, details: str | None = None):
        super().__init__(message)
        self.message, self.hint, self.details = message, hint, details

    def __str__(self) -> str:
        return f"{self.message}\n{self.details}" if self.details else self.message


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM a job stopped on (a ``KeyboardInterrupt``, so cleanup runs); ``message`` is its line."""

    def __init__(self, signum: int = signal.SIGINT, message: str = "error: interrupted"):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum, self.message = signum, message

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class DiskFullError(UserError):
    """A file of the run could not be written: no space left on its disk."""


@contextmanager
def full_disk_is_one_error(hint: str) -> Iterator[None]:
    """A full disk (ENOSPC) in the block as :class:`DiskFullError`; ``hint`` says how the job goes on."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise DiskFullError(error.strerror or str(error), hint) from None


def error_lines(error: BaseException) -> list[str]:
    """The ``error:`` lines of an error: its message's lines, then its hint's."""
    message = error.message if isinstance(error, UserError) else str(error)
    hint = error.hint if isinstance(error, UserError) else None
    return [f"error: {line}" for part in (message, hint) if part for line in part.splitlines() if line.strip()]


def under_torchrun() -> bool:
    """Whether this process is a rank torchrun started (it sets ``$TORCHELASTIC_ERROR_FILE`` for each)."""
    return "TORCHELASTIC_ERROR_FILE" in os.environ


def report(text: str) -> None:
    """Print ``text`` on stderr (under torchrun only on rank 0), and on every rank write it to its torchrun error
    file, without a call stack so torchrun's report shows the message."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        record = {"message": text, "extraInfo": {"timestamp": str(int(time.time()))}}
        with suppress(OSError):  # the error itself is what matters; a report lost is torchrun's default
            Path(error_file).write_text(json.dumps({"message": record}))
    if not under_torchrun() or os.environ.get("RANK", "0") == "0":
        print(text, file=sys.stderr)


def exit_status(error: BaseException | None) -> int:
    """The exit status for ``error``: 0 without one, 128 + N for signal N (130 for a bare Ctrl-C), else 1."""
    if error is None:
        return 0
    if isinstance(error, KeyboardInterrupt):  # a bare Ctrl-C ends as ``Interrupted()`` (exit_on_user_error)
        return (error if isinstance(error, Interrupted) else Interrupted()).exit_status
    return 1


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn user errors and interrupts into what the module doc says, and exit."""
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        yield
    except (UserError, FileNotFoundError) as error:
        if full_error:
            raise
        details = getattr(error, "details", None)
        report("\n".join(([details.rstrip()] if details else []) + error_lines(error)))
        sys.exit(1)
    except KeyboardInterrupt as interrupt:
        if not isinstance(interrupt, Interrupted):  # a Ctrl-C the job did not handle itself
            if full_error:
                raise
            interrupt = Interrupted()
        report(interrupt.message)
        sys.exit(interrupt.exit_status)
