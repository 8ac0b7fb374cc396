"""The entries' run log: lines and tables to the console and to ``<hydra.run.dir>/<entry>.log``
(``configs/hydra/job_logging/run_log.yaml``, whose two handlers are here), and the progress display of long work.
Torch-free: Hydra imports the handlers when it sets logging up, before a command has checked its config."""

from __future__ import annotations

import io
import logging
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

RUN_LOG = logging.getLogger("opd")  # the entries' progress and summary lines (show)


class RunLogFile(logging.FileHandler):
    """The file handler of the entries' run log (``<hydra.run.dir>/<entry>.log``): a line it cannot write (a full
    disk) is left out of the file quietly, not reported as logging's "--- Logging error ---" and a traceback. The
    console has the line, and the run's next write to that disk (``metrics.jsonl`` after every step, a checkpoint)
    ends it with the one error naming the file."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)


class StdoutHandler(logging.StreamHandler):
    """The console handler of the entries' run log (``configs/hydra/job_logging/run_log.yaml``): writes to
    ``sys.stdout`` as it is at each line, so rich's live progress display (which redirects it) keeps its bar below
    the lines instead of being written over."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the stream is always the current sys.stdout
        pass


def show(renderable) -> None:
    """A line or a rich renderable (a table) as plain text to the run log: the console and, under Hydra,
    ``<hydra.run.dir>/<entry>.log`` (``configs/hydra/job_logging/run_log.yaml``)."""
    if not isinstance(renderable, str):
        console = Console(file=io.StringIO(), width=190, color_system=None)  # every column unabridged
        console.print(renderable)
        renderable = console.file.getvalue().rstrip("\n")
    RUN_LOG.info(renderable)


def progress_bar(label: str, fields: str, console: Console | None = None) -> Progress:
    """A progress display of ``label``'s task: a bar, done of total, ``fields`` (a ``TextColumn`` template), the
    time elapsed and the estimated time remaining."""
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn(fields),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console)
