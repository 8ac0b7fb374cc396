"""Resume keys of a local file's rows, exactly as ``speculators regenerate-responses`` 0.9.0 computes them.

speculators reads a local file with ``datasets.load_dataset("json", data_files=FILE, split="train",
streaming=True)`` and keys a row without ``id``/``uuid`` by the sha256 of that row's canonical JSON. The
row it hashes is the one ``datasets`` yields, not the line as written: it has every column of the file
(absent ones null), nested objects gain the keys their siblings have, and integer columns that also hold
floats become floats. So the key of an id-less row comes from that same ``datasets`` view of the file,
read alongside regen's own reader, lazily (from the first id-less row) so a file whose rows all carry
ids never pays for it. Where ``datasets`` cannot read the file (speculators could not either), the
remaining id-less rows are keyed by their own JSON.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from regen.conversation import content_hash, explicit_id


class LocalFileKeys:
    """``key(ordinal, row)``: the primary id of the ``ordinal``-th row (0-based, blank lines not counted)."""

    def __init__(self, path: Path, warn: Callable[[str], None] | None = None):
        self.path = path
        self.warn = warn or (lambda message: None)
        self._rows: Iterator[dict] | None = None
        self._position = 0  # ordinal of the next row self._rows yields
        self.unreadable_from: int | None = None  # first ordinal datasets could not give

    def key(self, ordinal: int, row: Any) -> str | None:
        """The row's id/uuid, else speculators' content hash of its datasets view; ``None`` for a non-object."""
        if not isinstance(row, dict):
            return None
        return explicit_id(row) or content_hash(self._datasets_row(ordinal) or row)

    def _datasets_row(self, ordinal: int) -> dict | None:
        if self.unreadable_from is not None:
            return None
        try:
            if self._rows is None:
                from datasets import load_dataset  # heavy; only for files with id-less rows

                self._rows = iter(load_dataset("json", data_files=str(self.path), split="train", streaming=True))
            if ordinal < self._position:
                raise RuntimeError(f"rows are read in order (asked for {ordinal} after {self._position})")
            row = next(itertools.islice(self._rows, ordinal - self._position, None))
            self._position = ordinal + 1
            return row
        except Exception as error:  # noqa: BLE001 - any failure of datasets means speculators cannot read it either
            self.unreadable_from = ordinal
            self.warn(f"datasets cannot read {self.path} from row {ordinal} on ({type(error).__name__}: "
                      f"{str(error).splitlines()[0] if str(error) else ''}), so speculators could not either; "
                      "id-less rows from there on are keyed by their own JSON")
            return None
