"""The keys benchmark measures what it says: rows that mix columns, shapes and types, keyed by regen's port in a
fresh process exactly as in this one (the ``datasets`` side is checked by ``tests/regen/test_speculators_keys.py``)."""

from __future__ import annotations

import hashlib
import json

from benchmarks.speculators_keys import PORT, chat_rows, measure
from regen.rows.speculators_keys import LocalFileKeys


def test_the_rows_mix_columns_shapes_and_types():
    rows = chat_rows(50)
    assert rows == chat_rows(50) and all("id" not in row and "uuid" not in row for row in rows)
    assert len({frozenset(row) for row in rows}) > 1  # tools on some rows only
    assert len({frozenset(row["meta"]) for row in rows}) > 1 and {type(row["score"]) for row in rows} == {int, float}


def test_the_port_is_measured_on_the_keys_regen_computes(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = chat_rows(50)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    keys = LocalFileKeys(path)
    expected = hashlib.sha256(b"".join(keys.key(i, row).encode() for i, row in enumerate(rows))).hexdigest()
    found = measure(PORT, path)
    assert found["keys_sha256"] == expected and found["peak_rss_mb"] > 0
