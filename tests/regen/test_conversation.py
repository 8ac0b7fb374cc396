"""A conversation's resume key: its id, else its uuid, else speculators' content hash of the row."""

from __future__ import annotations

import hashlib
import json

from regen.rows.conversation import content_hash, explicit_id, primary_id_of


def test_primary_id_prefers_id_then_uuid_then_hash():
    assert primary_id_of({"id": "a", "uuid": "b"}) == "a"
    assert primary_id_of({"id": "", "uuid": "b"}) == "b"
    assert primary_id_of({"id": 5}) == "5" and explicit_id({"id": None, "uuid": None}) is None
    row = {"prompt": "p", "x": [1, 2], "é": None}
    expected = "hash_" + hashlib.sha256(
        json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
    assert primary_id_of(row) == content_hash(row) == expected == primary_id_of({"x": [1, 2], "é": None, "prompt": "p"})
    assert content_hash({"prompt": "p"}) != content_hash({"prompt": "p", "id": None})  # a null column counts
