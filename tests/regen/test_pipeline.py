"""The streaming pipeline (through ``run``): unusable rows become error rows and the run goes on, the language
filter and limit, and duplicate ids -- the first row claims an id, every later one is an error row naming both."""

from __future__ import annotations

import gc
import logging

import pytest

from regen.conversations.detokenizer import TokenizerMismatchError
from tests.helpers.regen_support import EOS, Script, ok
from tests.regen.test_row_sources import HOSTILE


def test_bad_local_rows_become_error_rows_and_the_run_goes_on(serve, regen, tmp_path):
    server = serve(Script({"good": [ok("y", [1, 5], [6, EOS])]}))
    rows = ['{"id": "x", "prompt": ', {"id": "i", "instruction": "Do it"}, {"id": "e", "messages": []},
            {"id": "g", "prompt": "good"}, "[1, 2]"]
    summary, out, errors = regen([server.url], rows)
    data = tmp_path / "rows.jsonl"
    assert [r["id"] for r in out] == ["g_gen0"]
    assert [(e["id"], e["metadata"]["source"], e["metadata"]["stage"]) for e in errors] == [
        (f"{data}:1", f"{data}:1", "input"), ("i", f"{data}:2", "input"), ("e", f"{data}:3", "input"),
        (f"{data}:5", f"{data}:5", "input")]
    assert errors[0]["metadata"]["error"].startswith("invalid JSON")
    assert "found 'instruction', which regen does not read" in errors[1]["metadata"]["error"]
    assert errors[1]["metadata"]["error"].startswith(f"{data}:2: ")
    assert "'messages' is empty" in errors[2]["metadata"]["error"]
    assert "row is list, expected a JSON object" in errors[3]["metadata"]["error"]
    assert (summary["input_errors"], summary["conversations_done"], summary["conversations_failed"]) == (4, 1, 0)


def test_language_filter_and_limit(serve, regen, tmp_path):
    server = serve(lambda payload: ok("ok", [1, 5], [6, EOS]))
    rows = [{"id": "1", "prompt": "a", "language": "EN"}, {"id": "2", "prompt": "b", "language": "FR"},
            {"id": "1", "prompt": "a again", "language": "EN"}, {"id": "3", "prompt": "c", "language": "EN"},
            {"id": "4", "prompt": "d", "language": "EN"}]
    summary, out, errors = regen([server.url], rows, "language_filter=EN", "limit=3")
    assert sorted(r["id"] for r in out) == ["1_gen0", "3_gen0"]  # the limit counts the duplicate too
    assert [e["id"] for e in errors] == [f"{tmp_path / 'rows.jsonl'}:3"]
    assert (summary["skipped_language"], summary["duplicate_ids"], summary["input_errors"]) == (1, 1, 1)


def test_duplicate_ids_good_and_bad_rows_each_end_in_exactly_one_file(serve, regen, tmp_path):
    server = serve(lambda payload: ok("ok", [1, 5], [6, EOS]))
    rows = [{"id": "x", "prompt": "first x"}, {"id": "x", "prompt": "another conversation"},
            {"id": "y", "messages": []}, {"id": "y", "prompt": "a good y after a bad one"},
            {"id": "z", "prompt": "good z"}, {"id": "z", "messages": "a bad z after a good one"}]
    data = tmp_path / "rows.jsonl"
    summary, out, errors = regen([server.url], rows, "concurrency=1")
    assert [r["id"] for r in out] == ["x_gen0", "z_gen0"]
    assert [p["messages"][0]["content"] for p in server.requests] == ["first x", "good z"]
    assert [(e["id"], e["metadata"]["stage"], e["metadata"]["idx"]) for e in errors] == [
        (f"{data}:2", "input", 1), ("y", "input", 2), (f"{data}:4", "input", 3), (f"{data}:6", "input", 5)]
    assert errors[0]["metadata"]["error"] == (f"{data}:2: id 'x' was already used by {data}:1; only that row is "
                                              "regenerated (give this one its own id)")
    assert f"id 'y' was already used by {data}:3" in errors[2]["metadata"]["error"]
    assert f"id 'z' was already used by {data}:5" in errors[3]["metadata"]["error"]
    assert not {r["primary_id"] for r in out} & {e["id"] for e in errors}
    assert (summary["duplicate_ids"], summary["input_errors"], summary["conversations_done"]) == (3, 4, 2)

    summary, again, errors_again = regen([server.url], rows, "resume=true")  # nothing new, the same error rows
    assert again == out and errors_again == errors and len(server.requests) == 2
    assert (summary["skipped_already_done"], summary["duplicate_ids"]) == (2, 3)


def test_duplicate_elements_of_a_json_array_are_named_by_index(serve, tmp_path, tokenizer_path):
    from regen.job import run
    from tests.helpers.regen_support import read_jsonl, regen_config

    server = serve(lambda payload: ok("ok", [1, 5], [6, EOS]))
    data = tmp_path / "rows.json"
    data.write_text('[{"id": "a", "prompt": "one"},\n {"id": "a", "prompt": "two"}]')
    run(regen_config(tmp_path, [server.url], data, tokenizer_path))
    [error] = read_jsonl(tmp_path / "out.errors.jsonl")
    assert error["id"] == f"{data}:2 (element 1)"
    assert error["metadata"]["error"].startswith(f"{data}:2 (element 1): id 'a' was already used by {data} element 0")


def test_a_bad_element_of_a_json_array_is_an_error_row_with_its_index(serve, tmp_path, tokenizer_path):
    from regen.job import run
    from tests.helpers.regen_support import read_jsonl, regen_config

    server = serve(lambda payload: ok("ok", [1, 5], [6, EOS]))
    data = tmp_path / "rows.json"
    data.write_text('[{"id": "a", "prompt": "one"},\n {"id": "b", "question": "two"},\n 7,\n {"id": "c", "prompt": "3"}]')
    summary = run(regen_config(tmp_path, [server.url], data, tokenizer_path))
    assert sorted(r["primary_id"] for r in read_jsonl(tmp_path / "out.jsonl")) == ["a", "c"]
    errors = read_jsonl(tmp_path / "out.errors.jsonl")
    assert [(e["id"], e["metadata"]["idx"], e["metadata"]["source"]) for e in errors] == [
        ("b", 1, f"{data}:2 (element 1)"), (f"{data}:3 (element 2)", 2, f"{data}:3 (element 2)")]
    assert "found 'question', which regen does not read" in errors[0]["metadata"]["error"]
    assert "row is int, expected a JSON object" in errors[1]["metadata"]["error"]
    assert (summary["input_errors"], summary["conversations_done"]) == (2, 2)


def test_a_run_that_stops_on_an_error_leaves_asyncio_nothing_to_report(serve, regen, caplog):
    """A token id outside the vocabulary stops the run while the reader waits at the full queue and the dispatcher
    at the pool: every task is cancelled and awaited, and no future's exception is left unretrieved (asyncio would
    print '_GatheringFuture exception was never retrieved' with a traceback)."""
    server = serve(lambda payload: ok("x", [1, 5], [6, 10**6, EOS]))
    rows = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(700)]  # more than the queue holds
    with caplog.at_level(logging.DEBUG, logger="asyncio"), pytest.raises(TokenizerMismatchError):
        regen([server.url], rows, "concurrency=2")
    gc.collect()
    assert [record.getMessage() for record in caplog.records if record.name == "asyncio"
            and record.levelno >= logging.ERROR] == []


def test_hostile_rows_are_error_rows_and_every_good_row_is_done(serve, regen, tmp_path):
    """200,000 nested brackets, a lone surrogate and a 9 MiB line each become one error row naming FILE:LINE; the
    good rows around them are regenerated (before: a RecursionError or orjson's TypeError ended the run)."""
    server = serve(lambda payload: ok("y", [1, 5], [6, EOS]))
    rows = [{"id": "g0", "prompt": "a"}, *(line for line, _ in HOSTILE.values()), {"id": "g1", "prompt": "b"}]
    summary, out, errors = regen([server.url], rows)
    data = tmp_path / "rows.jsonl"
    assert sorted(row["primary_id"] for row in out) == ["g0", "g1"]
    assert [(e["id"], e["metadata"]["stage"]) for e in errors] == [(f"{data}:{n}", "input") for n in (2, 3, 4)]
    for error, (_, expected) in zip(errors, HOSTILE.values(), strict=True):
        assert expected in error["metadata"]["error"]
    assert (summary["conversations_done"], summary["input_errors"], summary["status"]) == (2, 3, "completed")
