"""Crash-safe output: whole-block appends, resume repair of torn/incomplete tails and of duplicate blocks,
error-file compaction, the id index, sibling permissions."""

from __future__ import annotations

import json
import os

import pytest

from regen.outputs.output_files import (
    DamagedOutputError,
    IdIndex,
    LineAppender,
    OutputPaths,
    compact_errors,
    repair_and_scan,
)


def rows(primary_id: str, count: int, declared: int | None = None) -> list[dict]:
    metadata = {"idx": 0} if declared is None else {"idx": 0, "num_generations": declared}
    return [{"id": f"{primary_id}_gen{k}", "primary_id": primary_id, "input_ids": [1, 2], "loss_mask": [0, 1],
             "text": 'say "num_generations": 9', "metadata": metadata} for k in range(count)]


def write(path, blocks):
    appender = LineAppender(path)
    for block in blocks:
        appender.append(block)
    appender.close()


def test_paths_are_siblings(tmp_path):
    paths = OutputPaths(tmp_path / "magpie_Qwen3-8B.jsonl")
    assert paths.errors == tmp_path / "magpie_Qwen3-8B.errors.jsonl"
    assert paths.summary == tmp_path / "magpie_Qwen3-8B.summary.json"
    assert paths.manifest == tmp_path / "magpie_Qwen3-8B.manifest.json"
    assert paths.lock == tmp_path / "magpie_Qwen3-8B.lock"


def test_complete_file_is_left_alone(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, [rows("a", 2, 2), rows("b", 1, 1), rows("c\"q", 3, 3)])
    before = path.read_bytes()
    state = repair_and_scan(path)
    assert path.read_bytes() == before
    assert all(key in state.done_ids for key in ("a", "b", 'c"q')) and "d" not in state.done_ids
    assert (len(state.done_ids), state.dropped_rows, state.dropped_bytes) == (3, 0, 0)


def test_torn_last_line_is_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, [rows("a", 1, 1), rows("b", 2, 2)])
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"id": "c_gen0", "primary_id": "c", "input_')
    state = repair_and_scan(path)
    assert path.read_bytes() == intact
    assert "c" not in state.done_ids and "b" in state.done_ids
    assert state.dropped_bytes == len(b'{"id": "c_gen0", "primary_id": "c", "input_')


def test_incomplete_last_block_is_cut_whole(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, [rows("a", 1, 1)])
    intact = path.read_bytes()
    write(path, [rows("b", 3, 3)[:2]])  # killed after two of three rows reached the file
    with path.open("ab") as handle:
        handle.write(b'{"id": "b_gen2", "prim')
    state = repair_and_scan(path)
    assert path.read_bytes() == intact
    assert (state.dropped_rows, "b" in state.done_ids, "a" in state.done_ids) == (2, False, True)


def test_damage_before_the_tail_is_an_error_not_a_silent_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, [rows("a", 1, 2), rows("b", 1, 1)])
    with pytest.raises(DamagedOutputError, match="conversation a has 1 of 2 rows"):
        repair_and_scan(path)
    path.write_text('{"id": "a_gen0", "primary_id": "a"}\nnot json\n')
    with pytest.raises(DamagedOutputError, match=r"out.jsonl:2: not a JSON row"):
        repair_and_scan(path)


def test_rows_from_other_writers_resume_by_primary_id_or_id(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"primary_id": "p", "id": "p_gen0"}) + "\n" + json.dumps({"id": "legacy"}) + "\n")
    state = repair_and_scan(path)
    assert "p" in state.done_ids and "legacy" in state.done_ids


def test_error_compaction_keeps_newest_row_per_id_and_drops_recovered(tmp_path):
    path = tmp_path / "out.errors.jsonl"

    def error(key, text, stage="generation"):
        return {"id": key, "metadata": {"error": text, "stage": stage}}

    write(path, [[error("a", "old")], [error("b", "x")], [error("a", "new")], [error("f.jsonl:3", "bad", "input")]])
    with path.open("ab") as handle:
        handle.write(b'{"id": "z", "meta')  # torn
    recovered = IdIndex()
    recovered.add("b")
    assert compact_errors(path, recovered) == {"a", "f.jsonl:3"}
    assert [json.loads(line)["metadata"]["error"] for line in path.read_text().splitlines()] == ["new", "bad"]
    assert compact_errors(path, set(), drop_input_errors=True) == {"a"}
    assert compact_errors(tmp_path / "missing.jsonl", set()) == set()


def test_appender_writes_whole_blocks(tmp_path):
    path = tmp_path / "deep" / "out.jsonl"
    big = rows("a", 3, 3)
    big[0]["input_ids"] = list(range(200_000))
    write(path, [big, rows("b", 1, 1)])
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a_gen0", "a_gen1", "a_gen2", "b_gen0"]
    assert json.loads(lines[0])["input_ids"][-1] == 199_999


def test_id_index_keeps_every_id_and_its_first_value_across_merges():
    ids = IdIndex(buffer=64)
    keys = [f"conversation-{i}" for i in range(3000)]
    for position, key in enumerate(keys[::2]):
        ids.add(key, position)
    ids.add(keys[0], 999)  # a repeat is not counted twice and keeps its first value
    assert len(ids) == 1500
    assert all(key in ids for key in keys[::2]) and not any(key in ids for key in keys[1::2])
    assert [ids.get(key) for key in keys[:6:2]] == [0, 1, 2] and ids.get(keys[2998]) == 1499
    assert ids.get(keys[1]) is None


def test_id_index_stays_compact_while_it_grows():
    """About 16 bytes per id held (two sorted arrays, plus at most an eighth of the ids in a dict), and no more than
    three times that at a merge's peak: a merge streams the entries, it does not list them as Python objects."""
    import tracemalloc

    count = 40_000
    keys = [f"conversation-{i}" for i in range(count)]
    ids = IdIndex(buffer=1024)
    tracemalloc.start()
    try:
        for position, key in enumerate(keys):
            ids.add(key, position)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ids) == count and ids.get(keys[-1]) == count - 1
    assert held < 32 * count
    assert peak < 64 * count  # listing every (digest, value) pair at a merge peaked at ~150 bytes per id


def test_duplicate_blocks_are_removed_keeping_the_first(tmp_path):
    path = tmp_path / "out.jsonl"
    first_a, first_b = rows("a", 2, 2), rows("b", 1, 1)
    first_a[0]["text"] = "first a"
    write(path, [first_a, first_b, rows("a", 2, 2), rows("c", 1, 1), rows("b", 1, 1), rows("b", 1, 1)])
    path.chmod(0o640)
    with path.open("ab") as handle:
        handle.write(b'{"id": "d_gen0", "primary_id": "d", "inp')  # and a torn tail
    state = repair_and_scan(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in lines] == ["a_gen0", "a_gen1", "b_gen0", "c_gen0"] and lines[0]["text"] == "first a"
    assert (state.removed_duplicate_blocks, state.removed_duplicate_rows, len(state.done_ids)) == (3, 4, 3)
    assert "d" not in state.done_ids and state.dropped_bytes > 0
    assert path.stat().st_mode & 0o777 == 0o640  # rewritten in place, permissions kept
    before = path.read_bytes()
    assert repair_and_scan(path).removed_duplicate_blocks == 0 and path.read_bytes() == before


def test_siblings_get_the_outputs_permissions(tmp_path):
    paths = OutputPaths(tmp_path / "out.jsonl")
    previous = os.umask(0o027)
    try:
        LineAppender(paths.output).close()
        LineAppender(paths.errors).close()
    finally:
        os.umask(previous)
    assert paths.output.stat().st_mode & 0o777 == 0o640 == paths.errors.stat().st_mode & 0o777
    paths.output.chmod(0o600)
    paths.match_output_mode(paths.errors)
    assert paths.errors.stat().st_mode & 0o777 == 0o600
