"""Turning a finished generation into a vLLM-shaped ``chat.completion`` reply.

Fields follow vLLM: ``prompt_token_ids`` top-level and ``token_ids`` in the choice (stop token included) with
``return_token_ids``; ``reasoning`` from the ``qwen3`` parser; hermes ``<tool_call>`` blocks as ``tool_calls`` (a
block that does not parse leaves the whole text as content, as vLLM does).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from tools.tool_calls import ToolCall, split_tool_calls

if TYPE_CHECKING:  # torch's import is the engine's; the command's argument parser reads the constants below
    from launch.batch_engine import FinishedGeneration

REASONING_PARSERS = ("qwen3",)
TOOL_CALL_PARSERS = ("hermes",)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str | None]:
    """qwen3 parser: text up to ``</think>`` (minus a leading ``<think>``) is reasoning, the rest content; without
    ``</think>`` everything is content (the template may have closed the think block)."""
    if THINK_CLOSE not in text:
        return None, text
    before, _, content = text.partition(THINK_CLOSE)
    if THINK_OPEN in before:
        before = before.partition(THINK_OPEN)[2]
    return before, content or None


def extract_tool_calls(text: str | None) -> tuple[str | None, list[dict]]:
    """hermes parser: ``(content before the first call or None, OpenAI tool_calls)``; no calls if any is malformed."""
    if not text:
        return text, []
    content, calls = split_tool_calls(text)
    if not calls or not all(isinstance(call, ToolCall) for call in calls):
        return text, []
    return content or None, [
        {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
         "function": {"name": call.name, "arguments": call.arguments_json()}}
        for call in calls
    ]


def build_reply(*, model: str, prompt_ids: list[int], generation: FinishedGeneration, tokenizer,
                return_token_ids: bool, skip_special_tokens: bool = True,
                reasoning_parser: str | None = None, parse_tool_calls: bool = False) -> dict:
    """The ``/v1/chat/completions`` JSON for one finished generation."""
    text_ids = generation.token_ids
    if generation.finish_reason == "stop" and generation.stop_token_id is not None:
        text_ids = text_ids[:-1]  # the stop token's text is never part of the content
    text = tokenizer.decode(text_ids, skip_special_tokens=skip_special_tokens)
    reasoning, content = split_reasoning(text) if reasoning_parser else (None, text)
    tool_calls: list[dict] = []
    if parse_tool_calls:
        content, tool_calls = extract_tool_calls(content)
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": reasoning}
    if tool_calls:
        message["tool_calls"] = tool_calls
    finish_reason = "tool_calls" if tool_calls else generation.finish_reason
    stop_reason = None if generation.stopped_by_eos else generation.stop_token_id
    completion = len(generation.token_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": list(generation.token_ids) if return_token_ids else None,
        }],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + completion,
                  "completion_tokens": completion, "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt_ids) if return_token_ids else None,
        "kv_transfer_params": None,
    }
