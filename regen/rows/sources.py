"""Where dataset rows come from: a Hugging Face dataset (streamed) or a local ``.json``/``.jsonl`` file.

``open_source(dataset)`` opens the source at start, so an unreadable file stops the run before any server starts.
``records()`` yields :class:`SourceRecord` with its resume key (``primary_id``); an unusable row comes with an
``error`` and the run goes on. Each source also has ``fingerprint`` (compared on resume), ``locate(idx)`` and
``size()`` (the row count when known without reading the rows, else ``None``).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.chat_records import TOO_DEEP, json_lines, structure_problem
from common.user_errors import UserError
from regen.rows.conversation import primary_id_of
from regen.rows.speculators_keys import LocalFileKeys
from regen.settings import DatasetSettings

Warn = Callable[[str], None]


class SourceError(UserError):
    """A dataset that cannot be read at all; the message names the file (or hub dataset) and what is wrong."""


@dataclass(frozen=True)
class SourceRecord:
    """One source row: ``idx`` is its 0-based position, ``where`` names it for error messages."""

    idx: int
    where: str
    row: Any = None
    error: str | None = None
    primary_id: str | None = None  # None when the row is not a JSON object


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


class JsonlFile:
    """A local ``.jsonl``: one row per line (blank lines skipped), each with its line number."""

    def __init__(self, path: Path, warn: Warn):
        self.path, self.warn = path, warn
        self._fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = _file_sha256(self.path)
        return self._fingerprint

    def locate(self, idx: int) -> str:
        return f"{self.path}:{idx + 1}"

    def size(self) -> int:
        """The rows :meth:`records` yields: the non-blank lines (a BOM alone on the first line is blank)."""
        rows, line_has_text = 0, False
        with self.path.open("rb") as handle:
            chunk = handle.read(1 << 20).removeprefix(codecs.BOM_UTF8)
            while chunk:
                *ended, rest = chunk.split(b"\n")
                for line in ended:
                    rows += line_has_text or bool(line.strip())
                    line_has_text = False
                line_has_text = line_has_text or bool(rest.strip())
                chunk = handle.read(1 << 20)
        return rows + line_has_text

    def records(self) -> Iterator[SourceRecord]:
        """Each non-blank line (``common.chat_records``'s guarded reader); a bad line is a record with an ``error``."""
        keys = LocalFileKeys(self.path, self.warn)
        with self.path.open("rb") as handle:
            for ordinal, line in enumerate(json_lines(handle)):  # rows as datasets counts them: blank lines are not
                where = f"{self.path}:{line.number}"
                if line.problem is not None:
                    yield SourceRecord(line.number - 1, where, error=line.problem)
                else:
                    yield SourceRecord(line.number - 1, where, row=line.value, primary_id=keys.key(ordinal, line.value))


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _value_end(text: str, position: int) -> int:
    """Where the array or object starting at ``position`` ends (brackets counted outside strings, no recursion);
    the text's end when it never closes."""
    depth = 0
    for token in _TOKEN.finditer(text, position):
        if token.group() in "[{":
            depth += 1
        elif token.group() in "]}":
            depth -= 1
            if depth == 0:
                return token.end()
    return len(text)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


class JsonArrayFile:
    """A local ``.json`` holding one top-level array of rows; decoded and checked when opened."""

    def __init__(self, path: Path, warn: Warn):
        self.path, self.warn = path, warn
        data = path.read_bytes()
        self.fingerprint = "sha256:" + hashlib.sha256(data).hexdigest()
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):]
        try:
            self.text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SourceError(f"{path} is not UTF-8 ({error.reason} at byte {error.start})",
                              "save it as UTF-8, or convert it to .jsonl") from None
        self.start = _skip_space(self.text, 0)
        if self.start == len(self.text):
            raise SourceError(f"{path} is empty", "a .json dataset is one array of rows: [{...}, {...}]")
        if self.text[self.start] != "[":
            raise SourceError(f"{path} is not a top-level JSON array of rows",
                              "wrap the rows in [...], or write one row per line in a .jsonl file")

    def locate(self, idx: int) -> str:
        return f"{self.path} element {idx}"

    def size(self) -> None:
        """Unknown until the array is parsed (its elements are decoded one at a time as the run reads them)."""
        return None

    def records(self) -> Iterator[SourceRecord]:
        """Elements of the array, each named by the line it starts on and its index."""
        text, path = self.text, self.path
        keys = LocalFileKeys(path, self.warn)
        decoder = json.JSONDecoder()
        position, index, line, counted_to = self.start + 1, 0, 1 + text.count("\n", 0, self.start), self.start
        while True:
            position = _skip_space(text, position)
            if text.startswith("]", position):
                return
            line += text.count("\n", counted_to, position)
            counted_to = position
            where = f"{path}:{line} (element {index})"
            try:
                row, end = decoder.raw_decode(text, position)
                problem = structure_problem(row)
            except RecursionError:  # json's own limit: the element is skipped by its brackets
                row, end, problem = None, _value_end(text, position), TOO_DEEP
            except json.JSONDecodeError as error:
                raise SourceError(f"{path}:{error.lineno}: invalid JSON ({error.msg})",
                                  "fix the file, or convert it to .jsonl (one row per line)") from None
            position = end
            if problem is not None:
                yield SourceRecord(index, where, error=problem)
            else:
                yield SourceRecord(index, where, row=row, primary_id=keys.key(index, row))
            index += 1
            position = _skip_space(text, position)
            if text.startswith(",", position):
                position += 1
            elif not text.startswith("]", position):
                raise SourceError(f"{path}:{line + text.count(chr(10), counted_to, position)}: expected ',' or ']' "
                                  f"after element {index - 1}", "fix the file, or convert it to .jsonl")


class HubDataset:
    """A Hugging Face dataset (hub id or local dataset folder) streamed split by split."""

    def __init__(self, path: str, subset: str | None, split: str):
        from datasets import load_dataset_builder  # heavy; only imported for hub sources

        self.label = f"{path}[{subset + '/' if subset else ''}{split}]"
        self.split = split
        try:
            self.builder = load_dataset_builder(path, name=subset)
        except Exception as error:  # noqa: BLE001 - network, missing repo, bad subset: all end the run here
            raise SourceError(f"cannot open the hub dataset {self.label}: {type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}",
                              "check dataset.path/subset/split and your network (or HF_HUB_OFFLINE and the cache)"
                              ) from None
        self.fingerprint = f"builder:{self.builder.hash}"

    def locate(self, idx: int) -> str:
        return f"{self.label} row {idx}"

    def size(self) -> int | None:
        """The split's ``num_examples`` from the metadata already read, if any; nothing is fetched."""
        split = (self.builder.info.splits or {}).get(self.split)
        return (split.num_examples or None) if split is not None else None

    def records(self) -> Iterator[SourceRecord]:
        try:
            rows = self.builder.as_streaming_dataset(split=self.split)
        except Exception as error:  # noqa: BLE001 - e.g. an unknown split
            raise SourceError(f"cannot stream {self.label}: {type(error).__name__}: {error}",
                              "check dataset.split") from None
        for index, row in enumerate(rows):
            problem = structure_problem(row)
            if problem is not None:
                yield SourceRecord(index, self.locate(index), error=problem)
                continue
            key = primary_id_of(row) if isinstance(row, dict) else None
            yield SourceRecord(index, self.locate(index), row=row, primary_id=key)


Source = JsonlFile | JsonArrayFile | HubDataset


def open_source(dataset: DatasetSettings, warn: Warn | None = None) -> Source:
    """The rows of the ``dataset`` settings (already checked: source, path, split)."""
    warn = warn or (lambda message: None)
    if dataset.source == "hf":
        return HubDataset(dataset.path, dataset.subset, dataset.split)
    path = Path(dataset.path)
    return JsonlFile(path, warn) if path.suffix.lower() == ".jsonl" else JsonArrayFile(path, warn)
