"""The entries' run log (console and ``<hydra.run.dir>/<entry>.log``; the handlers of
``configs/hydra/job_logging/run_log.yaml``) and the progress display. Torch-free: Hydra imports it at logging set-up."""

from __future__ import annotations

import io
import logging
import re
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
    """The run log's file handler: a line it cannot write (a full disk) is dropped quietly, without a traceback."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)


class StdoutHandler(logging.StreamHandler):
    """The run log's console handler: writes to the current ``sys.stdout`` at each line, so rich's live display
    (which redirects it) keeps its bar below the lines."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the stream is always the current sys.stdout
        pass


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` on one line: each control character (newlines and escape sequences too) written as its escape, so
    nothing from outside (a served model's name, a path) starts a line of its own or moves the cursor."""
    return CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def show(renderable) -> None:
    """A line (``printable``) or a rich renderable (a table) as plain text to the run log."""
    if isinstance(renderable, str):
        renderable = printable(renderable)
    else:
        console = Console(file=io.StringIO(), width=190, color_system=None)  # every column unabridged
        console.print(renderable)
        renderable = console.file.getvalue().rstrip("\n")
    RUN_LOG.info(renderable)


def progress_bar(label: str, fields: str, console: Console | None = None) -> Progress:
    """A progress display: bar, done of total, ``fields`` (a ``TextColumn`` template), elapsed and remaining."""
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn(fields),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console)
