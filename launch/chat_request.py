"""Validating an OpenAI/vLLM ``/v1/chat/completions`` body for the embedded server.

OpenAI fields plus vLLM's extensions are accepted; what the server cannot honour (streaming, n > 1, logprobs, stop
strings, forced tool choice, non-text content) is a ``RequestError`` (400), never silently ignored; unknown fields
are ignored, as vLLM does. Non-finite numbers and nesting deeper than ``MAX_DEPTH`` are a 400 too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launch.batch_engine import SamplingParams

ROLES = ("system", "user", "assistant", "tool")
MAX_DEPTH = 64  # objects/arrays inside each other; real chat requests (tool schemas included) stay far below
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
_RESERVED_TEMPLATE_ARGS = {"conversation", "messages", "tools", "tokenize", "add_generation_prompt",
                           "continue_final_message", "return_dict", "chat_template", "documents", "return_tensors",
                           "return_assistant_tokens_mask", "tokenizer_kwargs", "padding", "truncation", "max_length"}


class RequestError(Exception):
    """A request the server refuses; ``status`` is the HTTP code, ``param`` the offending field."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat completion request (sampling still lacks the prompt-dependent ``max_tokens``)."""

    model: str | None
    messages: list[dict]
    tools: list[dict] | None
    tool_choice: str
    max_tokens: int | None
    sampling: dict = field(default_factory=dict)  # SamplingParams fields other than max_tokens
    return_token_ids: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    skip_special_tokens: bool = True
    chat_template_kwargs: dict = field(default_factory=dict)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, **self.sampling)


class _NonFinite:
    """Stands in for a JSON number that is not a finite float until the body is checked."""

    def __init__(self, text: str):
        self.text = text


def _finite_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def decode_body(raw: bytes, check: Callable[[Any], None] | None = None) -> Any:
    """The JSON value of a request body; raises ``RequestError`` for bad JSON, non-finite numbers, deep nesting.
    ``check`` sees the parsed value first, before any per-value work (the server's bound on what it renders)."""
    try:
        body = json.loads(raw, parse_constant=_NonFinite, parse_float=_finite_float)
    except RecursionError:
        raise RequestError(f"the request body is nested more than {MAX_DEPTH} levels deep") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"the request body is not valid JSON: {error}") from None
    if check is not None:
        check(body)
    stack: list[tuple[str, Any, int]] = [("", body, 0)]
    while stack:
        where, value, depth = stack.pop()
        if isinstance(value, _NonFinite):
            field_name = where.lstrip(".").split(".")[0].split("[")[0] or None
            raise RequestError(f"'{where.lstrip('.') or 'body'}' is {value.text}: JSON numbers must be finite",
                               param=field_name)
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise RequestError(f"the request body is nested more than {MAX_DEPTH} levels deep "
                                   f"(at '{where.lstrip('.')}')")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                stack.append((f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]", item, depth + 1))
    return body


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(body: dict, name: str, low: float, high: float, *, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise RequestError(f"'{name}' must be a number, got {type(value).__name__}", param=name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise RequestError(f"'{name}' must be in {bracket}{low}, {high}], got {value}", param=name)
    return float(value)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}", param=name)
    return value


def _text_content(content, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(f"{where}.content[{k}]: only text parts ({{'type': 'text', 'text': ...}}) "
                                   "are supported by the embedded server", param="messages")
            parts.append(part["text"])
        return "\n".join(parts)
    raise RequestError(f"{where}.content must be a string, a list of text parts or null", param="messages")


def _tool_call(call, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}",
                           param="messages")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # templates render an object; vLLM decodes the JSON string the same way
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise RequestError(f"{where}.function.arguments is not valid JSON: {error.msg}", param="messages") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object", param="messages")
    return {**call, "function": {**function, "arguments": arguments}}


def _message(message, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content'", param="messages")
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role must be one of {list(ROLES)}, got {role!r}", param="messages")
    out = {**message, "content": _text_content(message.get("content"), where)}
    if out["content"] is None and role != "assistant":
        raise RequestError(f"{where}.content is missing (only assistant turns may omit it)", param="messages")
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list on an assistant message", param="messages")
        out["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)]
    reasoning = message.get("reasoning")
    if isinstance(reasoning, str) and not isinstance(message.get("reasoning_content"), str):
        out["reasoning_content"] = reasoning  # chat templates read the older field name
    return out


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list", param="tools")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str) and function["name"]):
            raise RequestError(f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                               param="tools")
    return tools or None


def _refuse_unsupported(body: dict) -> None:
    if body.get("stream"):
        raise RequestError("streaming is not supported by the embedded server; send 'stream': false", param="stream")
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError("the embedded server returns one choice per request: 'n' must be 1", param="n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("logprobs are not supported by the embedded server", param="logprobs")
    if body.get("stop") not in (None, "", []):
        raise RequestError("stop strings are not supported by the embedded server; use 'stop_token_ids'",
                           param="stop")


def _max_tokens(body: dict) -> int | None:
    name = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise RequestError(f"'{name}' must be an integer >= 1, got {value!r}", param=name)
    return value


def _sampling(body: dict, defaults: dict) -> dict:
    values = {**SAMPLING_DEFAULTS, **defaults}
    ranges = {"temperature": (0.0, float("inf"), False), "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False),
              "repetition_penalty": (0.0, float("inf"), True), "presence_penalty": (-2.0, 2.0, False),
              "frequency_penalty": (-2.0, 2.0, False)}
    for name, (low, high, low_open) in ranges.items():
        value = _number(body, name, low, high, low_open=low_open)
        if value is not None:
            values[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or top_k < -1:
            raise RequestError(f"'top_k' must be an integer >= -1 (0 or -1: off), got {top_k!r}", param="top_k")
        values["top_k"] = max(top_k, 0)
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and -(2**63) <= seed < 2**64):
        raise RequestError(f"'seed' must be an integer in [-2**63, 2**64), got {seed!r}", param="seed")
    stop_ids = body.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(_is_int(t) and t >= 0 for t in stop_ids)):
        raise RequestError("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    values.update(seed=seed, ignore_eos=_flag(body, "ignore_eos", False), stop_token_ids=tuple(stop_ids))
    return values


def parse_chat_request(body, *, sampling_defaults: dict | None = None, tool_parser: str | None = None) -> ChatRequest:
    """Validate a decoded JSON body; raises ``RequestError`` naming the offending field."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {'role', 'content'} objects", param="messages")
    tools = _tools(body)
    tool_choice = body.get("tool_choice") or ("auto" if tools else "none")
    if tool_choice not in ("auto", "none"):
        raise RequestError("the embedded server supports tool_choice 'auto' and 'none' only", param="tool_choice")
    if body.get("tool_choice") not in (None, "none") and not tools:
        raise RequestError("when using 'tool_choice', 'tools' must be set", param="tool_choice")
    if tool_choice == "auto" and body.get("tool_choice") and tool_parser is None:
        raise RequestError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                           param="tool_choice")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    if reserved := sorted(_RESERVED_TEMPLATE_ARGS & template_kwargs.keys()):
        raise RequestError(f"'chat_template_kwargs' may not set {reserved}", param="chat_template_kwargs")
    request = ChatRequest(
        model=model,
        messages=[_message(message, i) for i, message in enumerate(messages)],
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=_max_tokens(body),
        sampling=_sampling(body, sampling_defaults or {}),
        return_token_ids=_flag(body, "return_token_ids", False),
        add_generation_prompt=_flag(body, "add_generation_prompt", True),
        continue_final_message=_flag(body, "continue_final_message", False),
        skip_special_tokens=_flag(body, "skip_special_tokens", True),
        chat_template_kwargs=template_kwargs,
    )
    if request.add_generation_prompt and request.continue_final_message:
        raise RequestError("'add_generation_prompt' and 'continue_final_message' cannot both be true",
                           param="continue_final_message")
    return request
