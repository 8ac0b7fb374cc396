"""The Python logging handlers of the entries' run log (``configs/hydra/job_logging/run_log.yaml``): the console and
``<hydra.run.dir>/<entry>.log``. Their own module, imported when Hydra sets logging up, before the config is checked:
nothing here may import torch (a typo is refused before it loads)."""

from __future__ import annotations

import logging
import sys


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
