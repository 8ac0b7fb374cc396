"""Reading local files line by line with line numbers, and the real Hugging Face streaming path."""

from __future__ import annotations

import json

import pytest

from regen.row_sources import SourceRecord, local_records, open_records


def test_jsonl_rows_and_malformed_lines_keep_their_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n{"prompt": \n[1, 2]\n{"prompt": "\xff"}\n' + b'{"prompt": "\xc3\xa9"}')
    records = list(local_records(path))
    assert [(r.idx, r.where) for r in records] == [
        (0, f"{path}:1"), (2, f"{path}:3"), (3, f"{path}:4"), (4, f"{path}:5"), (5, f"{path}:6")]
    assert records[0].row == {"prompt": "a"} and records[0].error is None
    assert records[1].error.startswith("invalid JSON: Expecting value")
    assert records[2].row == [1, 2]  # valid JSON, not an object: rejected later by the row format
    assert records[3].error.startswith("not UTF-8")
    assert records[4].row == {"prompt": "é"}  # last line without a newline is still a row


def test_json_array_rows_carry_the_line_they_start_on(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"prompt": "a"},\n\n  {"prompt": "b",\n   "id": 2}, {"prompt": "c"}\n]\n')
    records = list(local_records(path))
    assert [(r.idx, r.where, r.row["prompt"]) for r in records] == [
        (0, f"{path}:2", "a"), (1, f"{path}:4", "b"), (2, f"{path}:5", "c")]


@pytest.mark.parametrize("text,message", [
    ('{"prompt": "a"}', "must be a top-level array"),
    ('[{"prompt": "a"},\n {"prompt": }]', r":2: invalid JSON"),
    ('[{"prompt": "a"} {"prompt": "b"}]', "expected ',' or ']' after row 0"),
])
def test_broken_json_array_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "rows.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        list(local_records(path))


def test_local_file_checks(tmp_path):
    with pytest.raises(ValueError, match=r"must be \.json"):
        local_records(tmp_path / "rows.csv")
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        local_records(tmp_path / "missing.jsonl")


def test_hub_path_streams_a_dataset_folder_with_split(tmp_path):
    folder = tmp_path / "hub_like"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"p{i}"}) + "\n" for i in range(3)))
    (folder / "test.jsonl").write_text(json.dumps({"id": "x", "prompt": "q"}) + "\n")
    records = list(open_records({"source": "hf", "path": str(folder), "subset": None, "split": "test"}))
    assert [(r.idx, r.row["id"]) for r in records] == [(0, "x")]
    assert records[0].where == f"{folder}[test] row 0"
    records = list(open_records({"source": "hf", "path": str(folder), "subset": None, "split": "train"}))
    assert [r.row["prompt"] for r in records] == ["p0", "p1", "p2"]


def test_hub_path_passes_subset_split_and_streaming(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        return iter([{"question": "q0"}, {"question": "q1"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = list(open_records({"source": "hf", "path": "openai/gsm8k", "subset": "main", "split": "train"}))
    assert calls == [("openai/gsm8k", "main", "train", True)]
    assert records == [SourceRecord(0, "openai/gsm8k[main/train] row 0", {"question": "q0"}),
                       SourceRecord(1, "openai/gsm8k[main/train] row 1", {"question": "q1"})]


def test_unknown_source_and_missing_split():
    with pytest.raises(ValueError, match="dataset.source='s3' is unknown"):
        open_records({"source": "s3", "path": "x"})
    with pytest.raises(ValueError, match="dataset.split is required"):
        open_records({"source": "hf", "path": "a/b", "split": None})
