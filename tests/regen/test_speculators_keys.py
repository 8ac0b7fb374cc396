"""Resume keys of id-less local rows equal speculators regenerate-responses 0.9.0's for the same file.

The expected keys were produced by speculators 0.9.0 itself (``load_input_dataset`` + ``_primary_identifier`` from
``speculators.cli.regenerate_responses``, datasets 5.1.0, in the venv ``make bench-regen`` builds) on the file
``tests/fixtures/speculators_parity.jsonl``; the benchmark re-checks that parity against the primary ids the
speculators CLI writes (``python -m benchmarks.regen_client --parity-only``).
"""

from __future__ import annotations

import codecs
import json
import subprocess
import sys

import pytest

from regen.conversation import content_hash
from regen.row_sources import open_source
from regen.settings import DatasetSettings
from tests.helpers.paths import FIXTURES, REPO_ROOT

SPECULATORS_KEYS = [
    "row-a", "hash_bd5938739b0845ad26244f9f1ebc5c5c9d55fef13db359cf4925bf1824d298d4", "u-1",
    "hash_52e07d7614d025626dab17485d720d13d8053a222b4acdaaaed53ef8c2b32313",
    "hash_8bebdeff0439ba6028e15f7ef9b4c47dba71183504d8bcdbec0bb1a46a28876d",
    "hash_37338705125db501d06ba453585cc450a9d15cd8bfa4ea240d7e0b1a19b6d8e6",
    "hash_7b0e78bd880472bb77add0960f6a18be05b16a88502a9367b0637bebed205253",
]
# The same rows as one .json array: datasets json-encodes the mixed-shape message objects there, so one key differs.
SPECULATORS_KEYS_JSON_ARRAY = [*SPECULATORS_KEYS[:3], "hash_aae0da31062547105a2066970101a5a5af1bef74f3a7adb93c7e4593682969a3",
                               *SPECULATORS_KEYS[4:]]


PARITY_FILE = FIXTURES / "speculators_parity.jsonl"


def parity_rows() -> list[dict]:
    return [json.loads(line) for line in PARITY_FILE.read_text().splitlines() if line.strip()]


def keys(path) -> list[str | None]:
    return [r.primary_id for r in open_source(DatasetSettings(source="local", path=str(path), format="auto")).records()]


@pytest.mark.parametrize("form,expected", [("jsonl", SPECULATORS_KEYS), ("jsonl with a BOM", SPECULATORS_KEYS),
                                           ("json array", SPECULATORS_KEYS_JSON_ARRAY)])
def test_keys_equal_speculators_for_the_same_file(tmp_path, form, expected):
    """The parity file: rows with and without ids, a nested key only some messages have, an int column that is a
    float elsewhere, an empty id, a null id, and a blank line."""
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(PARITY_FILE.read_bytes())
    if form == "jsonl with a BOM":
        path.write_bytes(codecs.BOM_UTF8 + path.read_bytes())
    if form == "json array":
        path = tmp_path / "mixed.json"
        path.write_text(json.dumps(parity_rows()))
    assert keys(path) == expected
    assert content_hash(parity_rows()[1]) != expected[1]  # hashing the line as written would not match


def test_a_file_datasets_cannot_read_falls_back_to_the_rows_own_json(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": \n{"prompt": "b", "n": 1}\n')
    warnings = []
    records = list(open_source(DatasetSettings(source="local", path=str(path), format="auto"),
                               warn=warnings.append).records())
    assert [r.primary_id for r in records] == [content_hash({"prompt": "a"}), None, content_hash({"prompt": "b", "n": 1})]
    assert len(warnings) == 1 and "datasets cannot read" in warnings[0] and "speculators could not either" in warnings[0]


def test_a_file_whose_rows_all_have_ids_never_loads_datasets(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n{"uuid": "b", "prompt": "y"}\n')
    code = ("import sys; from regen.row_sources import open_source; from regen.settings import DatasetSettings; "
            f"print([r.primary_id for r in open_source(DatasetSettings('local', {str(path)!r}, 'auto')).records()], "
            "'datasets' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "['a', 'b'] False", result.stderr
