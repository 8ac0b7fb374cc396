"""Ctrl-C and SIGTERM while a run trains: the step in progress finishes and is saved, and the run ends with
``error: interrupted (SIGTERM) after step 37 of 500; continue with resume=<file>``, status 128 + the signal.

Every rank stops after the same step (``StepStop.agreed``, a collective). A second Ctrl-C stops at once, unsaved; a
second SIGTERM changes nothing. Under torchrun a rank whose step fails while it keeps a signal ends by that signal.
In one process, a step that waits on a server stops waiting at the signal (``StepAbandoned``), and one that fails
(a server gone, say) ends the run with a ``UserError``: either way the last finished step is saved first.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from common.run_log import show
from common.start_up import quiet_finalizers
from common.stop_signals import handling
from common.user_errors import Interrupted, under_torchrun
from opd.training.distributed import Ranks

AGAIN = "error: interrupted again; the steps since the last checkpoint are lost"


class StepAbandoned(Exception):
    """The step in progress cannot finish before the run stops (a signal while it waited on a server): it is
    dropped, and the last finished step is what the run saves."""


class StepStop:
    """The loop's handler: keeps the first signal; a second Ctrl-C raises ``Interrupted`` at once."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.caught: int | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.caught is None:
            self.caught = signum
            if self.ranks.is_main:
                again = signum == signal.SIGINT and not under_torchrun()  # there torchrun gets the next Ctrl-C
                show(f"{signal.Signals(signum).name}: stopping after this step, which is saved"
                     + (" (Ctrl-C again stops at once, without saving)" if again else ""))
        elif signum == signal.SIGINT:
            quiet_finalizers()
            raise Interrupted(signum, AGAIN)

    def requested(self) -> bool:
        """Whether this rank has kept a signal (the step in progress may stop waiting)."""
        return self.caught is not None

    def agreed(self) -> int:
        """The signal the run stops on (0: none): the largest any rank kept. A collective: every rank calls it."""
        return self.ranks.largest(self.caught or 0)

    def interrupted(self, signum: int, step: int, total: int, resume: Any) -> Interrupted:
        """The run's end after ``step`` was saved (``resume``: its resume file, known on rank 0)."""
        then = f"; continue with resume={resume}" if resume else ""
        return Interrupted(signum, f"error: interrupted ({signal.Signals(signum).name}) after step {step} of {total}"
                                   + then)


@contextmanager
def stopping(ranks: Ranks) -> Iterator[StepStop]:
    """Handle SIGINT and SIGTERM as the module doc says while the block runs; yields the handler."""
    stop = StepStop(ranks)
    with handling(stop._handle):
        try:
            yield stop
        except Exception:
            if stop.caught is not None and ranks.distributed:  # torchrun stopped the job of a failed rank
                signal.signal(stop.caught, signal.SIG_DFL)
                os.kill(os.getpid(), stop.caught)
            raise
