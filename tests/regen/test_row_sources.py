"""Reading local files line by line with line numbers (BOM, blank lines, bad lines), a .json array checked when
it is opened, fingerprints, and the real Hugging Face path (a local dataset folder with named configs)."""

from __future__ import annotations

import codecs
import hashlib
import io
import json

import pytest

from common.chat_records import MAX_LINE_BYTES, json_lines
from regen.rows.sources import SourceError, open_source
from regen.settings import DatasetSettings


def local(path) -> list:
    return list(open_source(DatasetSettings(source="local", path=str(path), format="auto")).records())


def test_jsonl_rows_and_malformed_lines_keep_their_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n{"prompt": \n[1, 2]\n{"prompt": "\xff"}\n' + b'{"prompt": "\xc3\xa9"}')
    records = local(path)
    assert [(r.idx, r.where) for r in records] == [
        (0, f"{path}:1"), (2, f"{path}:3"), (3, f"{path}:4"), (4, f"{path}:5"), (5, f"{path}:6")]
    assert records[0].row == {"prompt": "a"} and records[0].error is None
    assert records[1].error.startswith("invalid JSON: Expecting value")
    assert records[2].row == [1, 2] and records[2].primary_id is None  # valid JSON, not an object: rejected later
    assert records[3].error.startswith("not UTF-8")
    assert records[4].row == {"prompt": "é"}  # last line without a newline is still a row


def test_a_utf8_bom_is_accepted_in_jsonl_and_json(tmp_path):
    jsonl, array = tmp_path / "rows.jsonl", tmp_path / "rows.json"
    jsonl.write_bytes(codecs.BOM_UTF8 + b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    array.write_bytes(codecs.BOM_UTF8 + b'[{"id": "a", "prompt": "x"}]')
    assert [(r.row, r.primary_id, r.error) for r in local(jsonl)] == [
        ({"id": "a", "prompt": "x"}, "a", None), ({"id": "b", "prompt": "y"}, "b", None)]
    assert [(r.row, r.where) for r in local(array)] == [({"id": "a", "prompt": "x"}, f"{array}:1 (element 0)")]


def test_json_array_rows_carry_their_line_and_index(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"prompt": "a"},\n\n  {"prompt": "b",\n   "id": 2}, "not an object"\n]\n')
    records = local(path)
    assert [(r.idx, r.where) for r in records] == [
        (0, f"{path}:2 (element 0)"), (1, f"{path}:4 (element 1)"), (2, f"{path}:5 (element 2)")]
    assert [r.primary_id for r in records][1:] == ["2", None]


@pytest.mark.parametrize("content,message", [
    (b'{"prompt": "a"}', "is not a top-level JSON array of rows"),
    (b"", "is empty"),
    (b"  \n\t", "is empty"),
    (b'[{"prompt": "caf\xe9"}]', r"is not UTF-8 \(invalid continuation byte at byte 16\)"),
])
def test_a_json_file_that_is_not_one_utf8_array_is_refused_when_opened(tmp_path, content, message):
    path = tmp_path / "rows.json"
    path.write_bytes(content)
    with pytest.raises(SourceError, match=f"{path}.* {message}"):
        open_source(DatasetSettings(source="local", path=str(path), format="auto"))


@pytest.mark.parametrize("text,message", [
    ('[{"prompt": "a"},\n {"prompt": }]', r":2: invalid JSON"),
    ('[{"prompt": "a"} {"prompt": "b"}]', "expected ',' or ']' after element 0"),
])
def test_broken_json_array_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "rows.json"
    path.write_text(text)
    with pytest.raises(SourceError, match=message):
        local(path)


def test_local_fingerprint_is_the_content_hash(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n')
    source = open_source(DatasetSettings(source="local", path=str(path), format="auto"))
    assert source.fingerprint == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert source.locate(4) == f"{path}:5"


@pytest.fixture
def hub_like(tmp_path):
    """A dataset folder with two named configs (as on the hub), each with train/test splits."""
    folder = tmp_path / "hub_like"
    for config in ("main", "other"):
        (folder / config).mkdir(parents=True)
        for split, count in (("train", 3), ("test", 1)):
            (folder / config / f"{split}.jsonl").write_text("".join(
                json.dumps({"id": f"{config}-{split}-{i}", "question": f"{config} q{i}"}) + "\n" for i in range(count)))
    (folder / "README.md").write_text(
        "---\nconfigs:\n" + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.jsonl\n"
            f"  - split: test\n    path: {c}/test.jsonl\n" for c in ("main", "other")) + "---\n")
    return folder


def test_hub_dataset_streams_the_chosen_config_and_split(hub_like):
    def read(subset, split):
        source = open_source(DatasetSettings(source="hf", path=str(hub_like), format="gsm8k", subset=subset, split=split))
        return source, list(source.records())

    source, records = read("other", "train")
    assert [(r.idx, r.primary_id, r.row["question"]) for r in records] == [
        (0, "other-train-0", "other q0"), (1, "other-train-1", "other q1"), (2, "other-train-2", "other q2")]
    assert records[0].where == f"{hub_like}[other/train] row 0" and source.fingerprint.startswith("builder:")
    _, test_rows = read("main", "test")
    assert [r.primary_id for r in test_rows] == ["main-test-0"]


def test_a_hub_split_has_a_size_when_its_metadata_gives_one(hub_like):
    """The progress bar's total: ``num_examples`` from the dataset card's ``dataset_info`` (what the builder read);
    a card without it (as hub_like's) gives none."""
    def size(subset, split):
        return open_source(DatasetSettings(source="hf", path=str(hub_like), format="gsm8k", subset=subset,
                                           split=split)).size()

    assert size("main", "train") is None
    card = (hub_like / "README.md").read_text().removesuffix("---\n")
    (hub_like / "README.md").write_text(card + "dataset_info:\n- config_name: main\n  splits:\n" + "".join(
        f"  - name: {split}\n    num_bytes: 100\n    num_examples: {count}\n" for split, count in (("train", 3), ("test", 1)))
        + "---\n")
    assert (size("main", "train"), size("main", "test"), size("other", "train")) == (3, 1, None)


def test_an_unreadable_hub_dataset_is_a_clear_error(hub_like):
    with pytest.raises(SourceError, match=r"cannot open the hub dataset .*\[nope/train\]"):
        open_source(DatasetSettings(source="hf", path=str(hub_like), format="gsm8k", subset="nope", split="train"))


HOSTILE = {  # a line of each kind common.chat_records refuses, and the error its record carries
    "deep": ('{"id": "d", "prompt": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested deeper than 100 levels"),
    "surrogate": ('{"id": "s", "prompt": "a\\ud800b"}', "prompt: holds a lone surrogate ('\\ud800' at char 1)"),
    "long": ('{"id": "l", "prompt": "' + "x" * (9 << 20) + '"}', "the line is over 8 MiB (MAX_LINE_BYTES)"),
}


def test_hostile_jsonl_lines_are_error_records_and_the_rest_of_the_file_is_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [line for line, _ in HOSTILE.values()]
    path.write_text("\n".join(['{"id": "g0", "prompt": "a"}', *lines, '{"id": "g1", "prompt": "b"}']) + "\n")
    records = local(path)
    assert [(r.where, r.primary_id) for r in records] == [(f"{path}:{n}", key) for n, key in
                                                          [(1, "g0"), (2, None), (3, None), (4, None), (5, "g1")]]
    for record, (_, expected) in zip(records[1:4], HOSTILE.values(), strict=True):
        assert record.row is None and expected in record.error


def test_a_too_deep_element_of_a_json_array_is_an_error_record_and_the_next_elements_are_read(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"id": "g0", "prompt": "a"},\n' + HOSTILE["deep"][0] + ',\n' + HOSTILE["surrogate"][0]
                    + ',\n{"id": "g1", "prompt": "b ] } [ {"}]')
    records = local(path)
    assert [(r.where, r.primary_id, r.error) for r in records] == [
        (f"{path}:1 (element 0)", "g0", None), (f"{path}:2 (element 1)", None, "nested deeper than 100 levels of "
                                                "arrays and objects"),
        (f"{path}:3 (element 2)", None, "prompt: holds a lone surrogate ('\\ud800' at char 1), which is not text"),
        (f"{path}:4 (element 3)", "g1", None)]


def test_a_line_over_the_cap_is_never_held_whole(tmp_path):
    """The reader asks the file for at most the cap (+1 byte) at a time, whatever the line's length."""
    class Counting(io.BytesIO):
        largest = 0

        def readline(self, size=-1):
            line = super().readline(size)
            Counting.largest = max(Counting.largest, len(line))
            assert size != -1
            return line

    stream = Counting(b'{"a": "' + b"x" * (3 * MAX_LINE_BYTES) + b'"}\n{"b": 1}\n')
    assert [(line.number, line.value) for line in json_lines(stream)][1:] == [(2, {"b": 1})]
    assert Counting.largest <= MAX_LINE_BYTES + 1


@pytest.mark.parametrize(("content", "rows"), [
    (b"", 0), (b"\n \n\r\n", 0), (codecs.BOM_UTF8 + b"\n{}\n", 1), (b'{"a": 1}\n\n{"a": 2}', 2),
    (b'{"a": 1}\r\n{"a": 2}\r\n \n', 2), (b"not json\n{}\n", 2)])
def test_a_jsonl_size_is_the_records_it_yields(tmp_path, content, rows):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    source = open_source(DatasetSettings(source="local", path=str(path), format="auto"))
    assert source.size() == rows == len(list(source.records()))


def test_a_jsonl_size_counts_lines_across_its_read_blocks(tmp_path):
    """Lines that straddle the MiB blocks it is counted in, one over the 8 MiB cap (a record of its own) and a blank
    line of 3 MiB of spaces."""
    path = tmp_path / "rows.jsonl"
    lines = [b'{"p": "' + b"x" * n + b'"}' for n in (10, (1 << 20) - 3, 5, 3 << 20)] + [b" " * (3 << 20), b"{}"]
    path.write_bytes(b"\n".join([*lines, HOSTILE["long"][0].encode()]) + b"\n")
    source = open_source(DatasetSettings(source="local", path=str(path), format="auto"))
    assert source.size() == 6 == len(list(source.records()))


def test_a_json_array_has_no_size_before_it_is_read(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "a"}]')
    assert open_source(DatasetSettings(source="local", path=str(path), format="auto")).size() is None
