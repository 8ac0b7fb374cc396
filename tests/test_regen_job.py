"""regen end to end: ``run(cfg)`` against a scripted vLLM-dialect server on 127.0.0.1 (exact ids, masks, rows)."""

from __future__ import annotations

import json

import pytest

from regen.detokenizer import TokenizerMismatch
from regen.job import run
from regen.standin_server import Reply
from tests.regen_helpers import read_jsonl, regen_config, write_jsonl
from tests.scripted_vllm_server import EOS, Script, ok, tool_call

pytest_plugins = ("tests.regen_fixtures",)  # the `serve` fixture

WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                 {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.fixture
def regen(tmp_path, tokenizer_path):
    """run(cfg) on rows written to tmp_path/rows.jsonl; returns (summary, output rows, error rows)."""

    def go(urls, rows, *overrides):
        data = write_jsonl(tmp_path / "rows.jsonl", rows)
        summary = run(regen_config(tmp_path, urls, data, tokenizer_path, *overrides))
        return summary, read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")

    return go


def test_single_and_multi_turn_rows_are_exact(serve, regen, tokenizer, tmp_path):
    script = Script({
        "Hi": [ok("Hello!", [1, 300, 301, 2], [400, 401, EOS])],
        "Q1": [ok("A1", [1, 310, 2, 1, 311], [410, EOS]),
               ok("A2", [1, 310, 2, 1, 311, 410, EOS, 1, 312], [420, 421, 422, EOS], finish_reason="stop")],
        "Only": [ok("Done", [1, 320], [430, EOS])],
    })
    server = serve(script, model="org/Target-1B")
    rows = [
        {"id": "A", "prompt": "Hi"},
        {"id": "B", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Q1"},
                                      {"from": "gpt", "value": "OLD1"}, {"from": "human", "value": "Q2"},
                                      {"from": "gpt", "value": "OLD2"}]},
        {"messages": [{"role": "user", "content": "Only"}, {"role": "assistant", "content": "OLD"}]},
    ]
    summary, out, errors = regen([server.url], rows, "concurrency=1")
    hashed = next(r["primary_id"] for r in out if r["primary_id"].startswith("hash_"))
    assert [r["id"] for r in out] == ["A_gen0", "B_gen0", "B_gen1", f"{hashed}_gen0"]
    b1 = out[2]
    assert b1["input_ids"] == [1, 310, 2, 1, 311, 410, EOS, 1, 312, 420, 421, 422, EOS]
    assert b1["loss_mask"] == [0] * 9 + [1] * 4
    assert b1["text"] == tokenizer.decode(b1["input_ids"], skip_special_tokens=False)
    assert b1["metadata"] == {
        "idx": 1, "finish_reason": "stop", "is_tool_call": False,
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13, "prompt_tokens_details": None},
        "endpoint": server.url, "sampling_params": {}, "num_generations": 2}
    assert out[0]["loss_mask"] == [0, 0, 0, 0, 1, 1, 1] and out[3]["metadata"]["idx"] == 2
    first, second = script.seen["Q1"]
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}]
    assert second["messages"][2:] == [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    assert all(p["model"] == "org/Target-1B" and p["return_token_ids"] is True and p["max_tokens"] == 8192
               and "tools" not in p for p in server.requests)
    assert errors == []
    assert (summary["conversations_done"], summary["rows_written"], summary["requests"], summary["status"]) == (3, 4, 4, "completed")
    assert summary["endpoints"][server.url]["conversations"] == 3
    written = json.loads((tmp_path / "out.summary.json").read_text())
    assert written["rows_written"] == 4 and written["model"] == "org/Target-1B"


def test_sampling_and_extra_params_are_merged_never_override(serve, regen):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}))
    summary, out, _ = regen([server.url], [{"id": "A", "prompt": "Hi"}], "sampling=qwen3_thinking",
                            "sampling.seed=3", "+extra_request_params={chat_template_kwargs: {enable_thinking: false}}",
                            "max_tokens=77")
    payload = server.requests[0]
    expected = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 3,
                "chat_template_kwargs": {"enable_thinking": False}}
    assert {k: v for k, v in payload.items() if k not in ("model", "messages", "max_tokens", "return_token_ids")} == expected
    assert payload["max_tokens"] == 77
    assert out[0]["metadata"]["sampling_params"] == expected == summary["sampling_params"]


def test_extra_params_may_not_touch_regen_keys(serve, regen):
    server = serve(Script({}))
    with pytest.raises(ValueError, match=r"may not set \['max_tokens', 'model'\]"):
        regen([server.url], [{"prompt": "Hi"}], "+extra_request_params={model: other, max_tokens: 1}")


def test_tool_calls_are_paired_with_cached_results_in_order(serve, regen):
    script = Script({"Weather and time in Oslo?": [
        ok(None, [1, 50], [21, 60, 22, EOS], finish_reason="tool_calls",
           tool_calls=[tool_call("get_weather", '{"city": "Oslo"}', "call-w")]),
        ok("", [1, 50, 21, 60, 22, EOS, 23, 70, 24], [21, 61, 22, EOS], finish_reason="tool_calls",
           tool_calls=[tool_call("get_time", '{"city": "Oslo"}', "call-t")]),
        ok("4 C, noon.", [1, 50, 21, 60, 22, EOS, 23, 70, 24, 21, 61, 22, EOS, 23, 71, 24], [80, 81, EOS]),
    ]})
    server = serve(script)
    row = {"id": "T", "tools": json.dumps(WEATHER_TOOLS), "conversations": [
        {"from": "human", "value": "Weather and time in Oslo?"},
        {"from": "gpt", "value": "<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Oslo'}}\n</tool_call>"},
        {"from": "tool", "value": '<tool_response>\n{"name": "get_weather", "content": {"temp_c": 4}}\n</tool_response>'},
        {"from": "gpt", "value": "<tool_call>\n{'name': 'get_time', 'arguments': {}}\n</tool_call>"},
        {"from": "tool", "value": '<tool_response>\n{"name": "get_time", "content": "12:00"}\n</tool_response>'},
        {"from": "gpt", "value": "It is 4 C at noon."}]}
    summary, out, errors = regen([server.url], [row])
    assert [(r["id"], r["metadata"]["is_tool_call"], r["metadata"]["finish_reason"]) for r in out] == [
        ("T_gen0", True, "tool_calls"), ("T_gen1", True, "tool_calls"), ("T_gen2", False, "stop")]
    assert out[2]["input_ids"][-3:] == [80, 81, EOS] and out[2]["loss_mask"] == [0] * 16 + [1] * 3
    requests = script.seen["Weather and time in Oslo?"]
    assert all(p["tools"] == WEATHER_TOOLS and p["tool_choice"] == "auto" for p in requests)
    assert requests[1]["messages"][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", '{"city": "Oslo"}', "call-w")]},
        {"role": "tool", "content": '{"name": "get_weather", "content": {"temp_c": 4}}', "tool_call_id": "call-w"}]
    assert requests[2]["messages"][-1] == {"role": "tool", "content": '{"name": "get_time", "content": "12:00"}',
                                           "tool_call_id": "call-t"}
    assert summary["conversations_truncated"] == 0 and errors == []


HERMES_ROW = {"id": "H", "tools": WEATHER_TOOLS, "conversations": [
    {"from": "human", "value": "Oslo?"},
    {"from": "tool", "value": '<tool_response>\n{"name": "get_weather", "content": 4}\n</tool_response>'},
    {"from": "human", "value": "Thanks. Bergen?"}]}


@pytest.mark.parametrize("calls,reason", [
    ([tool_call("get_weather", "{}", "c1"), tool_call("get_time", "{}", "c2")], "parallel_tool_calls"),
    ([tool_call("get_time", "{}", "c1")], "tool_name_mismatch"),
])
def test_unpairable_calls_truncate_and_keep_rows(serve, regen, calls, reason):
    server = serve(Script({"Oslo?": [ok(None, [1, 5], [21, 6, 22, EOS], finish_reason="tool_calls", tool_calls=calls)]}))
    summary, out, errors = regen([server.url], [HERMES_ROW])
    assert [r["id"] for r in out] == ["H_gen0"] and out[0]["metadata"]["num_generations"] == 1
    assert summary["truncated_by_reason"] == {reason: 1} and summary["conversations_done"] == 1
    assert len(server.requests) == 1 and errors == []


def test_exhausted_results_and_length_finish_truncate(serve, regen):
    script = Script({
        "Oslo?": [ok("", [1, 5], [21, 6, 22, EOS], finish_reason="tool_calls", tool_calls=[tool_call("get_weather", "{}", "a")]),
                  ok(None, [1, 5, 7], [21, 8, 22, EOS], finish_reason="tool_calls", tool_calls=[tool_call("get_weather", "{}", "b")])],
        "Long": [ok("cut", [1, 9], [10, 11], finish_reason="length")],
    })
    server = serve(script)
    long_row = {"id": "L", "messages": [{"role": "user", "content": "Long"}, {"role": "user", "content": "never asked"}]}
    summary, out, _ = regen([server.url], [HERMES_ROW, long_row])
    assert sorted(r["id"] for r in out) == ["H_gen0", "H_gen1", "L_gen0"]
    assert summary["truncated_by_reason"] == {"tool_results_exhausted": 1, "length": 1}
    assert len(script.seen["Long"]) == 1  # the second user turn is not asked after a cut-off answer


def _fails_then(reply_first: Reply, times: int = 1):
    return [reply_first] * times + [ok("fine", [1, 5], [6, EOS])]


@pytest.mark.parametrize("first", [
    Reply({"error": {"message": "overloaded"}}, status=503),
    Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"}),
    Reply(drop=True),
    Reply(raw=b'{"choices": [tru'),
], ids=["503", "429-retry-after", "dropped-connection", "malformed-json"])
def test_transient_failures_are_retried(serve, regen, first):
    server = serve(Script({"Hi": _fails_then(first)}))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "Hi"}])
    assert [r["id"] for r in out] == ["A_gen0"] and errors == []
    assert (summary["retries"], len(server.requests)) == (1, 2)


def test_retry_after_is_honoured(serve, regen):
    server = serve(Script({"Hi": _fails_then(Reply({"error": {"message": "busy"}}, status=429, headers={"Retry-After": "1"}))}))
    summary, out, _ = regen([server.url], [{"id": "A", "prompt": "Hi"}], "retry_backoff_s=0.001", "max_backoff_s=5")
    assert [r["id"] for r in out] == ["A_gen0"]
    assert (summary["retries"], summary["retry_wait_s"]) == (1, 1.0)  # the server's wait, not the 1 ms backoff


def test_retries_are_bounded(serve, regen):
    server = serve(Script({"Hi": [Reply(raw=b"<html>oops</html>")] * 10}))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "Hi"}], "max_retries=2")
    assert out == [] and len(server.requests) == 3
    assert errors[0]["id"] == "A" and "gave up after 3 attempts" in errors[0]["metadata"]["error"]
    assert "is not JSON" in errors[0]["metadata"]["error"]


@pytest.mark.parametrize("reply,message", [
    (Reply({"error": {"message": "tool_choice auto needs --enable-auto-tool-choice"}}, status=400),
     "HTTP 400 from {url}/v1/chat/completions: tool_choice auto needs --enable-auto-tool-choice"),
    (Reply({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}),
     "no prompt_token_ids: the endpoint must support return_token_ids"),
    (ok("", [1, 2], [EOS]), "empty generation"),
], ids=["400", "missing-token-ids", "empty-generation"])
def test_permanent_failures_fail_at_once_with_an_error_row(serve, regen, reply, message):
    server = serve(Script({"Hi": [reply] * 3}))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "Hi"}, {"id": "B", "prompt": "Hi"}], "concurrency=1")
    assert out == [] and len(server.requests) == 2  # one request per conversation: no retries
    assert [e["id"] for e in errors] == ["A", "B"]
    meta = errors[0]["metadata"]
    assert message.format(url=server.url) in meta["error"]
    assert (meta["idx"], meta["generations_completed"], meta["endpoint"], meta["stage"]) == (0, 0, server.url, "generation")
    assert summary["conversations_failed"] == 2 and summary["errors_file_rows"] == 2


def test_failure_mid_conversation_writes_nothing_for_it(serve, regen):
    server = serve(Script({"Q1": [ok("A1", [1, 5], [6, EOS]), Reply({"error": {"message": "bad"}}, status=422)]}))
    summary, out, errors = regen([server.url], [{"id": "M", "messages": [
        {"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"}]}])
    assert out == [] and errors[0]["metadata"]["generations_completed"] == 1


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


def test_language_filter_limit_and_duplicate_ids(serve, regen):
    server = serve(lambda payload: ok("ok", [1, 5], [6, EOS]))
    rows = [{"id": "1", "prompt": "a", "language": "EN"}, {"id": "2", "prompt": "b", "language": "FR"},
            {"id": "1", "prompt": "a again", "language": "EN"}, {"id": "3", "prompt": "c", "language": "EN"},
            {"id": "4", "prompt": "d", "language": "EN"}]
    summary, out, _ = regen([server.url], rows, "language_filter=EN", "limit=3")
    assert sorted(r["id"] for r in out) == ["1_gen0", "3_gen0"]
    assert (summary["skipped_language"], summary["skipped_duplicate_id"]) == (1, 1)


def test_resume_skips_done_retries_failed_and_repairs_a_torn_tail(serve, regen, tmp_path):
    rows = [{"id": name, "prompt": name} for name in ("a", "b", "c", "d")]
    flaky = {"a": [ok("A", [1, 5], [6, EOS])], "b": [Reply({"error": {"message": "no"}}, status=400)],
             "c": [ok("C", [1, 5], [7, EOS])], "d": [ok("D", [1, 5], [8, EOS])]}
    first = serve(Script(flaky))
    summary, out, errors = regen([first.url], rows)
    assert sorted(r["id"] for r in out) == ["a_gen0", "c_gen0", "d_gen0"] and [e["id"] for e in errors] == ["b"]
    output = tmp_path / "out.jsonl"
    lines = output.read_text().splitlines(keepends=True)
    torn_id = json.loads(lines[-1])["primary_id"]
    output.write_text("".join(lines[:-1]) + lines[-1][:40])  # kill -9 in the middle of the last write

    with pytest.raises(FileExistsError, match="pass resume=true"):
        regen([first.url], rows)

    second = serve(lambda payload: ok("again", [1, 5], [9, EOS]))
    summary, out, errors = regen([second.url], rows, "resume=true")
    assert sorted(r["primary_id"] for r in out) == ["a", "b", "c", "d"]  # each exactly once
    assert sorted(p["messages"][0]["content"] for p in second.requests) == sorted(["b", torn_id])
    assert errors == []  # b succeeded this time: it no longer counts as failed
    assert (summary["skipped_already_done"], summary["recovered_from_errors"], summary["errors_file_rows"]) == (2, 1, 0)
    assert summary["resume_dropped_bytes"] == 40


def test_model_is_detected_and_checked(serve, regen):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model="served/name")
    with pytest.raises(ValueError, match=r"server.model='other' is not served by the endpoints \(they serve \['served/name'\]\)"):
        regen([server.url], [{"prompt": "Hi"}], "server.model=other")
    summary, _, _ = regen([server.url], [{"prompt": "Hi"}], "server.model=served/name")
    assert summary["model"] == "served/name"


def test_api_key_is_sent_but_never_written(serve, regen, tmp_path, monkeypatch):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}))
    monkeypatch.setenv("REGEN_TEST_KEY", "sk-secret-123")
    regen([server.url], [{"id": "A", "prompt": "Hi"}], "api_key_env=REGEN_TEST_KEY")
    assert server.server.authorizations == ["Bearer sk-secret-123", "Bearer sk-secret-123"]  # /v1/models, chat
    for name in ("out.jsonl", "out.summary.json"):
        assert "sk-secret" not in (tmp_path / name).read_text()
    with pytest.raises(ValueError, match="api_key_env=REGEN_MISSING_KEY: that environment variable is not set"):
        regen([server.url], [{"prompt": "Hi"}], "api_key_env=REGEN_MISSING_KEY")


def test_wrong_tokenizer_stops_the_run(serve, regen, tmp_path):
    server = serve(Script({"Hi": [ok("x", [1, 5], [151644, EOS])]}))
    with pytest.raises(TokenizerMismatch, match="token id 151644 is outside the vocabulary"):
        regen([server.url], [{"id": "A", "prompt": "Hi"}])
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: TokenizerMismatch")


def test_output_is_named_after_dataset_and_model(serve, tmp_path, tokenizer_path):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model="org/Qwen3-8B")
    data = write_jsonl(tmp_path / "my_prompts.jsonl", [{"prompt": "Hi"}])
    summary = run(regen_config(tmp_path, [server.url], data, tokenizer_path, "output=null", f"output_dir={tmp_path / 'o'}"))
    assert summary["output"] == str(tmp_path / "o" / "my_prompts_Qwen3-8B.jsonl")
    assert len(read_jsonl(tmp_path / "o" / "my_prompts_Qwen3-8B.jsonl")) == 1


@pytest.mark.parametrize("override,message", [
    ("concurrency=0", "concurrency must be an integer >= 1, got 0"),
    ("concurrency=2.5", "concurrency must be an integer >= 1, got 2.5"),
    ("max_retries=-1", "max_retries must be an integer >= 0"),
    ("request_timeout_s=0", "request_timeout_s must be a number > 0"),
    ("limit=-3", "limit must be null or an integer >= 0"),
    ("dataset.format=csv", "dataset.format='csv' is unknown"),
])
def test_bad_settings_fail_before_anything_starts(tmp_path, tokenizer_path, override, message):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Hi"}])
    with pytest.raises(ValueError, match=message):
        run(regen_config(tmp_path, ["http://127.0.0.1:9"], data, tokenizer_path, override))
    assert not (tmp_path / "out.jsonl").exists()


def test_multimodal_preset_is_refused_with_the_reason(tmp_path, tokenizer_path):
    from tests.test_configs import compose_config

    cfg = compose_config("regen", ["dataset=sharegpt4v-coco", "server=external", "server.endpoints=[http://127.0.0.1:9]"])
    with pytest.raises(ValueError, match="dataset sharegpt4v-coco is multimodal .* text-only"):
        run(cfg)
