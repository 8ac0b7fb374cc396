"""Reading vLLM replies (literal shapes from the reference) into checked generations."""

from __future__ import annotations

import pytest

from regen.conversations.replies import ReplyError, parse_reply
from tests.helpers.regen_support import ok

STOP = {"id": "chatcmpl-1a2b", "object": "chat.completion", "created": 1760000000, "model": "Qwen/Qwen3-8B", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Four.", "reasoning": None}, "logprobs": None, "finish_reason": "stop", "stop_reason": None, "token_ids": [9001, 13, 151645]}], "usage": {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3, "prompt_tokens_details": None}, "prompt_token_ids": [151644, 872, 198, 17, 151645]}  # noqa: E501
LENGTH = {"id": "chatcmpl-3c4d", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Tides begin", "reasoning": None}, "finish_reason": "length", "stop_reason": None, "token_ids": [785, 3840]}], "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}, "prompt_token_ids": [151644, 872]}  # noqa: E501
TOOL = {"id": "chatcmpl-5e6f", "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "chatcmpl-tool-9f8e7d", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}], "reasoning": None}, "finish_reason": "tool_calls", "stop_reason": None, "token_ids": [151657, 198, 4913, 606, 151658, 151645]}], "usage": {"prompt_tokens": 6, "total_tokens": 12, "completion_tokens": 6}, "prompt_token_ids": [151644, 8948, 198, 151645, 151644, 872]}  # noqa: E501
REASONING = {"id": "chatcmpl-7a8b", "choices": [{"index": 0, "message": {"role": "assistant", "content": "\n\n4", "reasoning": "Add two and two."}, "finish_reason": "stop", "stop_reason": None, "token_ids": [151667, 2212, 1378, 151668, 271, 19, 151645]}], "usage": {"prompt_tokens": 3, "total_tokens": 10, "completion_tokens": 7}, "prompt_token_ids": [151644, 872, 198]}  # noqa: E501


def test_literal_vllm_replies():
    stop = parse_reply(STOP)
    assert (stop.prompt_ids, stop.generated_ids, stop.finish_reason) == ([151644, 872, 198, 17, 151645], [9001, 13, 151645], "stop")
    assert (stop.content, stop.reasoning, stop.reasoning_field, stop.tool_calls) == ("Four.", None, "reasoning", [])
    assert parse_reply(LENGTH).finish_reason == "length"
    tool = parse_reply(TOOL)
    assert (tool.content, tool.tool_calls) == (None, TOOL["choices"][0]["message"]["tool_calls"])
    thought = parse_reply(REASONING)
    assert (thought.content, thought.reasoning, thought.reasoning_field) == ("\n\n4", "Add two and two.", "reasoning")


def test_older_reasoning_content_field_is_read():
    old = {**REASONING, "choices": [{**REASONING["choices"][0], "message": {
        "role": "assistant", "content": "4", "reasoning_content": "Sum."}}]}
    assert (parse_reply(old).reasoning, parse_reply(old).reasoning_field) == ("Sum.", "reasoning_content")
    no_field = {**STOP, "choices": [{**STOP["choices"][0], "message": {"role": "assistant", "content": "4"}}]}
    assert parse_reply(no_field).reasoning_field == "reasoning"


def _with(choice_changes=None, **top):
    body = {**STOP, **top}
    body["choices"] = [{**STOP["choices"][0], **(choice_changes or {})}]
    return body


@pytest.mark.parametrize("body,message", [
    ({k: v for k, v in STOP.items() if k != "prompt_token_ids"}, "no prompt_token_ids: the endpoint must support return_token_ids"),
    (_with({"token_ids": None}), r"no choices\[0\].token_ids: the endpoint must support return_token_ids"),
    (_with({"token_ids": []}), r"no choices\[0\].token_ids"),
    (_with(prompt_token_ids=[1, "2"]), "non-negative integers"),
    # JSON true and false are Python ints: they were written into rows as "input_ids": [..., true, true]
    (_with(prompt_token_ids=[151644, True, 198, 17, 151645]), "prompt_token_ids must be a list of non-negative "
                                                              "integers, got true or false among them"),
    (_with({"token_ids": [9001, 13, False]}), r"choices\[0\].token_ids must be a list of non-negative integers, got "
                                             "true or false"),
    (_with(usage={"prompt_tokens": "5", "completion_tokens": 3}), "usage.prompt_tokens must be an integer, got str"),
    (_with(usage={"prompt_tokens": 5, "completion_tokens": True}), "usage.completion_tokens must be an integer, got bool"),
    (_with(usage={"prompt_tokens": 4, "completion_tokens": 3}), "usage.prompt_tokens=4 but it carries 5 ids"),
    (_with(usage={"prompt_tokens": 5, "completion_tokens": 9}), "usage.completion_tokens=9 but it carries 3 ids"),
    (_with({"message": {"role": "assistant", "content": " \n"}}), "empty generation"),
    (_with({"message": {"role": "assistant", "content": None, "tool_calls": []}}), "empty generation"),
    (_with({"message": {"role": "assistant", "content": "4", "reasoning": 7}}), "message.reasoning must be a string"),
    ({**STOP, "choices": []}, r"no choices\[0\]"),
    ([1, 2], "expected a JSON object"),
])
def test_unusable_replies(body, message):
    with pytest.raises(ReplyError, match=message):
        parse_reply(body)


@pytest.mark.parametrize("sent,kept", [("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"),
                                       ("abort", "abort"), (None, "unknown"), (3, "unknown"), ("STOP", "unknown"),
                                       ({"a": 1}, "unknown")])
def test_a_finish_reason_is_a_known_string_or_unknown(sent, kept):
    """Rows' metadata.finish_reason takes nothing on trust: a null, a number or another string is recorded as
    unknown, never copied."""
    assert parse_reply(_with({"finish_reason": sent})).finish_reason == kept


def test_the_model_a_reply_names_is_read_when_it_is_a_string():
    assert parse_reply(STOP).model == "Qwen/Qwen3-8B"
    assert parse_reply(_with(model=7)).model is None and parse_reply({k: v for k, v in STOP.items()
                                                                        if k != "model"}).model is None


def test_replies_naming_another_model_are_counted_and_announced_once(serve, regen, capfd):
    """vLLM echoes the served name; a reply naming another one (a proxy, another server behind the address) still
    makes rows, is counted in the summary, and is announced once, without the server's text."""
    def answer(payload):  # q0's reply names another model; the others the one the requests name
        named = "someone/else-7B" if payload["messages"][-1]["content"] == "q0" else payload["model"]
        return ok("fine", [1, 5], [7, 8], model=named)

    server = serve(answer)
    summary, out, errors = regen([server.url], [{"id": f"c{i}", "prompt": f"q{i}"} for i in range(3)])
    assert len(out) == 3 and errors == [] and summary["replies_naming_other_models"] == 1
    said = " ".join(capfd.readouterr().err.split())
    assert said.count("replies name another model than the requests'") == 1 and "someone/else-7B" not in said


def test_usage_is_optional():
    assert parse_reply({k: v for k, v in STOP.items() if k != "usage"}).usage == {}


def test_more_generated_ids_than_max_tokens_is_a_reply_error():
    """A server that sends 5 ids for max_tokens=2 (or 5,000,000 for 8192) is not believed."""
    assert parse_reply(STOP, max_tokens=3).generated_ids == [9001, 13, 151645]
    with pytest.raises(ReplyError, match="carries 3 generated ids, more than the request's max_tokens=2"):
        parse_reply(STOP, max_tokens=2)


def test_a_reply_over_max_tokens_fails_its_conversation(serve, regen):
    server = serve(lambda payload: ok("long", [1, 5], list(range(10, 10 + len(payload["messages"][-1]["content"])))))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "a" * 21}, {"id": "B", "prompt": "b" * 20}],
                                 "max_tokens=20")
    assert [row["id"] for row in out] == ["B_gen0"] and [e["id"] for e in errors] == ["A"]
    assert "21 generated ids, more than the request's max_tokens=20" in errors[0]["metadata"]["error"]
