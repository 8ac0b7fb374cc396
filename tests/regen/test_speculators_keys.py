"""Resume keys of id-less local rows equal speculators regenerate-responses 0.9.0's for the same file.

The expected keys were produced by speculators 0.9.0 itself (``load_input_dataset`` + ``_primary_identifier`` from
``speculators.cli.regenerate_responses``, datasets 5.1.0, in the venv ``make bench-regen`` builds) on the file
``tests/fixtures/speculators_parity.jsonl``; the benchmark re-checks that parity against the primary ids the
speculators CLI writes (``python -m benchmarks.regen_client --parity-only``, and on its whole workload with
``--id-less-share 0.25``). The keys of :data:`CASES` (mixed columns, nested objects of different shapes, int/float
columns, type changes, timestamps) were produced by datasets 5.1.0's ``load_dataset`` as speculators calls it,
hashed as ``_primary_identifier`` hashes. regen computes them without datasets (``regen.rows.speculators_keys.ArrowView``);
the slow tests at the end compare it with the installed ``datasets`` itself, several chunks per file included.
"""

from __future__ import annotations

import codecs
import json
import random
import subprocess
import sys
import types

import pytest

from regen.rows import speculators_keys
from regen.rows.conversation import content_hash
from regen.rows.sources import open_source
from regen.rows.speculators_keys import ArrowView, LocalFileKeys, NotMirrored, mixed_struct_paths
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


# Files that make datasets change rows: (file name, lines). Every row is id-less unless it says otherwise.
_MESSAGES = [{"messages": [{"role": "user", "content": "Hi"}]},
             {"messages": [{"role": "user", "content": "Hey", "name": "sam", "w": 0.1234567890123456}]},
             {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "é / ✓"}], "n": 3}]
_NUMBERS = [{"prompt": "a", "score": 1, "vals": [1, 2]}, {"prompt": "b", "score": 2.5, "vals": [1.5, 3]},
            {"prompt": "c", "score": 0.1234567890123456789, "vals": [], "big": 9007199254740993},
            {"prompt": "d", "score": 1e-12, "x": 1e20, "neg": -0.0}]
_NESTED = [{"prompt": "a", "meta": {"a": 1, "b": {"c": [1, 2]}}}, {"prompt": "b", "meta": {"a": 2, "b": {"c": [], "d": "x"}}},
           {"prompt": "c", "meta": {"a": 3.5}}, {"prompt": "d", "meta": None}]
_NESTED_SAME = [{"prompt": "a", "meta": {"a": 1, "b": {"c": [1, 2]}}}, {"prompt": "b", "meta": {"a": 2.5, "b": {"c": [3]}}}]
_TYPE_CHANGE = [{"prompt": "a", "score": 1}, {"prompt": "b", "score": "high"}, {"prompt": "c", "score": {"k": 1}}]
_TIMES = [{"prompt": "a", "when": "2024-01-01"}, {"prompt": "b", "when": "2024-01-02T10:00:00"},
          {"prompt": "c", "when": "2024-01-02 10:00:00", "note": "2024-01-02 10:00:00.5"}]
_EMPTIES = [{"prompt": "a", "meta": {}, "l": []}, {"prompt": "b", "meta": {}, "l": [None]},
            {"prompt": "c", "allnull": None, "b": True}]
_TOOLS = [{"messages": [{"role": "user", "content": "w"}],
           "tools": [{"type": "function", "function": {"name": "get", "parameters": {
               "type": "object", "properties": {"city": {"type": "string"}}}}}]},
          {"messages": [{"role": "user", "content": "x"}], "id": "t-1",
           "tools": [{"type": "function", "function": {"name": "sum", "parameters": {
               "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a"]}}}]},
          {"messages": [{"role": "user", "content": "y"}], "tools": "[{\"name\": \"s\"}]"}]


def _lines(rows: list[dict]) -> list[str]:
    return [json.dumps(row, ensure_ascii=False) for row in rows]


CASES = {
    # nested objects of different shapes: JSON strings, decoded again in a .jsonl (ujson's floats), kept in a .json
    "messages": _MESSAGES,
    # an int column that is a float elsewhere, a list of ints and floats, floats ujson writes with 10 decimals (.json)
    "numbers": _NUMBERS,
    "nested": _NESTED,
    "nested_same_shape": _NESTED_SAME,
    # a column that changes type: pyarrow refuses it and datasets retries with it as JSON
    "type_change": _TYPE_CHANGE,
    "timestamps": _TIMES,  # strings pyarrow types as timestamps
    "empty_objects": _EMPTIES,
    "tools": _TOOLS,
}
RAW_CASES = {  # JSON Lines written as they are
    "blank_lines": ['{"prompt": "a", "m": {"a": 1}}', "   ", '{"prompt": "b", "k": 1, "m": {"b": 2}}', "\t",
                    '{"prompt": "c", "k": 2.0}'],
    "crlf": [line + "\r" for line in _lines(_NUMBERS)],
    # text that stdlib json and ujson read differently would decide the shape detection: ujson decides
    "ujson_only": ['{"prompt": "NaN and 12345678901234567890", "m": {"a": 1}}', '{"prompt": "b", "m": {"b": 1},}'],
}


EXPECTED = {  # by datasets 5.1.0 (load_dataset as speculators 0.9.0 calls it): 'hash_' + the first 16 hex digits
    "blank_lines.jsonl": ["hash_2b596921e7274e61", "hash_79071a03206b1cfb", "hash_47a6b41fb6d07b62"],
    "crlf.jsonl": ["hash_6d5e5ed9c2541e59", "hash_9e243fb95cff6f58", "hash_ef5f1df8db9c3cc6", "hash_ae00f9045e323261"],
    "empty_objects.json": ["hash_30be70b0b0fcbb8a", "hash_bfdfa3be3d936c04", "hash_6117b841d3806ff9"],
    "empty_objects.jsonl": ["hash_52241bde6c48b929", "hash_1ad4c606fbf54532", "hash_6117b841d3806ff9"],
    "messages.json": ["hash_f2d797076513aa4f", "hash_ba1325e4ab6a9386", "hash_edacf9fc306e1d08"],
    "messages.jsonl": ["hash_a46081e4fdd4bac9", "hash_186bc2a8782cbb97", "hash_0affffb0b4a0ff7d"],
    "messages_bom.jsonl": ["hash_a46081e4fdd4bac9", "hash_186bc2a8782cbb97", "hash_0affffb0b4a0ff7d"],
    "nested.json": ["hash_01471a0dd6bb0257", "hash_fe5badf5bd149784", "hash_179f6fcb40a74885", "hash_3eb5b4a3f93419d1"],
    "nested.jsonl": ["hash_edf1beb8ccffb1de", "hash_e6cc4dc10ff50299", "hash_66fab2f6536f518b", "hash_3eb5b4a3f93419d1"],
    "nested_same_shape.json": ["hash_c44361a76778a0df", "hash_49d9c53e38e9add6"],
    "nested_same_shape.jsonl": ["hash_c44361a76778a0df", "hash_49d9c53e38e9add6"],
    "numbers.json": ["hash_6d5e5ed9c2541e59", "hash_9e243fb95cff6f58", "hash_bba5c7b3da97753c", "hash_d510616883011f17"],
    "numbers.jsonl": ["hash_6d5e5ed9c2541e59", "hash_9e243fb95cff6f58", "hash_ef5f1df8db9c3cc6", "hash_ae00f9045e323261"],
    "timestamps.json": ["hash_d885d9c42f557c92", "hash_c1fcb07d5588accd", "hash_07569ea91d2e1f6d"],
    "timestamps.jsonl": ["hash_d885d9c42f557c92", "hash_c1fcb07d5588accd", "hash_07569ea91d2e1f6d"],
    "tools.json": ["hash_710e93150d7f3982", "t-1", "hash_98cf5b746d481091"],
    "tools.jsonl": ["hash_35cd3e8d5fe55bf0", "t-1", "hash_082848c0acebd934"],
    "type_change.json": ["hash_ca050b322434cad3", "hash_c44889de44326eb3", "hash_e768a75f205a20ae"],
    "type_change.jsonl": ["hash_b453301e30a48ea9", "hash_2d2ec5b8ae4e7154", "hash_6970c22943f01110"],
    "ujson_only.jsonl": ["hash_671aa434c2978b4a", "hash_94e98513d9b071a3"],
}


def case_files(tmp_path) -> dict:
    """Every case in each form: CASES as .jsonl and as a .json array, RAW_CASES as .jsonl, one with a BOM."""
    files = {}
    for name, rows in CASES.items():
        files[f"{name}.jsonl"] = ("\n".join(_lines(rows)) + "\n").encode()
        files[f"{name}.json"] = json.dumps(rows, ensure_ascii=False).encode()
    for name, lines in RAW_CASES.items():
        files[f"{name}.jsonl"] = ("\n".join(lines) + "\n").encode()
    files["messages_bom.jsonl"] = codecs.BOM_UTF8 + files["messages.jsonl"]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


def view_keys(path, chunk_bytes: int | None = None) -> list[str]:
    """speculators' key of every row of ``path`` as ArrowView gives the rows (ids ignored)."""
    view = ArrowView(path)
    if chunk_bytes:
        view.chunk_bytes = chunk_bytes
    found = []
    while True:
        try:
            found.append(content_hash(view.row(len(found))))
        except IndexError:
            return found


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_keys_equal_datasets_5_1_for_files_that_mix_columns_shapes_and_types(tmp_path, name):
    path = case_files(tmp_path)[name]
    if name == "ujson_only.jsonl":  # its second line has a trailing comma: ujson (datasets) reads it, regen does not
        assert [key[:21] for key in view_keys(path)] == EXPECTED[name]
        assert [r.primary_id and r.primary_id[:21] for r in open_source(
            DatasetSettings(source="local", path=str(path), format="auto")).records()] == [EXPECTED[name][0], None]
        return
    assert [key if key.startswith("hash_") is False else key[:21] for key in keys(path)] == EXPECTED[name]


def test_the_cases_are_rows_datasets_changes():
    """In every case datasets yields rows other than the lines as written, but for two .jsonl files whose
    mixed-shape or mixed-type column comes back decoded as written (in a .json array it stays a JSON string)."""
    for name, rows in CASES.items():
        written = [content_hash(row)[:21] for row in rows if "id" not in row]
        for form in ("jsonl", "json"):
            pinned = [key for key in EXPECTED[f"{name}.{form}"] if key.startswith("hash_")]
            assert (pinned == written) == (f"{name}.{form}" in ("nested.jsonl", "type_change.jsonl")), (name, form)
    assert EXPECTED["messages.json"] != EXPECTED["messages.jsonl"]  # JSON strings in an array, decoded in JSON Lines
    assert EXPECTED["numbers.json"][2:] != EXPECTED["numbers.jsonl"][2:]  # ujson's 10 decimals in an array


def test_keys_come_without_torch_datasets_or_pandas(tmp_path):
    """The parity file and a bench-like file whose rows are partly id-less: pyarrow only, no per-row datasets."""
    bench_like = tmp_path / "bench.jsonl"
    bench_like.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], **(
        {"id": f"b{i}"} if i % 4 else {})}) + "\n" for i in range(400)))
    code = ("import sys; from pathlib import Path; from regen.rows.sources import open_source; "
            "from regen.settings import DatasetSettings; "
            f"keys = [[r.primary_id for r in open_source(DatasetSettings('local', p, 'auto')).records()] "
            f"for p in ({str(PARITY_FILE)!r}, {str(bench_like)!r})]; "
            "print(keys[0]); print(sorted(m for m in ('torch', 'datasets', 'pandas', 'pyarrow') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    first, loaded = result.stdout.strip().splitlines()
    assert first == repr(SPECULATORS_KEYS), result.stderr
    assert loaded == "['pyarrow']"


def test_a_later_chunk_missing_a_column_gets_it_as_null(tmp_path):
    """datasets types the file by its first 10 MiB and adds the columns a later chunk lacks; with 4 KiB chunks
    the keys are those of the whole file read at once."""
    path = tmp_path / "later.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i} " + "x" * 40, **({"score": i * 1.5} if i < 150 else {})})
                            + "\n" for i in range(300)))
    assert path.stat().st_size > 3 * 4096
    assert view_keys(path, chunk_bytes=4096) == view_keys(path)
    assert view_keys(path)[200] == content_hash({"prompt": "p200 " + "x" * 40, "score": None})


def datasets_chunks(path, chunk_bytes: int) -> list[bytes]:
    """The chunks datasets 5.1.0's JSON builder cuts a file into: ``read(chunk_bytes)`` + ``readline()``, a BOM
    stripped from the first."""
    chunks = []
    with path.open("rb") as handle:
        while batch := handle.read(chunk_bytes):
            if not chunks and batch.startswith(codecs.BOM_UTF8):
                batch = batch[len(codecs.BOM_UTF8):]
            chunks.append(batch + handle.readline())
    return chunks


@pytest.mark.parametrize("layout", ["plain", "aligned", "bom", "crlf", "no_final_newline", "blank_lines", "long_line",
                                    "empty"])
def test_mapped_chunks_are_cut_where_datasets_cuts_them(tmp_path, layout):
    """Chunks are views of the mapped file, not copies, cut byte for byte as datasets cuts them: a chunk that
    ends on a newline takes the whole next line, a line longer than a chunk stays whole."""
    lines = [json.dumps({"prompt": f"row {i} " + "y" * (i * 7 % 50)}) for i in range(200)]
    if layout == "long_line":
        lines[20] = json.dumps({"prompt": "z" * 3000})
    if layout == "aligned":  # 64-byte lines: every chunk ends on a newline, and datasets' readline() adds a line
        lines = [json.dumps({"prompt": f"{i:05d}".ljust(49, "a")}) for i in range(200)]
    if layout == "blank_lines":
        lines[10:10] = ["", "  "]
    newline = "\r\n" if layout == "crlf" else "\n"
    data = (newline.join(lines) + ("" if layout == "no_final_newline" else newline)).encode()
    data = codecs.BOM_UTF8 + data if layout == "bom" else b"" if layout == "empty" else data
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    expected = datasets_chunks(path, 512)
    assert len(expected) > 3 or layout == "empty"
    assert layout != "aligned" or {len(chunk) for chunk in expected[:-1]} == {512 + 64}
    with speculators_keys._MappedChunks(path, 512) as chunks:
        cut = []
        while chunk := chunks.next(skip_bom=not cut):
            assert isinstance(chunk, memoryview)
            cut.append(bytes(chunk))
    assert cut == expected


def test_one_chunk_table_is_held_at_a_time(tmp_path, monkeypatch):
    """Reading on to the next chunk lets the previous chunk's table go before the next one is read, and the
    keys are those of the file read in one chunk."""
    import weakref

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i} " + "x" * 60}],
                                        **({"n": i} if i % 3 else {"n": i + 0.5})}) + "\n" for i in range(400)))
    tables = []
    read = ArrowView._read

    def recorded(self, *args, **kwargs):
        alive = [table for table in tables if table() is not None]
        assert len(alive) <= int(bool(self._table)), "a chunk's table outlived it"
        result = read(self, *args, **kwargs)
        tables.append(weakref.ref(result[0]))
        return result

    monkeypatch.setattr(ArrowView, "_read", recorded)
    monkeypatch.setattr(ArrowView, "chunk_bytes", 2048)
    chunked = view_keys(path)
    assert len(tables) > 5 and len(chunked) == 400
    monkeypatch.setattr(ArrowView, "chunk_bytes", speculators_keys.CHUNK_BYTES)
    assert chunked == view_keys(path)


def test_where_the_view_does_not_mirror_datasets_the_rest_comes_from_datasets_itself(tmp_path, monkeypatch):
    """A later chunk with a column the first lacks: datasets casts it to the first chunk's features (and fails
    there, as here); regen asks datasets itself from that row on instead of guessing."""
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i} " + "x" * 40, **({"extra": 1} if i >= 150 else {})})
                            + "\n" for i in range(300)))
    calls = []

    def load_dataset(builder, data_files, split, streaming):  # what speculators calls, yielding marked rows
        calls.append((builder, data_files, split, streaming))
        return ({"from": "datasets", "row": index} for index in range(300))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(ArrowView, "chunk_bytes", 4096)
    keys = LocalFileKeys(path)
    found = [keys.key(index, {"prompt": "as written"}) for index in range(300)]
    assert calls == [("json", str(path), "train", True)] and 0 < keys.datasets_from < 150
    view = ArrowView(path)
    assert found[:keys.datasets_from] == [content_hash(view.row(index)) for index in range(keys.datasets_from)]
    with pytest.raises(NotMirrored, match="a later chunk's columns differ"):
        view.row(keys.datasets_from)
    assert found[keys.datasets_from:] == [content_hash({"from": "datasets", "row": index})
                                          for index in range(keys.datasets_from, 300)]


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
    code = ("import sys; from regen.rows.sources import open_source; from regen.settings import DatasetSettings; "
            f"print([r.primary_id for r in open_source(DatasetSettings('local', {str(path)!r}, 'auto')).records()], "
            "'datasets' in sys.modules, 'pyarrow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.stdout.strip() == "['a', 'b'] False False", result.stderr


# -- against the installed datasets itself (the path speculators takes): a few files always, many when slow --

def random_value(rng: random.Random, depth: int = 0):
    """A JSON value of the kinds chat datasets hold: strings, ints, floats, bools, nulls, lists, objects."""
    kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] * 2 if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(["a", "b é", f"2024-01-0{rng.randint(1, 9)}", "x/y", "✓"])
    if kind == "int":
        return rng.choice([0, 1, -3, 2**40, 7])
    if kind == "float":
        return rng.choice([0.5, 1.0, -2.25, 0.1234567890123456, 1e-9, 3e15])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        item = rng.choice(["int", "num", "dict", "any"])
        return [rng.choice([1, 2.5]) if item == "num" else rng.randint(0, 9) if item == "int"
                else random_object(rng, depth + 1) if item == "dict" else random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))]
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict:
    return {key: random_value(rng, depth) for key in rng.sample(["role", "content", "name", "w", "k"], rng.randint(0, 3))}


def random_rows(seed: int, count: int) -> list[dict]:
    """Rows sharing some columns, each column mostly of one kind (as real files are), sometimes not."""
    rng = random.Random(seed)
    kinds = {column: rng.choice(["str", "int", "float", "list", "dict", "any"]) for column in ("a", "b", "c", "d")}
    rows = []
    for index in range(count):
        row = {"prompt": f"row {index} " + "z" * rng.randint(0, 60)}
        for column, kind in kinds.items():
            if rng.random() < 0.7:
                if kind == "any" or rng.random() < 0.05:
                    row[column] = random_value(rng)
                elif kind == "dict":
                    row[column] = {"x": rng.randint(0, 5), "y": "s"} if rng.random() < 0.8 else random_object(rng)
                elif kind == "list":
                    row[column] = [{"role": "user", "content": "c"}] * rng.randint(0, 2)
                else:
                    row[column] = {"str": "s", "int": rng.randint(0, 99), "float": rng.random()}[kind]
        rows.append(row)
    return rows


DATASETS_KEYS = """
import hashlib, json, sys
from datasets import load_dataset
out = {}
for path, chunk in json.loads(sys.argv[1]):
    keys = []
    try:
        kwargs = {"chunksize": chunk} if chunk else {}
        for row in load_dataset("json", data_files=path, split="train", streaming=True, **kwargs):
            payload = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
            keys.append("hash_" + hashlib.sha256(payload.encode("utf-8")).hexdigest())
    except Exception as error:
        keys.append(f"error: {type(error).__name__}")
    out[f"{path}:{chunk}"] = keys
print(json.dumps(out))
"""


def datasets_keys(files: list[tuple[str, int | None]]) -> dict[str, list[str]]:
    """speculators' key of every row, through the installed datasets, in one process (it imports torch)."""
    result = subprocess.run([sys.executable, "-c", DATASETS_KEYS, json.dumps(files)], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def mirrored_keys(path, chunk_bytes: int | None) -> tuple[list[str], str | None]:
    """ArrowView's keys up to where it stops mirroring datasets (and why it stopped, if it did)."""
    view = ArrowView(path)
    view.chunk_bytes = chunk_bytes or view.chunk_bytes
    found: list[str] = []
    while True:
        try:
            found.append(content_hash(view.row(len(found))))
        except IndexError:
            return found, None
        except (NotMirrored, speculators_keys.DatasetsCannotRead) as stop:
            return found, type(stop).__name__


def check_the_view_against_installed_datasets(tmp_path, seeds: range) -> None:
    """Every case, and a generated file per seed (as .jsonl and as .json), whole and in 4 KiB chunks: up to where the
    view hands over to datasets itself, its keys are datasets' keys; where datasets fails, the view says so."""
    files = [(path, None) for path in case_files(tmp_path).values()]
    for seed in seeds:
        rows = random_rows(seed, 120)
        jsonl, array = tmp_path / f"gen{seed}.jsonl", tmp_path / f"gen{seed}.json"
        jsonl.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        array.write_text(json.dumps(rows, ensure_ascii=False))
        files += [(jsonl, None), (jsonl, 4096), (array, None)]
    expected = datasets_keys([(str(path), chunk) for path, chunk in files])
    handed_over = 0
    for path, chunk in files:
        theirs = expected[f"{path}:{chunk}"]
        ours, stop = mirrored_keys(path, chunk)
        failed = theirs[-1].startswith("error:")
        if stop is None:
            assert ours == theirs, (path.name, chunk)
        else:
            handed_over += stop == "NotMirrored"
            assert ours == theirs[:len(ours)], (path.name, chunk)
            if stop == "DatasetsCannotRead":
                assert failed and len(theirs) == len(ours) + 1, (path.name, chunk, theirs[-1])
    assert handed_over < len(files) // 4  # most files are mirrored to the end


def test_the_view_gives_the_rows_the_installed_datasets_gives(tmp_path):
    """The port is checked against the datasets installed now (not only against the 5.1.0 keys pinned above): the
    cases, which mix columns, shapes and types, and 6 generated files, through datasets itself in one process."""
    check_the_view_against_installed_datasets(tmp_path, range(6))


@pytest.mark.slow
def test_the_view_gives_the_rows_the_installed_datasets_gives_for_many_files(tmp_path):
    check_the_view_against_installed_datasets(tmp_path, range(6, 46))


@pytest.mark.slow
def test_the_shape_detection_equals_datasets():
    from datasets.utils.json import find_mixed_struct_types_field_paths

    rng = random.Random(5)
    for seed in range(300):
        rows = random_rows(seed, rng.randint(1, 30)) + [random_object(rng) for _ in range(rng.randint(0, 3))]
        rng.shuffle(rows)
        assert sorted(map(str, mixed_struct_paths(rows))) == sorted(map(str, find_mixed_struct_types_field_paths(rows)))
