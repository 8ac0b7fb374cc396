"""Errors a person caused (a setting, a data file, a checkpoint path, an output that exists) and how they are shown.

A ``UserError`` says what is wrong; its optional ``hint`` says what to type instead. Inside
``exit_on_user_error`` (opd's entries; regen's ``regen.errors.reported_to_user`` does the same and more),
one, or ``FileNotFoundError``, prints as ``error: ...`` lines on stderr and exits with status 1 without a
traceback; Ctrl-C exits with 130. ``HYDRA_FULL_ERROR=1`` re-raises, to see the traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(ValueError):
    """Bad input a person can fix; the message says what is wrong and where, ``hint`` what to do instead."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


def error_lines(error: BaseException) -> list[str]:
    """The ``error:`` lines of an error: its message's lines, then its hint's."""
    message = error.message if isinstance(error, UserError) else str(error)
    hint = error.hint if isinstance(error, UserError) else None
    return [f"error: {line}" for part in (message, hint) if part for line in part.splitlines() if line.strip()]


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn user errors into ``error:`` lines and exit status 1 (see the module doc)."""
    try:
        yield
    except (UserError, FileNotFoundError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print("\n".join(error_lines(error)), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
