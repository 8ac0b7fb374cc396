"""A run that stops before its checks pass leaves no folders behind: what it makes is noted first
(:class:`NewRunFolders`, :func:`note_new_folder`, :func:`note_new_files`), and a job in :func:`discard_unless_checked`
that fails before :func:`checks_passed` removes the noted files and the noted folders that are then empty."""

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
    """Before making ``folder``: note it and its missing parents as this run's (an existing one is not noted);
    ``files`` are what the run writes there before its checks pass."""
    folder = Path(folder).expanduser().absolute()
    if folder.exists():
        return
    for path in (folder, *folder.parents):
        if path.exists():
            break
        _new.add(path)
    _files[folder] = tuple(files)


def note_new_files(*paths: str | Path) -> None:
    """Before making them: note each of ``paths`` that does not exist yet as this run's."""
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
    """Make ``folder`` and write a byte there before Hydra tries; failure is one ``error:`` line naming ``setting``,
    and what this made is removed. ``keep`` keeps what it made: a run's folder, since every torchrun rank checks it
    at once and none may remove it under another (a sweep's is removed: Hydra makes it after the other callbacks)."""
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
    """Hydra callback: notes the run's folders before Hydra makes them, and checks that it can."""

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
