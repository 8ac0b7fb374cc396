"""Reading vLLM replies (literal shapes from the reference), retry timing rules and the endpoint pool."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from email.utils import format_datetime

import pytest

from regen.chat_client import RetryPolicy, parse_retry_after
from regen.endpoint_pool import Affinity, EndpointPool, NoLiveEndpoint
from regen.replies import ReplyError, parse_reply

STOP = {"id": "chatcmpl-1a2b", "object": "chat.completion", "created": 1760000000, "model": "Qwen/Qwen3-8B", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Four.", "reasoning": None}, "logprobs": None, "finish_reason": "stop", "stop_reason": None, "token_ids": [9001, 13, 151645]}], "usage": {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3, "prompt_tokens_details": None}, "prompt_token_ids": [151644, 872, 198, 17, 151645]}  # noqa: E501
LENGTH = {"id": "chatcmpl-3c4d", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Tides begin", "reasoning": None}, "finish_reason": "length", "stop_reason": None, "token_ids": [785, 3840]}], "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}, "prompt_token_ids": [151644, 872]}  # noqa: E501
TOOL = {"id": "chatcmpl-5e6f", "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "chatcmpl-tool-9f8e7d", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}], "reasoning": None}, "finish_reason": "tool_calls", "stop_reason": None, "token_ids": [151657, 198, 4913, 606, 151658, 151645]}], "usage": {"prompt_tokens": 6, "total_tokens": 12, "completion_tokens": 6}, "prompt_token_ids": [151644, 8948, 198, 151645, 151644, 872]}  # noqa: E501
REASONING = {"id": "chatcmpl-7a8b", "choices": [{"index": 0, "message": {"role": "assistant", "content": "\n\n4", "reasoning": "Add two and two."}, "finish_reason": "stop", "stop_reason": None, "token_ids": [151667, 2212, 1378, 151668, 271, 19, 151645]}], "usage": {"prompt_tokens": 3, "total_tokens": 10, "completion_tokens": 7}, "prompt_token_ids": [151644, 872, 198]}  # noqa: E501


def test_literal_vllm_replies():
    stop = parse_reply(STOP)
    assert (stop.prompt_ids, stop.generated_ids, stop.finish_reason) == ([151644, 872, 198, 17, 151645], [9001, 13, 151645], "stop")
    assert stop.history_message(carry_reasoning=True) == {"role": "assistant", "content": "Four."}
    assert parse_reply(LENGTH).finish_reason == "length"
    tool = parse_reply(TOOL)
    assert tool.history_message(False) == {"role": "assistant", "content": "", "tool_calls": TOOL["choices"][0]["message"]["tool_calls"]}
    thought = parse_reply(REASONING)
    assert thought.history_message(False) == {"role": "assistant", "content": "\n\n4"}
    assert thought.history_message(True) == {"role": "assistant", "content": "\n\n4", "reasoning": "Add two and two."}


def test_older_reasoning_content_field_is_read_and_echoed():
    old = {**REASONING, "choices": [{**REASONING["choices"][0], "message": {
        "role": "assistant", "content": "4", "reasoning_content": "Sum."}}]}
    assert parse_reply(old).history_message(True) == {"role": "assistant", "content": "4", "reasoning_content": "Sum."}


def _with(choice_changes=None, **top):
    body = {**STOP, **top}
    body["choices"] = [{**STOP["choices"][0], **(choice_changes or {})}]
    return body


@pytest.mark.parametrize("body,message", [
    ({k: v for k, v in STOP.items() if k != "prompt_token_ids"}, "no prompt_token_ids: the endpoint must support return_token_ids"),
    (_with({"token_ids": None}), r"no choices\[0\].token_ids: the endpoint must support return_token_ids"),
    (_with({"token_ids": []}), r"no choices\[0\].token_ids"),
    (_with(prompt_token_ids=[1, "2"]), "non-negative integers"),
    (_with(usage={"prompt_tokens": 4, "completion_tokens": 3}), "usage.prompt_tokens=4 but it carries 5 ids"),
    (_with(usage={"prompt_tokens": 5, "completion_tokens": 9}), "usage.completion_tokens=9 but it carries 3 ids"),
    (_with({"message": {"role": "assistant", "content": " \n"}}), "empty generation"),
    (_with({"message": {"role": "assistant", "content": None, "tool_calls": []}}), "empty generation"),
    ({**STOP, "choices": []}, r"no choices\[0\]"),
    ([1, 2], "expected a JSON object"),
])
def test_unusable_replies(body, message):
    with pytest.raises(ReplyError, match=message):
        parse_reply(body)


def test_usage_is_optional():
    assert parse_reply({k: v for k, v in STOP.items() if k != "usage"}).usage == {}


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    assert parse_retry_after(format_datetime(datetime(2026, 1, 1, 12, 0, 7, tzinfo=timezone.utc), usegmt=True), now) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now) == 0.0  # in the past: retry now
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_backoff_doubles_with_jitter_and_follows_retry_after():
    policy = RetryPolicy(max_retries=6, backoff_s=1.0, max_backoff_s=10.0)
    rng = random.Random(0)
    for retry, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (6, 10.0)]:
        delays = [policy.delay(retry, None, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) == 50  # jittered
    assert policy.delay(1, 7.0, rng) == 7.0
    assert policy.delay(1, 99.0, rng) == 10.0  # capped by max_backoff_s


def test_pool_spreads_sticks_and_moves_off_a_dead_endpoint():
    pool = EndpointPool(["http://a", "http://b"], max_failures=2)
    conversations = [Affinity() for _ in range(4)]
    picked = [pool.pick(c).url for c in conversations]
    assert sorted(picked) == ["http://a", "http://a", "http://b", "http://b"]
    assert pool.pick(conversations[0]).url == picked[0]  # sticky
    a = pool.endpoints[0]
    pool.record_failure(a, "refused", unreachable=True)
    assert a.live
    pool.record_failure(a, "HTTP 503", unreachable=False)  # a server answering with 5xx is not dead
    pool.record_failure(a, "refused", unreachable=True)
    assert not a.live and a.taken_out == 1
    moved = [c for c, url in zip(conversations, picked, strict=True) if url == "http://a"]
    assert {pool.pick(c).url for c in moved} == {"http://b"}
    assert pool.counts()["http://b"]["conversations"] == 4 and pool.counts()["http://a"]["failures"] == 3
    pool.record_failure(pool.endpoints[1], "reset", unreachable=True)
    pool.record_failure(pool.endpoints[1], "reset", unreachable=True)
    with pytest.raises(NoLiveEndpoint, match="no endpoint left"):
        pool.pick(Affinity())
    pool.put_back(a)
    assert pool.pick(Affinity()).url == "http://a"
