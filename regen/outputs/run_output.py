"""Opening a run's output: name it, lock it, refuse an earlier run's files without ``resume=true``, check the
manifest, repair a resumed file, and yield the :class:`RunOutput` the conversations are written to.

Symlinks are followed (the lock and siblings sit beside the real file) and hard-linked files refused, so two runs
never write one file under two names.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.run_folders import note_new_files, note_new_folder
from common.run_lock import OutputLock
from common.user_errors import UserError
from regen.outputs.output_files import (
    LineAppender,
    OutputPaths,
    ResumeState,
    compact_errors,
    repair_and_scan,
    sanitize_name,
)
from regen.outputs.run_manifest import check_and_record
from regen.settings import RegenSettings


def output_paths(settings: RegenSettings, model: str, overrides: str | None) -> OutputPaths:
    """``output``, else ``{output_dir}/{dataset name or file stem}_{model}[_{overrides}].jsonl``; the model is its
    last path part without a ``.pth``/``.pt``, ``overrides`` a multirun job's."""
    if settings.output:
        path = Path(settings.output)
    else:
        source = settings.dataset.name or Path(settings.dataset.path).stem
        model_short = re.sub(r"\.pth?$", "", model.rstrip("/").split("/")[-1])
        suffix = "" if overrides is None else "_" + sanitize_name(overrides)
        path = Path(settings.output_dir) / f"{sanitize_name(source)}_{sanitize_name(model_short)}{suffix}.jsonl"
    real = Path(os.path.realpath(path))  # through symlinks, to the file itself
    return OutputPaths(real if real != Path(os.path.abspath(path)) else path)


@dataclass
class RunOutput:
    """The open output of one run: its files, what resume found there, the appenders."""

    paths: OutputPaths
    resume: ResumeState  # the conversations already done (empty without resume=true)
    previous_error_ids: frozenset[str]  # the error file's ids at the start
    rows: LineAppender
    errors: LineAppender

    def close(self) -> None:
        self.rows.close()
        self.errors.close()


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def _refuse_unsafe_output(paths: OutputPaths) -> None:
    """Refuse a folder, a non-regular file (``/dev/null``, a FIFO) or a hard-linked file, before any file is
    created."""
    output = paths.output
    if output.is_dir():
        raise UserError(f"output={output} is a folder, not a file",
                        f"name a file in it (output={output}/rows.jsonl), or set output_dir={output} instead")
    for path in (output, paths.errors):
        mode = path.stat().st_mode if path.exists() else None
        kind = next((name for test, name in _KINDS if mode is not None and test(mode)), None)
        if kind is not None:
            raise UserError(f"{path} is {kind}, not a regular file: regen writes its rows, error file, summary and "
                            "manifest as files beside the output, to be resumed",
                            "choose an output= that is a new or regular file (e.g. output=out/regen/rows.jsonl)")
    if output.is_file() and output.stat().st_nlink > 1:
        raise UserError(f"{output} has {output.stat().st_nlink} names (hard links): a run given another of them "
                        "would write the same file at the same time",
                        f"copy it (cp {output} NEW.jsonl) and resume the copy with output=NEW.jsonl")


def _refuse_earlier_run(paths: OutputPaths) -> None:
    for path in (paths.output, paths.errors):
        if path.is_file() and path.stat().st_size:
            raise UserError(f"{path} exists from an earlier run",
                            "pass resume=true to continue it, or choose another output= (or remove the old files)")


def remove_stale_temps(paths: OutputPaths) -> None:
    """Remove the ``.{name}.*.tmp`` files a killed earlier run left beside the output (safe: the lock is held)."""
    for target in (paths.output, paths.errors, paths.summary, paths.manifest):
        for temp in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
            temp.unlink(missing_ok=True)


@contextmanager
def open_output(settings: RegenSettings, paths: OutputPaths, current: dict[str, Any],
                warn: Callable[[str], None]) -> Iterator[RunOutput]:
    """The run's :class:`RunOutput` at ``paths``, locked until the block ends; a resume is checked against the
    manifest with ``current`` (``run_manifest.run_settings``)."""
    _refuse_unsafe_output(paths)
    # a run that stops before its checks pass removes the folder again if it made it (common.run_folders)
    note_new_folder(paths.output.parent, tuple(p.name for p in (paths.output, paths.errors, paths.manifest, paths.lock)))
    lock = OutputLock(paths.lock, paths.output, job="regen", remove_on_release=True,
                      hint="wait for it to finish (or stop it), or choose another output=")
    try:
        lock.acquire()
    except OSError as error:  # the folder cannot be made or written
        raise UserError(f"cannot write the output {paths.output} ({error.strerror or error})",
                        "choose another output= or output_dir=") from None
    # with the lock held (a run refused by another's lock must not take that run's new files for its own)
    note_new_files(paths.output, paths.errors, paths.manifest)
    try:
        remove_stale_temps(paths)
        if not settings.resume:
            _refuse_earlier_run(paths)
        rows = LineAppender(paths.output)  # created first: the siblings copy its permissions
        try:
            paths.match_output_mode(paths.lock)
            accepted = check_and_record(paths, current, resuming=settings.resume,
                                        accept_changes=settings.resume_accept_changes, warn=warn)
            for key, (old, new) in accepted.items():
                warn(f"resume_accept_changes: {key} was {old!r}, now {new!r} (recorded in the manifest)")
            if settings.resume:
                resume = repair_and_scan(paths.output)
                if resume.removed_duplicate_blocks:  # the repair replaced the file: append to the new one
                    rows.close()
                    rows = LineAppender(paths.output)
                previous = frozenset(compact_errors(paths.errors, resume.done_ids, drop_input_errors=True))
            else:
                resume, previous = ResumeState(), frozenset()
            errors = LineAppender(paths.errors)
            paths.match_output_mode(paths.errors)
        except BaseException:
            rows.close()
            raise
        output = RunOutput(paths, resume, previous, rows, errors)
        try:
            yield output
        finally:
            output.close()
    finally:
        lock.release()
