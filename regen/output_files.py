"""The output JSONL, its error file and summary: naming, crash-safe appends, resume repair, compaction.

A conversation's rows go out in one whole-lines write, so after a crash (even ``kill -9``) only the last
block can be damaged: a torn last line, or a block with fewer rows than its ``metadata.num_generations``.
Resume cuts that block off and re-runs the conversation. The error file always means "failed and not
yet succeeded": on resume, and again at the end, rows of conversations now in the output are dropped
and only the newest row per id is kept.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from opd.atomic_write import atomic_write

# Rows start {"id": ..., "primary_id": ...} (compact or with spaces); num_generations sits in the metadata.
_HEAD = re.compile(rb'^\{"id": ?"(?:[^"\\]|\\.)*", ?"primary_id": ?("(?:[^"\\]|\\.)*")')
_DECLARED_ROWS = re.compile(rb'"num_generations": ?(\d+)')


@dataclass(frozen=True)
class OutputPaths:
    """``x.jsonl`` and its siblings ``x.errors.jsonl`` and ``x.summary.json``."""

    output: Path

    @property
    def errors(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.errors{self.output.suffix or '.jsonl'}")

    @property
    def summary(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.summary.json")


class IdSet:
    """A set of conversation ids held as 64-bit digests: about 8 bytes per id once settled.

    New digests go to a small Python set; every ``buffer`` additions they are merged into one sorted
    ``array('Q')`` (searched by bisection), so memory grows by 8 bytes per id, not a Python object's ~70.
    """

    def __init__(self, buffer: int = 16384) -> None:
        self._recent: set[int] = set()
        self._settled = array("Q")
        self._buffer = buffer

    @staticmethod
    def _digest(key: str) -> int:
        return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")

    def add(self, key: str) -> None:
        digest = self._digest(key)
        if self._has(digest):
            return
        self._recent.add(digest)
        if len(self._recent) >= self._buffer:
            self._settled = array("Q", heapq.merge(self._settled, sorted(self._recent)))
            self._recent.clear()

    def __contains__(self, key: str) -> bool:
        return self._has(self._digest(key))

    def _has(self, digest: int) -> bool:
        if digest in self._recent:
            return True
        position = bisect.bisect_left(self._settled, digest)
        return position < len(self._settled) and self._settled[position] == digest

    def __len__(self) -> int:
        return len(self._recent) + len(self._settled)


@dataclass
class ResumeState:
    """What a resumed run found: finished conversations, and what it cut off a crashed tail."""

    done_ids: IdSet = field(default_factory=IdSet)
    dropped_rows: int = 0
    dropped_bytes: int = 0


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
            raise ValueError(f"{path}:{line_number}: not a JSON row; the output file is damaged") from None
        primary_id = row.get("primary_id") or row.get("id") if isinstance(row, dict) else None
        if not primary_id:
            raise ValueError(f"{path}:{line_number}: row has no primary_id")
    declared = line.rfind(b'"num_generations":')
    count = _DECLARED_ROWS.match(line, declared) if declared >= 0 else None
    return str(primary_id), int(count.group(1)) if count else None


def repair_and_scan(path: Path) -> ResumeState:
    """Collect finished primary ids from an output file, cutting off a torn or incomplete last block."""
    state = ResumeState()
    if not path.is_file():
        return state
    block_id, block_start, block_rows, block_declared = None, 0, 0, None
    offset, cut_at = 0, None
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                cut_at = offset
                state.dropped_bytes += len(line)
                break
            primary_id, declared = _row_head(line, path, line_number)
            if primary_id != block_id:
                if block_declared is not None and block_rows != block_declared:
                    raise ValueError(f"{path}:{line_number}: conversation {block_id} has {block_rows} of "
                                     f"{block_declared} rows before another starts; the output file is damaged")
                if block_id is not None:
                    state.done_ids.add(block_id)
                block_id, block_start, block_rows, block_declared = primary_id, offset, 0, declared
            block_rows += 1
            offset += len(line)
    if block_id is not None:
        if block_declared is not None and block_rows < block_declared:
            cut_at = block_start
            state.dropped_rows = block_rows
        else:
            state.done_ids.add(block_id)
    if cut_at is not None:
        state.dropped_bytes += offset - cut_at
        with path.open("r+b") as handle:
            handle.truncate(cut_at)
    return state


def compact_errors(path: Path, succeeded, *, drop_input_errors: bool = False) -> set[str]:
    """Rewrite the error file: drop ids in ``succeeded`` and a torn last line, keep the newest row per id.

    ``drop_input_errors`` also drops rows about unreadable input (every run re-reads the input and records
    those again). Returns the ids left in the file.
    """
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
    atomic_write(path, lambda stream: stream.write(b"".join(newest.values())))
    return set(newest)


class LineAppender:
    """Appends whole-line JSON blocks (orjson, compact) to a file: one unbuffered write loop per block."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle = path.open("ab", buffering=0)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        data = b"".join(orjson.dumps(record) + b"\n" for record in records)
        view = memoryview(data)
        while view:
            view = view[self._handle.write(view):]

    def close(self) -> None:
        self._handle.close()
