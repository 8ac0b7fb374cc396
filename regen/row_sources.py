"""Where dataset rows come from: a Hugging Face dataset (streamed) or a local ``.json``/``.jsonl`` file.

Rows are yielded one at a time, so memory stays flat however large the source is. A local line that
is not a JSON object is yielded as a :class:`SourceRecord` with an ``error`` (and its line number) so
the run records it and goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCAL_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class SourceRecord:
    """One source row: ``idx`` is its 0-based position, ``where`` names it for error messages."""

    idx: int
    where: str
    row: Any = None
    error: str | None = None


def _jsonl_records(path: Path) -> Iterator[SourceRecord]:
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, 1):
            where = f"{path}:{line_number}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                yield SourceRecord(line_number - 1, where, error=f"not UTF-8 ({error.reason} at byte {error.start})")
                continue
            except json.JSONDecodeError as error:
                yield SourceRecord(line_number - 1, where, error=f"invalid JSON: {error.msg} (column {error.colno})")
                continue
            yield SourceRecord(line_number - 1, where, row=row)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _json_array_records(path: Path) -> Iterator[SourceRecord]:
    """Elements of a top-level JSON array, each with the line it starts on."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        raise ValueError(f"{path}: a .json dataset must be a top-level array of rows (use .jsonl for one row per line)")
    position, index, line, counted_to = position + 1, 0, 1, 0
    while True:
        position = _skip_space(text, position)
        if text.startswith("]", position):
            return
        line += text.count("\n", counted_to, position)
        counted_to = position
        try:
            row, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: invalid JSON ({error.msg}); fix the file or convert it to .jsonl") from None
        yield SourceRecord(index, f"{path}:{line}", row=row)
        index += 1
        position = _skip_space(text, position)
        if text.startswith(",", position):
            position += 1
        elif not text.startswith("]", position):
            raise ValueError(f"{path}:{line + text.count(chr(10), counted_to, position)}: expected ',' or ']' after row {index - 1}")


def local_records(path: str | Path) -> Iterator[SourceRecord]:
    """Rows of a local ``.jsonl`` (line by line) or ``.json`` (top-level array) file."""
    path = Path(path)
    if path.suffix.lower() not in LOCAL_SUFFIXES:
        raise ValueError(f"{path}: local datasets must be .json (top-level array) or .jsonl files")
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    return _jsonl_records(path) if path.suffix.lower() == ".jsonl" else _json_array_records(path)


def hub_records(path: str, subset: str | None, split: str) -> Iterator[SourceRecord]:
    """Rows of a Hugging Face dataset (hub id or local dataset folder), streamed."""
    from datasets import load_dataset  # heavy; only imported for hub sources

    label = f"{path}[{subset + '/' if subset else ''}{split}]"
    for index, row in enumerate(load_dataset(path, name=subset, split=split, streaming=True)):
        yield SourceRecord(index, f"{label} row {index}", row=row)


def open_records(dataset_cfg: Mapping) -> Iterator[SourceRecord]:
    """The rows of the ``dataset`` config block."""
    source = dataset_cfg["source"]
    if source == "local":
        return local_records(dataset_cfg["path"])
    if source == "hf":
        if not dataset_cfg.get("split"):
            raise ValueError(f"dataset.split is required for the hub dataset {dataset_cfg['path']}")
        return hub_records(dataset_cfg["path"], dataset_cfg.get("subset"), dataset_cfg["split"])
    raise ValueError(f"dataset.source={source!r} is unknown; use 'hf' or 'local'")
