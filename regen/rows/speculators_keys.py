"""Resume keys of a local file's rows, exactly as ``speculators regenerate-responses`` 0.9.0 computes them.

A row without ``id``/``uuid`` is keyed by the sha256 of the row ``datasets`` yields for it (every column, absent ones
null, types unified, mixed-shape objects JSON-encoded), not of the line as written. :class:`ArrowView` ports the JSON
builder of ``datasets`` 5.1.0 onto ``pyarrow`` (same chunks, block sizes and casts: the same table) without importing
``datasets`` or torch, holding one chunk at a time. Where it does not mirror ``datasets`` it raises
:class:`NotMirrored` and ``datasets`` itself reads on; where ``datasets`` cannot read the file either, the remaining
id-less rows are keyed by their own JSON. ``tests/regen/test_speculators_keys.py`` pins the parity.
"""

from __future__ import annotations

import codecs
import itertools
import json
import mmap
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from regen.rows.conversation import content_hash, explicit_id

CHUNK_BYTES = 10 << 20  # datasets' JsonConfig.chunksize: the file is read (and typed) this much at a time
# Agent-trace files are decoded by datasets into another schema (with the optional teich package): columns that
# make datasets look for those markers (packaged_modules/json/json.py, AGENT_TRACES_FEATURES_MARKERS).
AGENT_TRACE_MARKERS = [{"type", "message"}, {"type", "payload"}, {"id", "source", "model", "system_prompt", "messages"},
                       {"type", "id", "version", "cwd"}]
# Where stdlib json and pandas' ujson may parse a line differently (NaN, Infinity, integers beyond 64 bits), the
# detection of mixed-shape objects uses ujson itself.
_UJSON_ONLY = re.compile(rb"NaN|Infinity|\d{19}")


class NotMirrored(Exception):
    """``datasets`` takes a path here that :class:`ArrowView` does not reproduce: read on with ``datasets``."""


class DatasetsCannotRead(Exception):
    """A file ``datasets`` 5.1.0 would not get through (it raises or loops), so speculators could not read it."""


def _ujson():
    """pandas' ujson ``(loads, dumps)``: what datasets uses (``datasets.utils.json``); imported only when needed."""
    from pandas.io.json import ujson_dumps, ujson_loads

    return ujson_loads, ujson_dumps


class _Shapes:
    """The shapes of the values at one path, built one row at a time: :meth:`mixed_paths` gives what
    ``datasets.utils.json.find_mixed_struct_types_field_paths`` gives for all those rows, without holding them."""

    __slots__ = ("dicts", "lists", "others", "keys", "differ", "fields", "items")

    def __init__(self):
        self.dicts = self.lists = self.others = False
        self.keys: frozenset | None = None  # the first object's keys
        self.differ = False  # an object with other keys than the first
        self.fields: dict[str, _Shapes] = {}
        self.items: _Shapes | None = None

    def add(self, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, dict):
            self.dicts = True
            if self.keys is None:
                self.keys = frozenset(value)
            elif not self.differ and (len(value) != len(self.keys) or not self.keys.issuperset(value)):
                self.differ = True
            for field, child in value.items():
                if child is not None:
                    shapes = self.fields.get(field)
                    if shapes is None:
                        shapes = self.fields[field] = _Shapes()
                    shapes.add(child)
        elif isinstance(value, list):
            self.lists = True
            for item in value:
                if item is not None:
                    if self.items is None:
                        self.items = _Shapes()
                    self.items.add(item)
        else:
            self.others = True

    def mixed_paths(self, path: list | None = None) -> list[list]:
        path = path or []
        if self.dicts and not (self.lists or self.others):
            if path and (self.differ or not self.keys):
                return [path]
            return [found for field, child in self.fields.items() for found in child.mixed_paths([*path, field])]
        if self.lists and not (self.dicts or self.others):
            return self.items.mixed_paths([*path, 0]) if self.items is not None else []
        if self.dicts or self.lists:
            return [path]
        return []


def mixed_struct_paths(examples: list) -> list[list]:
    """``find_mixed_struct_types_field_paths(examples)`` (order aside: datasets walks a set)."""
    shapes = _Shapes()
    for example in examples:
        shapes.add(example)
    return shapes.mixed_paths()


def _encode_field(example: Any, path: list, loads, dumps) -> Any:
    """Port of ``datasets.utils.json.json_encode_field``."""
    if path:
        field, *rest = path
        if example is None:
            return None
        if field == 0:
            return [_encode_field(x, rest, loads, dumps) for x in example]
        return {**example, field: _encode_field(example.get(field), rest, loads, dumps)}
    if example is None:
        return None
    try:
        loads(example)
    except Exception:  # noqa: BLE001 - datasets' own test: anything ujson cannot load is encoded
        return dumps(example)
    return example


def _decode_field(example: Any, path: list, loads) -> Any:
    """What ``Features.decode_example`` does to a ``Json()`` feature at ``path`` (``Json.decode_example``)."""
    if example is None:
        return None
    if not path:
        return loads(example)
    field, *rest = path
    if field == 0:
        return [_decode_field(x, rest, loads) for x in example]
    return {**example, field: _decode_field(example.get(field), rest, loads)}


def _insert_path(paths: list[list], path: list) -> bool:
    """Port of ``datasets.utils.json.insert_json_field_path``; False when ``paths`` did not change."""
    for index, existing in enumerate(paths):
        if existing[:len(path)] == path:
            if existing == path:
                return False
            paths[index] = path
            return True
    paths.append(path)
    return True


def _path_from_error(message: str) -> list:
    """Port of datasets 5.1.0's ``get_json_field_path_from_pyarrow_json_error``."""
    column = message.split("Column(", 1)[1].rsplit(") changed from", 1)[0].strip("/")
    return [0 if segment == "[]" else segment for segment in column.split("/")]


def _encode_lines(batch: bytes | memoryview, paths: list[list], loads, dumps) -> bytes:
    """Port of ``json_encode_fields_in_json_lines`` (a line ujson cannot load fails as it fails datasets)."""
    try:
        examples = [loads(line) for line in bytes(batch).splitlines()]
    except ValueError as error:
        raise DatasetsCannotRead(f"ValueError: {error}") from None
    for path in paths:
        try:
            examples = [_encode_field(example, path, loads, dumps) for example in examples]
        except (TypeError, AttributeError) as error:
            raise DatasetsCannotRead(f"{type(error).__name__}: {error}") from None
    return "\n".join(dumps(example) for example in examples).encode()


class _MappedChunks:
    """A file's chunks as datasets cuts them (``chunk_bytes`` plus the rest of the last line, a leading BOM left out),
    each a ``memoryview`` of a read-only mapping. Asking for the next chunk hands the previous one's pages back
    (``MADV_DONTNEED``), so about one chunk stays resident."""

    def __init__(self, path: Path, chunk_bytes: int):
        self.path, self.chunk_bytes = path, chunk_bytes
        self._map: mmap.mmap | None = None
        self._start = 0  # where the next chunk starts
        self._held: tuple[int, int] | None = None  # the byte range of the chunk handed out last

    def __enter__(self) -> _MappedChunks:
        with self.path.open("rb") as handle:
            size = handle.seek(0, 2)
            if size:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return self

    def __exit__(self, *exc) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view of it is still referenced: the mapping goes with the last one
                pass
            self._map = None

    def next(self, skip_bom: bool = False):
        """The next chunk (``b""`` at the end of the file)."""
        self._hand_back()
        mapped = self._map
        if mapped is None or self._start >= len(mapped):
            return b""
        first = self._start + (len(codecs.BOM_UTF8) if skip_bom and mapped[:3] == codecs.BOM_UTF8 else 0)
        end = self._start + self.chunk_bytes
        if end < len(mapped):
            newline = mapped.find(b"\n", end)
            end = len(mapped) if newline < 0 else newline + 1
        else:
            end = len(mapped)
        self._held, self._start = (self._start, end), end
        return memoryview(mapped)[first:end]

    def rest_of_file(self) -> bytes:
        """Every byte from the last chunk's start to the end of the file (a copy)."""
        start = self._held[0] if self._held else 0
        data = self._map[start:] if self._map is not None else b""
        return data[len(codecs.BOM_UTF8):] if start == 0 and data.startswith(codecs.BOM_UTF8) else data

    def _hand_back(self) -> None:
        if self._held is None or self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start, end = self._held
        aligned = start - start % mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, aligned, end - aligned)


class ArrowView:
    """The rows ``datasets`` 5.1.0 streams from a local file: :meth:`row` gives the ``ordinal``-th (0-based, asked for
    in increasing order), or raises :class:`NotMirrored` / :class:`DatasetsCannotRead`."""

    def __init__(self, path: Path):
        import pyarrow  # noqa: F401 - fail here (ImportError) rather than in the middle of a table

        self.path = path
        self._tables = self._generate_tables()
        self._table = None
        self._start = 0  # ordinal of the current table's first row
        self._columns: list[str] = []  # the first table's columns: datasets' features
        self._decode_paths: list[list] = []  # Json() features, decoded on the way out (JSON Lines only)
        self._loads = self._dumps = None  # pandas' ujson, once a file needs it

    def row(self, ordinal: int) -> dict:
        while self._table is None or ordinal >= self._start + self._table.num_rows:
            if self._table is not None:
                self._start += self._table.num_rows
                self._table = None  # let it go before the next chunk is read
            table = next(self._tables, None)
            if table is None:
                raise IndexError(f"datasets yields no row {ordinal} (the file has {self._start})")
            self._table = table
        if ordinal < self._start:
            raise RuntimeError(f"rows are read in order (asked for {ordinal} after {self._start})")
        [row] = self._table.slice(ordinal - self._start, 1).to_pylist()
        for column in self._columns:
            row.setdefault(column, None)  # _cast_table adds a column a later chunk lacks
        for path in self._decode_paths:
            row = _decode_field(row, path, self._loads)
        return row

    # -- the port of datasets' Json._split_generators + _generate_tables + _cast_table, one file, one shard --

    def _generate_tables(self) -> Iterator:
        """Pass 1 (``_split_generators``) reads the first chunk to fix the features; pass 2 reads every chunk with
        pass 1's mixed-shape paths encoded (reusing pass 1's table when it needed no retry). An array has no pass 1.
        Each table and its input are let go before the next chunk is read."""
        with _MappedChunks(self.path, self.chunk_bytes) as chunks:
            batch, array = self._next_batch(chunks, 0)
            if not batch:
                return
            if array:  # the whole file, read once
                yield self._read(batch, [], self._initial_block_size, detect=True)[0]
                return
            table, json_paths, block_size, retried = self._read(batch, [], self._initial_block_size, detect=True)
            features = table.schema
            if any(marker <= set(table.column_names) for marker in AGENT_TRACE_MARKERS):
                raise NotMirrored("columns that datasets checks for agent traces")
            self._columns, self._decode_paths = list(table.column_names), [list(path) for path in json_paths]
            if retried:
                table, json_paths, block_size, _ = self._read(batch, json_paths, self._initial_block_size,
                                                              detect=False)
                if table.schema != features:
                    raise NotMirrored("pass 2 typed the first chunk differently")
            batch = None
            yield table
            table = None  # the reader has let go of it too: it is freed before the next chunk is read
            batch_idx = 1
            while True:
                batch, array = self._next_batch(chunks, batch_idx)
                if not batch:
                    return
                if array:
                    raise NotMirrored("a later chunk starts with '['")
                table, json_paths, block_size, _ = self._read(batch, json_paths, block_size, detect=False)
                batch = None
                yield self._cast_like_first(table, features)
                table = None
                batch_idx += 1

    chunk_bytes = CHUNK_BYTES  # smaller in tests, to have several chunks in a small file

    @property
    def _initial_block_size(self) -> int:
        return max(self.chunk_bytes // 32, 16 << 10)

    def _ujson_needed(self, needed: bool = True) -> None:
        if needed and self._loads is None:
            self._loads, self._dumps = _ujson()

    def _next_batch(self, chunks: _MappedChunks, batch_idx: int):
        """``(batch, is_array)``: the next chunk (a ``memoryview``), or for an array the whole file converted to JSON
        Lines (``bytes``); empty at the end of the file."""
        batch = chunks.next(skip_bom=batch_idx == 0)
        if not batch:
            return b"", False
        array = batch[:1] == b"["
        if array:
            if batch_idx:
                raise NotMirrored("a later chunk starts with '['")
            head = bytes(batch[:100])
            batch = None
            self._ujson_needed()
            loads, dumps = self._loads, self._dumps
            try:
                elements = loads(chunks.rest_of_file())
            except ValueError as error:
                raise DatasetsCannotRead(f"ValueError: {error}") from None
            if not isinstance(elements, list):
                raise NotMirrored("a top-level value that is not an array")
            if b"{" in head.split(b'"', 1)[0]:  # a list of objects
                batch = "\n".join(dumps(x) for x in elements).encode()
            else:  # a list of strings
                batch = "\n".join(dumps({"text": x}) for x in elements).encode()
        return batch, array

    def _read(self, batch: bytes | memoryview, json_paths: list[list], block_size: int, *, detect: bool):
        """One chunk through pyarrow's reader as datasets reads it: ``(table, json_paths, block_size, retried)``."""
        import pyarrow as pa
        import pyarrow.json as paj

        json_paths = [list(path) for path in json_paths]
        if isinstance(batch, memoryview) and (detect or json_paths):  # lines are split in Python: a copy
            batch = bytes(batch)
        if detect:
            json_paths += self._detect(batch, self._loads)
        original_batch = batch
        if json_paths:
            self._ujson_needed()
            batch = _encode_lines(batch, json_paths, self._loads, self._dumps)
        block_size = len(batch) if len(batch) // 8 > block_size else block_size
        retried = False
        while True:
            try:
                # one thread: the same table, and no per-thread heap keeping what a chunk freed (RSS grew)
                table = paj.read_json(pa.BufferReader(pa.py_buffer(batch)),
                                      read_options=paj.ReadOptions(block_size=block_size, use_threads=False),
                                      memory_pool=pa.system_memory_pool())
                return table, json_paths, block_size, retried
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                message = str(error)
                retried = True
                if batch[:1] == b"[" or not isinstance(error, pa.ArrowInvalid):
                    pass  # datasets re-raises
                elif "JSON parse error: Column(" in message and ") changed from" in message:
                    if not _insert_path(json_paths, _path_from_error(message)):
                        raise DatasetsCannotRead(f"ArrowInvalid: {message} (datasets 5.1 retries this forever)"
                                                 ) from None
                    self._ujson_needed()
                    batch = _encode_lines(original_batch, json_paths, self._loads, self._dumps)
                    continue
                elif ("straddling" in message or "JSON conversion to" in message) and block_size < len(batch):
                    block_size *= 2
                    continue
                if isinstance(error, pa.ArrowInvalid):
                    self._whole_file_through_pandas()
                raise DatasetsCannotRead(f"{type(error).__name__}: {message.splitlines()[0]}") from None

    def _whole_file_through_pandas(self) -> None:
        """After an ``ArrowInvalid`` datasets reads the whole file with ``pandas.read_json`` and fails if that raises
        ``ValueError``; a file pandas reads is not mirrored here (:class:`NotMirrored`)."""
        import pandas as pd

        try:
            with self.path.open(encoding="utf-8") as handle:
                pd.read_json(handle, dtype_backend="pyarrow")
        except ValueError:
            return
        raise NotMirrored("a file only pandas' reader gets through")

    @staticmethod
    def _detect(batch: bytes, loads) -> list[list]:
        """Mixed-shape paths in the first batch; none when a line does not load (datasets then skips the detection).
        stdlib json stands in for ujson except where they may parse differently."""
        if loads is None and _UJSON_ONLY.search(batch):
            loads = _ujson()[0]
        shapes = _Shapes()
        for line in batch.splitlines():
            try:
                shapes.add((loads or json.loads)(line))
            except ValueError:
                if loads is None and line.strip():  # not blank: let ujson say whether it loads
                    return ArrowView._detect(batch, _ujson()[0])
                return []
        return shapes.mixed_paths()

    def _cast_like_first(self, table, features):
        """datasets casts every later table to the first one's features; only the cases that change nothing but
        missing columns (added as nulls, by :meth:`row`) are mirrored."""
        if table.schema == features:
            return table
        types = {field.name: field.type for field in features}
        if all(field.name in types and field.type == types[field.name] for field in table.schema):
            return table
        raise NotMirrored("a later chunk's columns differ from the first chunk's")


class LocalFileKeys:
    """``key(ordinal, row)``: the primary id of the ``ordinal``-th row (0-based, blank lines not counted)."""

    def __init__(self, path: Path, warn: Callable[[str], None] | None = None):
        self.path = path
        self.warn = warn or (lambda message: None)
        self._view: ArrowView | None = None
        self._rows: Iterator[dict] | None = None  # datasets itself, once the view does not mirror it
        self._position = 0  # ordinal of the next row self._rows yields
        self.unreadable_from: int | None = None  # first ordinal datasets could not give
        self.datasets_from: int | None = None  # first ordinal read through datasets itself

    def key(self, ordinal: int, row: Any) -> str | None:
        """The row's id/uuid, else speculators' content hash of its datasets view; ``None`` for a non-object."""
        if not isinstance(row, dict):
            return None
        return explicit_id(row) or content_hash(self._datasets_row(ordinal) or row)

    def _datasets_row(self, ordinal: int) -> dict | None:
        if self.unreadable_from is not None:
            return None
        if self._rows is None:
            try:
                if self._view is None:
                    self._view = ArrowView(self.path)
                return self._view.row(ordinal)
            except (NotMirrored, IndexError):  # IndexError: fewer rows than regen's reader counted; datasets says why
                self.datasets_from = ordinal
            except DatasetsCannotRead as error:
                return self._unreadable(ordinal, error)
        return self._datasets_itself(ordinal)

    def _datasets_itself(self, ordinal: int) -> dict | None:
        try:
            if self._rows is None:
                from datasets import (
                    load_dataset,  # heavy (imports torch); only where the view does not mirror it
                )

                self._rows = iter(load_dataset("json", data_files=str(self.path), split="train", streaming=True))
            if ordinal < self._position:
                raise RuntimeError(f"rows are read in order (asked for {ordinal} after {self._position})")
            row = next(itertools.islice(self._rows, ordinal - self._position, None))
            self._position = ordinal + 1
            return row
        except Exception as error:  # noqa: BLE001 - any failure of datasets means speculators cannot read it either
            return self._unreadable(ordinal, error)

    def _unreadable(self, ordinal: int, error: Exception) -> None:
        self.unreadable_from = ordinal
        self.warn(f"datasets cannot read {self.path} from row {ordinal} on ({type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}), so speculators could not either; "
                  "id-less rows from there on are keyed by their own JSON")
        return None
