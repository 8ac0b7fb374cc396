"""A run that stops before its checks pass leaves no folders behind.

Hydra makes a run's folder (``outputs/<entry>/<date>/<time>/``: ``.hydra/`` and the log) before the job's code
runs, opd's entries make and lock their ``out_dir`` before loading anything, and regen opens its output (folder,
lock, empty files, manifest) before it asks the server for its model. A run that then stops at its checks (a
setting, a missing data file or checkpoint, an output that exists, a server that does not answer) has put nothing
of use there. The checks end where each job calls :func:`checks_passed`: regen once the server serves the model
(``regen.job``), opd's entries once data, models and ``out_dir`` are checked, before any compute.

:class:`NewRunFolders`, a Hydra callback every entry's config lists (``configs/job_dirs.yaml``), notes which of the
run's folders do not exist yet, before Hydra makes them, and checks that Hydra can make them and write there
(:func:`check_run_folder`: a ``hydra.run.dir`` under a file, without permission or on a full disk is one ``error:``
line, where Hydra's own attempt ends in its traceback); :func:`note_new_folder` notes a folder an entry makes
itself (opd's ``out_dir``, regen's output folder). :func:`discard_unless_checked` wraps a job: when the job ends with
an error (or Ctrl-C) before it calls :func:`checks_passed`, each noted folder loses the files this run put there at
its start (Hydra's config copies and log, the lock) and is removed if that leaves it empty, and so is each parent
this run made; files it made in a folder that was there before (:func:`note_new_files`: regen's empty output and
manifest) are removed too. A folder holding anything else (another run's files) stays as it is. After :func:`checks_passed`
nothing is removed: the folders and the log are the run's record.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from hydra.experimental.callback import Callback
from hydra.types import RunMode

from common.user_errors import UserError, exit_on_user_error

HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")

_new: set[Path] = set()  # folders this run made: noted before they existed
_files: dict[Path, tuple[str, ...]] = {}  # a noted folder -> the files this run writes there before its checks
_new_files: set[Path] = set()  # files this run made in a folder that was there before (regen's empty output)
_checked = False
_sweep: Path | None = None  # a sweep folder this run made (-m): its jobs' folders are this run's too


def forget() -> None:
    """A job ended, or its checks passed: nothing is noted (a sweep's own folder aside)."""
    global _checked
    _new.clear()
    _files.clear()
    _new_files.clear()
    _checked = False


def note_new_folder(folder: str | Path, files: tuple[str, ...] = ()) -> None:
    """Before making ``folder``: note it, and each parent that does not exist yet, as made by this run; ``files``
    (relative to ``folder``) are what the run writes there before its checks pass. A folder that exists is not
    noted."""
    folder = Path(folder).expanduser().absolute()
    if folder.exists():
        return
    for path in (folder, *folder.parents):
        if path.exists():
            break
        _new.add(path)
    _files[folder] = tuple(files)


def note_new_files(*paths: str | Path) -> None:
    """Before making them: note each of ``paths`` that does not exist yet as made by this run, wherever it is (a run
    stopped at its checks removes them; :func:`note_new_folder` covers the folders it makes)."""
    _new_files.update(path for path in (Path(p).expanduser().absolute() for p in paths) if not path.exists())


def checks_passed() -> None:
    """The run's checks passed: from here on its folders are kept whatever happens."""
    global _checked
    forget()
    _checked = True


def _discard() -> None:
    """Remove what the module doc says: the noted files, then empty folders, deepest first."""
    for path in _new_files:
        with suppress(OSError):
            path.unlink()
    for folder in sorted(_files, key=lambda path: len(path.parts), reverse=True):
        if folder not in _new:
            continue
        for name in _files[folder]:
            with suppress(OSError):
                (folder / name).unlink()
        with suppress(OSError):
            inner = sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()),
                           key=lambda path: len(path.parts), reverse=True)
            for path in (*inner, folder, *(p for p in folder.parents if p in _new)):
                with suppress(OSError):  # not empty: it holds what someone else put there
                    path.rmdir()


@contextmanager
def discard_unless_checked() -> Iterator[None]:
    """The job's block: ending with an error before :func:`checks_passed` removes the noted folders (module doc)."""
    try:
        yield
    except BaseException:
        if not _checked:
            _discard()
        raise
    finally:
        forget()


def check_run_folder(folder: Path, setting: str, *, keep: bool) -> None:
    """Check that Hydra can make its run (or sweep) ``folder`` and write there, before it tries (its own attempt
    ends in its traceback): make it and write a byte there; ``setting`` is the key that names it. A folder that cannot
    be made or written to (a path that cannot exist, a file, no permission, a full disk) ends the run with one
    ``error:`` line and a hint, and what this made is removed. Otherwise ``keep`` keeps the folders made: a run's, which
    Hydra makes next anyway and which every rank of a torchrun job checks at once (none may remove it under
    another); a sweep's is removed, since Hydra makes it only after the other callbacks' checks (regen's shared
    server)."""
    made = [path for path in (folder, *folder.parents) if not path.exists()]  # deepest first
    try:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{setting}={folder} is not a folder", f"choose another {setting}=")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder) as probe:
                probe.write(b"\0")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as error:
            hint = "make room on that disk, or choose another" if error.errno == errno.ENOSPC else "choose another"
            raise UserError(f"cannot write to the run folder {folder} ({setting}): {error.strerror or error}",
                            f"{hint} {setting}=") from None
    except UserError:
        _remove_empty(made)
        forget()
        with exit_on_user_error():  # its SystemExit passes through Hydra, which reports only Exceptions
            raise
    if not keep:
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    for path in folders:
        with suppress(OSError):  # not empty: someone else wrote there
            path.rmdir()


class NewRunFolders(Callback):
    """Notes a run's Hydra folders before Hydra makes them, and checks that it can (``hydra.callbacks`` in
    ``configs/job_dirs.yaml``; ``check_run_folder``)."""

    def __init__(self, run_dir_setting: str = "hydra.run.dir") -> None:
        self.run_dir_setting = run_dir_setting  # the key a person sets to move the run folder (an experiment's out_dir)

    def on_run_start(self, config, **kwargs) -> None:
        global _sweep
        forget()
        _sweep = None
        # `now` in the folder's name is cached in this config: Hydra makes exactly this folder
        folder = Path(str(config.hydra.run.dir)).expanduser().absolute()
        note_new_folder(folder, (*HYDRA_FILES, f"{config.hydra.job.name}.log"))
        check_run_folder(folder, self.run_dir_setting, keep=True)

    def on_multirun_start(self, config, **kwargs) -> None:
        global _sweep
        forget()
        sweep = Path(str(config.hydra.sweep.dir)).expanduser().absolute()
        _sweep = None if sweep.exists() else sweep
        note_new_folder(sweep, ("multirun.yaml",))
        check_run_folder(sweep, "hydra.sweep.dir", keep=False)

    def on_job_start(self, config, **kwargs) -> None:
        """A job of a sweep this run made: its folder (made by now, inside the sweep's) is this run's."""
        if _sweep is None or config.hydra.mode != RunMode.MULTIRUN:
            return
        folder = Path(config.hydra.runtime.output_dir).absolute()
        if _sweep in folder.parents:
            _new.update(p for p in (folder, *folder.parents) if _sweep in p.parents)
            _files[folder] = (*HYDRA_FILES, f"{config.hydra.job.name}.log")
