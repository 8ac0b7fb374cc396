"""Ctrl-C and SIGTERM while a run trains (the step loop of ``opd.training.loop``): the step in progress finishes, the
run saves it as it saves every ``save_interval`` steps, and ends with one line naming the file to resume from.

``stopping(ranks)`` holds the handler over the step loop (``common.stop_signals.handling``). The first signal is
kept and said once in the run log. After every step the ranks agree on it (``StepStop.agreed``: the largest signal
any rank kept, one all-reduce under torchrun, so every rank stops after the same step); unless that step was the
last, the loop saves it and raises ``StepStop.interrupted``: ``error: interrupted (SIGTERM) after step 37 of 500;
continue with resume=<its resume file>``, exit status 128 + the signal number (130, 143). The resumed run is the
run that was never stopped, as from any resume file (``opd.training.checkpoints``).

A second Ctrl-C stops at once: ``error: interrupted again; the steps since the last checkpoint are lost``. A second
SIGTERM changes nothing: whoever sent the first follows it with SIGKILL after a grace period (a scheduler's, or
torchrun's ``--shutdown_timeout``, 30 s by default), which is the time a step has to finish.

Under torchrun the ranks get the signal from torchrun, which also stops the ranks of a job whose other rank failed
with SIGTERM. Their step then cannot finish (a collective has lost a rank): a rank whose step fails while it keeps a
signal ends by that signal, as it did before signals were handled, so the failed rank's error is the job's.

Before the loop (loading, restoring a resume file) and after it (the summary), either signal ends the run at once
(``common.start_up.started``): ``error: interrupted`` (130) or ``error: interrupted (SIGTERM)`` (143).
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
