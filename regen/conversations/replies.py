"""Reading one vLLM chat-completion reply (``return_token_ids: true``) into a checked :class:`CheckedReply`."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from common.logprobs import distribution_problem

REASONING_FIELDS = ("reasoning", "reasoning_content")  # vLLM's name now, then older servers'
# finish reasons vLLM and the OpenAI API send; any other value (null, a number, another string) is recorded as UNKNOWN
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call", "abort")
UNKNOWN = "unknown"
TOKEN_IDS_HINT = "the endpoint must support return_token_ids (vLLM's chat API with \"return_token_ids\": true)"


class ReplyError(ValueError):
    """A 200 reply that cannot become a training row; the message says what is missing or inconsistent."""


@dataclass(frozen=True)
class CheckedReply:
    """The parts of a reply regen uses: exact token ids, the assistant message and its bookkeeping."""

    prompt_ids: list[int]
    generated_ids: list[int]
    content: str | None  # as the server's parsers split the reply (``regen.conversations.history_turns`` checks it)
    reasoning: str | None
    reasoning_field: str  # the name this server gives reasoning: ``reasoning``, older vLLM ``reasoning_content``
    tool_calls: list[dict]
    finish_reason: str  # one of FINISH_REASONS, else UNKNOWN
    usage: dict
    model: str | None  # the model the reply names (vLLM echoes the served name); None when it names none
    # per generated id, when asked: {"ids": [[top-k ids]], "logprobs": [[theirs]], "token_logprobs": [the id's]}
    top_logprobs: dict | None = None


def _token_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ReplyError(f"reply has no {name}: {TOKEN_IDS_HINT}")
    try:
        array("Q", value)  # one C pass: every element an integer in 0..2**64-1 (or a bool: Python's bool is an int)
    except (TypeError, OverflowError):
        raise ReplyError(f"reply {name} must be a list of non-negative integers") from None
    if set(map(type, value)) != {int}:
        raise ReplyError(f"reply {name} must be a list of non-negative integers, got true or false among them")
    return value


def _token_id(entry: Any, where: str) -> tuple[int, float]:
    """``{"token": "token_id:N", "logprob": x}`` (vLLM's ``return_tokens_as_token_ids``) as (N, x)."""
    token = entry.get("token") if isinstance(entry, dict) else None
    logprob = entry.get("logprob") if isinstance(entry, dict) else None
    if not (isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit()):
        raise ReplyError(f"reply {where}.token is {token!r}, not \"token_id:N\" (return_tokens_as_token_ids)")
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)) or not logprob <= 1e-4:
        raise ReplyError(f"reply {where}.logprob is {logprob!r}, not a log-probability")
    return int(token[9:]), float(logprob)


def _top_logprobs(choice: dict, generated_ids: list[int], k: int) -> dict:
    """The reply's ``logprobs.content``: per generated id its top-k ids and log-probabilities, checked against the
    ids."""
    content = choice.get("logprobs", {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(content, list) or len(content) != len(generated_ids):
        raise ReplyError(f"reply choices[0].logprobs.content must hold one entry per generated id "
                         f"({len(generated_ids)}), got {len(content) if isinstance(content, list) else 'none'}")
    ids, logprobs, token_logprobs = [], [], []
    for position, (entry, expected) in enumerate(zip(content, generated_ids, strict=True)):
        token, logprob = _token_id(entry, f"logprobs.content[{position}]")
        if token != expected:
            raise ReplyError(f"reply logprobs.content[{position}] is id {token}, but token_ids has {expected}")
        top = entry.get("top_logprobs")
        if not isinstance(top, list) or not 0 < len(top) <= k:
            raise ReplyError(f"reply logprobs.content[{position}].top_logprobs must list 1 to {k} entries")
        pairs = [_token_id(item, f"logprobs.content[{position}].top_logprobs") for item in top]
        extra = [] if token in {pair[0] for pair in pairs} else [(token, logprob)]  # the sampled id, outside the top
        problem = distribution_problem(*zip(*[*pairs, *extra], strict=True), token, logprob)
        if problem:
            raise ReplyError(f"reply logprobs.content[{position}].top_logprobs: {problem}")
        ids.append([pair[0] for pair in pairs])
        logprobs.append([pair[1] for pair in pairs])
        token_logprobs.append(logprob)
    return {"ids": ids, "logprobs": logprobs, "token_logprobs": token_logprobs}


def parse_reply(data: Any, max_tokens: int | None = None, top_logprobs: int | None = None) -> CheckedReply:
    """Check one reply (to a request with ``max_tokens``) and return its :class:`CheckedReply`; raises
    :class:`ReplyError`: more generated ids than ``max_tokens``, or ``usage`` that disagrees with the ids, is an
    error too."""
    if not isinstance(data, dict):
        raise ReplyError(f"reply is {type(data).__name__}, expected a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ReplyError("reply has no choices[0]")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ReplyError("reply choices[0] has no message object")
    prompt_ids = _token_list(data.get("prompt_token_ids"), "prompt_token_ids")
    generated_ids = _token_list(choice.get("token_ids"), "choices[0].token_ids")
    if max_tokens is not None and len(generated_ids) > max_tokens:
        raise ReplyError(f"reply carries {len(generated_ids)} generated ids, more than the request's "
                         f"max_tokens={max_tokens}")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise ReplyError("reply usage must be an object")
    for key, ids in (("prompt_tokens", prompt_ids), ("completion_tokens", generated_ids)):
        if key in usage and type(usage[key]) is not int:
            raise ReplyError(f"reply usage.{key} must be an integer, got {type(usage[key]).__name__}")
        if key in usage and usage[key] != len(ids):
            raise ReplyError(f"reply usage.{key}={usage[key]} but it carries {len(ids)} ids")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ReplyError(f"reply message.content must be a string or null, got {type(content).__name__}")
    reasoning_field = next((f for f in REASONING_FIELDS if message.get(f)), None) or next(
        (f for f in REASONING_FIELDS if f in message), REASONING_FIELDS[0])
    reasoning = message.get(reasoning_field)
    if reasoning is not None and not isinstance(reasoning, str):
        raise ReplyError(f"reply message.{reasoning_field} must be a string or null, got {type(reasoning).__name__}")
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list) or not all(isinstance(call, dict) for call in tool_calls):
        raise ReplyError("reply message.tool_calls must be a list of objects")
    if not (content and content.strip()) and not tool_calls and not reasoning:
        raise ReplyError("empty generation: the reply has no content, no tool call and no reasoning")
    finish_reason = choice.get("finish_reason")
    model = data.get("model")
    return CheckedReply(prompt_ids, generated_ids, content, reasoning, reasoning_field, tool_calls,
                        finish_reason if finish_reason in FINISH_REASONS else UNKNOWN, usage,
                        model if isinstance(model, str) else None,
                        _top_logprobs(choice, generated_ids, top_logprobs) if top_logprobs else None)
