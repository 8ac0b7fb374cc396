"""Errors a person caused (a setting, a data file, a checkpoint path) and how the entries report them.

Anything raised as ``UserError`` (or ``FileNotFoundError``) inside ``exit_on_user_error`` prints as
``error: ...`` lines on stderr and exits with status 2, without a traceback; Ctrl-C exits with 130.
``HYDRA_FULL_ERROR=1`` re-raises, to see the traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(ValueError):
    """Bad input a person can fix; the message says what is wrong and where."""


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn user errors into ``error:`` lines and a non-zero exit (see the module doc)."""
    try:
        yield
    except (UserError, FileNotFoundError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        first, *rest = str(error).splitlines() or [type(error).__name__]
        print("error: " + first, *rest, sep="\n", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
