"""Entries run inside the test's own process, as a shell would run them, without a new interpreter.

A fresh interpreter costs seconds (``import torch`` alone), so the tests call an entry's Hydra ``main`` here with
``sys.argv`` set, from the folder given, and read back what it printed and its exit status. Tests that need what
only a separate process shows (signals, ``kill -9``, locks held by another process, torchrun) still start one.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from tests.helpers.paths import CONFIG_DIR


@dataclass
class Ran:
    """What a run printed and how it ended; the fields ``subprocess.CompletedProcess`` has."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_main(main: Callable[[], None], *arguments: str, cwd: Path | str | None = None, env: dict | None = None,
             program: str = "entry", hydra: bool = True) -> Ran:
    """``main()`` with ``sys.argv = [program, *arguments]`` from ``cwd`` (the current folder by default) and with
    ``env`` as the environment if given: its output and its exit status (0 when it returns, the ``SystemExit``
    code otherwise). The folder, ``sys.argv``, the environment, the logging handlers and the SIGINT / SIGTERM
    handlers are restored afterwards.

    The product's entries name their config tree by its absolute path (``common.package_files.CONFIG_DIR``), but an
    experiment's ``config_path`` (``../../configs``) is relative to its file only when it runs as a script; imported
    as a module Hydra would look for a package, so the run names the repository's ``configs/`` with
    ``--config-path`` (``hydra=False``: a plain argparse entry, given ``arguments`` only)."""
    out, err = io.StringIO(), io.StringIO()
    argv, folder, environment = sys.argv, os.getcwd(), dict(os.environ)
    handlers, level = list(logging.root.handlers), logging.root.level
    signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = [program, *(("--config-path", str(CONFIG_DIR)) if hydra else ()), *arguments]
    code = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
            except SystemExit as ended:
                code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
                if isinstance(ended.code, str):
                    print(ended.code, file=sys.stderr)
    finally:
        # Hydra keeps the last run's config in process-wide singletons: code run later (a test calling a job's
        # run() directly) would take it for its own Hydra run.
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
        for handler in set(logging.root.handlers) - set(handlers):  # the run's log file and console handlers
            handler.close()
        logging.root.handlers[:], logging.root.level = handlers, level
        for signum, handler in signals.items():  # an entry's own Ctrl-C / SIGTERM handling ends with it
            signal.signal(signum, handler)
        sys.argv = argv
        os.chdir(folder)
        if env is not None:
            os.environ.clear()
            os.environ.update(environment)
    return Ran(list(arguments), code, out.getvalue(), err.getvalue())
