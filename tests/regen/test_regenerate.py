"""Regenerating one conversation (through ``run`` against a scripted server): turn by turn on the model's own
answers, tool calls paired 1:1 with cached results, truncation that keeps rows, failures that keep none."""

from __future__ import annotations

import json

import pytest

from standins.vllm_server import Reply
from tests.helpers.regen_support import EOS, Script, ok, tool_call

WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                 {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


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


def test_failure_mid_conversation_writes_nothing_for_it(serve, regen_failing):
    server = serve(Script({"Q1": [ok("A1", [1, 5], [6, EOS]), Reply({"error": {"message": "bad"}}, status=422)]}))
    summary, out, errors = regen_failing([server.url], [{"id": "M", "messages": [
        {"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"}]}])
    assert out == [] and errors[0]["metadata"]["generations_completed"] == 1

