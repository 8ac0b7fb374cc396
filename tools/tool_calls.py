"""Parsing hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks out of model text.

Used by the embedded server (to answer with OpenAI ``tool_calls`` like vLLM's hermes parser), by the
OPD rollout (to execute the student's calls) and by regen's dataset normalization (hermes-fc rows,
whose calls are Python dict reprs: ``allow_python_literals=True`` parses those with ``ast.literal_eval``,
never ``eval``).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool name and a JSON-object of arguments."""

    name: str
    arguments: dict = field(default_factory=dict)

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class MalformedToolCall:
    """A ``<tool_call>`` block that could not be read as a call; ``error`` says why."""

    raw: str
    error: str


def _decode(payload: str, allow_python_literals: bool):
    try:
        return json.loads(payload)
    except json.JSONDecodeError as json_error:
        if not allow_python_literals:
            raise ValueError(f"invalid JSON: {json_error.msg} at char {json_error.pos}") from None
        try:
            return ast.literal_eval(payload)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"neither JSON nor a Python literal: {json_error.msg}") from None


def parse_call_payload(payload: str, *, allow_python_literals: bool = False) -> ToolCall | MalformedToolCall:
    """Read the text inside one ``<tool_call>`` block."""
    raw = payload.strip()
    try:
        value = _decode(raw, allow_python_literals)
    except ValueError as error:
        return MalformedToolCall(raw, str(error))
    if not isinstance(value, dict):
        return MalformedToolCall(raw, f"call must be a JSON object, got {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return MalformedToolCall(raw, "call has no string 'name'")
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments object as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return MalformedToolCall(raw, "'arguments' is a string that is not a JSON object")
    if not isinstance(arguments, dict):
        return MalformedToolCall(raw, f"'arguments' must be an object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


def split_tool_calls(text: str, *, allow_python_literals: bool = False) -> tuple[str, list[ToolCall | MalformedToolCall]]:
    """Split model text into the content before the first ``<tool_call>`` and the parsed calls, in order.

    An unterminated last block (generation cut off) is returned as a ``MalformedToolCall``.
    """
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    calls: list[ToolCall | MalformedToolCall] = []
    for match in _BLOCK.finditer(text, start):
        payload, closing = match.group(1), match.group(2)
        if not closing:
            calls.append(MalformedToolCall(payload.strip(), "unterminated <tool_call> block"))
        else:
            calls.append(parse_call_payload(payload, allow_python_literals=allow_python_literals))
    return text[:start], calls
