"""The output JSONL and its siblings: naming, crash-safe appends, resume repair, error compaction.

A conversation's rows go out in one whole-lines write, so after a crash only the last block can be damaged (a torn
line, or fewer rows than its ``metadata.num_generations``); resume cuts it off and drops later duplicate blocks,
keeping the first. The error file holds only conversations that failed and have not since succeeded, newest row per id.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import heapq
import json
import os
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from common.atomic_write import atomic_write, no_space
from common.user_errors import UserError

# Rows start {"id": ..., "primary_id": ...} (compact or with spaces); num_generations sits in the metadata.
_HEAD = re.compile(rb'^\{"id": ?"(?:[^"\\]|\\.)*", ?"primary_id": ?("(?:[^"\\]|\\.)*")')
_DECLARED_ROWS = re.compile(rb'"num_generations": ?(\d+)')


@dataclass(frozen=True)
class OutputPaths:
    """``x.jsonl`` and its siblings ``x.errors.jsonl``, ``x.summary.json``, ``x.manifest.json`` and ``x.lock``."""

    output: Path

    @property
    def errors(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.errors{self.output.suffix or '.jsonl'}")

    @property
    def summary(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.summary.json")

    @property
    def manifest(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.manifest.json")

    @property
    def lock(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.lock")

    def match_output_mode(self, sibling: Path) -> None:
        """Give ``sibling`` the output's permissions; nothing when the output is gone."""
        try:
            mode = self.output.stat().st_mode & 0o7777
        except FileNotFoundError:
            return
        os.chmod(sibling, mode)


class OutputGoneError(UserError):
    """The file an appender writes was deleted or replaced while the run wrote it."""

    def __init__(self, path: Path):
        super().__init__(f"{path} was deleted or replaced while regen wrote to it: what it appended since went with "
                         "the old file", "run again with resume=true: it regenerates what the file does not hold")


class DamagedOutputError(UserError):
    """An output file that resume cannot repair on its own (damage before the last block)."""

    def __init__(self, message: str):
        super().__init__(message, "fix or remove that part of the file, or write to a new output=")


class IdIndex:
    """Conversation ids held as 64-bit digests, each with an integer (the first given for an id is kept): a small
    dict, merged into two sorted arrays once it holds an eighth of them (at least ``buffer``): 16 bytes per id."""

    def __init__(self, buffer: int = 16384) -> None:
        self._recent: dict[int, int] = {}
        self._digests = array("Q")
        self._values = array("q")
        self._buffer = buffer

    @staticmethod
    def _digest(key: str) -> int:
        return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")

    def add(self, key: str, value: int = 0) -> None:
        digest = self._digest(key)
        if self._find(digest) is not None:
            return
        self._recent[digest] = value
        if len(self._recent) >= max(self._buffer, len(self._digests) // 8):
            self._merge()

    def _merge(self) -> None:
        """Move the recent entries into the sorted arrays, streamed (no Python object per settled entry)."""
        digests, values = array("Q"), array("q")
        put_digest, put_value = digests.append, values.append
        for digest, value in heapq.merge(zip(self._digests, self._values, strict=True), sorted(self._recent.items())):
            put_digest(digest)
            put_value(value)
        self._digests, self._values = digests, values
        self._recent.clear()

    def get(self, key: str) -> int | None:
        """The value stored with ``key``, ``None`` when it is not in the index."""
        return self._find(self._digest(key))

    def __contains__(self, key: str) -> bool:
        return self._find(self._digest(key)) is not None

    def _find(self, digest: int) -> int | None:
        if digest in self._recent:
            return self._recent[digest]
        position = bisect.bisect_left(self._digests, digest)
        if position < len(self._digests) and self._digests[position] == digest:
            return self._values[position]
        return None

    def __len__(self) -> int:
        return len(self._recent) + len(self._digests)


@dataclass
class ResumeState:
    """What a resumed run found: finished conversations, what it cut off a crashed tail, and the
    duplicate blocks it removed."""

    done_ids: IdIndex = field(default_factory=IdIndex)
    dropped_rows: int = 0
    dropped_bytes: int = 0
    removed_duplicate_blocks: int = 0
    removed_duplicate_rows: int = 0


def sanitize_name(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^\w.=,+-]+", "_", text).strip("._") or "unnamed"


def _row_head(line: bytes, path: Path, line_number: int) -> tuple[str, int | None]:
    match = _HEAD.match(line)
    if match:
        primary_id = json.loads(match.group(1))
    else:
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DamagedOutputError(f"{path}:{line_number}: not a JSON row; the output file is damaged") from None
        primary_id = row.get("primary_id") or row.get("id") if isinstance(row, dict) else None
        if not primary_id:
            raise DamagedOutputError(f"{path}:{line_number}: row has no primary_id")
    declared = line.rfind(b'"num_generations":')
    count = _DECLARED_ROWS.match(line, declared) if declared >= 0 else None
    return str(primary_id), int(count.group(1)) if count else None


@dataclass
class _Block:
    primary_id: str
    start: int
    declared: int | None
    rows: int = 0
    end: int = 0

    @property
    def complete(self) -> bool:
        return self.declared is None or self.rows == self.declared


def repair_and_scan(path: Path) -> ResumeState:
    """Collect finished primary ids from an output file, cutting off a torn or incomplete last block and
    removing every complete block of an id already seen (the first one is kept)."""
    state = ResumeState()
    if not path.is_file():
        return state
    duplicates: list[_Block] = []
    block: _Block | None = None
    offset, cut_at = 0, None

    def close(current: _Block, line_number: int) -> None:
        if not current.complete:
            raise DamagedOutputError(f"{path}:{line_number}: conversation {current.primary_id} has {current.rows} of "
                             f"{current.declared} rows before another starts; the output file is damaged")
        if current.primary_id in state.done_ids:
            duplicates.append(current)
        else:
            state.done_ids.add(current.primary_id)

    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                cut_at = offset
                state.dropped_bytes += len(line)
                break
            primary_id, declared = _row_head(line, path, line_number)
            if block is None or primary_id != block.primary_id or (block.declared is not None and block.complete):
                if block is not None:
                    close(block, line_number)
                block = _Block(primary_id, offset, declared)
            block.rows += 1
            offset += len(line)
            block.end = offset
    if block is not None:
        if block.complete:
            close(block, line_number)
        else:
            cut_at = block.start
            state.dropped_rows = block.rows
    if cut_at is not None:
        state.dropped_bytes += offset - cut_at
    if duplicates:
        state.removed_duplicate_blocks = len(duplicates)
        state.removed_duplicate_rows = sum(b.rows for b in duplicates)
        keep_until = offset if cut_at is None else cut_at
        _rewrite_without(path, [(b.start, b.end) for b in duplicates], keep_until)
    elif cut_at is not None:
        with path.open("r+b") as handle:
            handle.truncate(cut_at)
    return state


def _rewrite_without(path: Path, ranges: list[tuple[int, int]], keep_until: int) -> None:
    """Replace ``path`` (atomically) by its bytes up to ``keep_until`` without the byte ``ranges``."""

    def copy(stream) -> None:
        with path.open("rb") as source:
            position = 0
            for start, end in [*ranges, (keep_until, keep_until)]:
                source.seek(position)
                remaining = start - position
                while remaining > 0:
                    chunk = source.read(min(remaining, 1 << 20))
                    stream.write(chunk)
                    remaining -= len(chunk)
                position = end

    atomic_write(path, copy, keep_until - sum(end - start for start, end in ranges))


def compact_errors(path: Path, succeeded, *, drop_input_errors: bool = False) -> set[str]:
    """Rewrite the error file without ids in ``succeeded`` (and input errors with ``drop_input_errors``) or a torn
    last line, newest row per id; returns the ids left."""
    if not path.is_file():
        return set()
    newest: dict[str, bytes] = {}
    with path.open("rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
                key, stage = str(record["id"]), record["metadata"].get("stage")
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                continue
            newest.pop(key, None)  # re-insert so the order follows the newest row
            if key not in succeeded and not (drop_input_errors and stage == "input"):
                newest[key] = line
    kept = b"".join(newest.values())
    atomic_write(path, lambda stream: stream.write(kept), len(kept))
    return set(newest)


class LineAppender:
    """Appends whole-line JSON blocks to a file. A block that does not fit (full disk) is cut off again and raises
    ``no_space``, so the file ends with whole blocks; after each block, ``OutputGoneError`` if the path no longer
    names the file written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle = path.open("ab", buffering=0)  # a new file gets the umask's permissions

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        data = b"".join(orjson.dumps(record) + b"\n" for record in records)
        start = os.fstat(self._handle.fileno()).st_size  # the one writer (the run's lock): the block starts here
        view = memoryview(data)
        try:
            while view:
                view = view[self._handle.write(view):]
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            os.ftruncate(self._handle.fileno(), start)
            raise no_space(self.path, len(data)) from None
        self.check_in_place()

    def check_in_place(self) -> None:
        """Raise ``OutputGoneError`` unless the path still names the file this appender writes."""
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            raise OutputGoneError(self.path) from None
        written = os.fstat(self._handle.fileno())
        if (named.st_dev, named.st_ino) != (written.st_dev, written.st_ino):
            raise OutputGoneError(self.path)

    def close(self) -> None:
        self._handle.close()
