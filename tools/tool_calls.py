"""Parsing hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks out of model text.

Used by the OPD rollout (to run the student's calls) and by the embedded server (to answer with OpenAI
``tool_calls``, like vLLM's hermes parser), for calls of any tool name.

A block is read as MiniMind's agent code reads it (jingyaogong/minimind ``trainer/train_agent.py``
``parse_tool_calls`` at d65ef2c, and ``trainer/agent_opd_utils.py`` in the public code index at 1855c78):
the text between ``<tool_call>`` and the next ``</tool_call>``, stripped, is parsed with Python's
``json.loads`` (so ``NaN``/``Infinity`` literals parse, and a repeated key keeps its last value); an
``arguments`` given as a string is parsed with ``json.loads`` again; a missing ``arguments`` is ``{}``.
A call is well-formed when that gives a JSON object with a non-empty string ``name`` and an object of
arguments. Everything else is a ``MalformedToolCall``: text that is not JSON, JSON that is not an object,
no string name, arguments that are not (or do not decode to) an object, an unterminated last block
(generation cut off), and JSON nested deeper than ``MAX_JSON_DEPTH`` (refused before parsing, so no
``RecursionError``). ``MalformedToolCall.is_object`` tells the two kinds MiniMind treats differently: a
closed block holding a JSON object is a call to MiniMind (answered with its error observation), anything
else is not a call at all (no observation; a turn with no calls ends the episode).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_JSON_DEPTH = 100
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)
# a JSON string (skipped whole, so brackets inside it do not count) or one bracket
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool name and a JSON object of arguments."""

    name: str
    arguments: dict = field(default_factory=dict)

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class MalformedToolCall:
    """A ``<tool_call>`` block that could not be read as a call; ``error`` says why."""

    raw: str
    error: str
    is_object: bool = False  # a closed block holding a JSON object whose name or arguments are unusable


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON ``text`` nest (brackets inside strings do not count)."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


def load_json(text: str):
    """``json.loads(text)`` for JSON nested at most ``MAX_JSON_DEPTH`` deep; any failure is a ``ValueError``."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error.msg} at char {error.pos}") from None
    except ValueError as error:  # e.g. an int literal of more than 4,300 digits
        raise ValueError(f"invalid JSON: {error}") from None


def parse_call_payload(payload: str) -> ToolCall | MalformedToolCall:
    """Read the text inside one ``<tool_call>`` block."""
    raw = payload.strip()
    try:
        value = load_json(raw)
    except ValueError as error:
        return MalformedToolCall(raw, str(error))
    if not isinstance(value, dict):
        return MalformedToolCall(raw, f"call must be a JSON object, got {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return MalformedToolCall(raw, "call has no string 'name'", is_object=True)
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = load_json(arguments)
        except ValueError as error:
            return MalformedToolCall(raw, f"'arguments' is a string that is not JSON: {error}", is_object=True)
    if not isinstance(arguments, dict):
        return MalformedToolCall(raw, f"'arguments' must be an object, got {type(arguments).__name__}",
                                 is_object=True)
    return ToolCall(name, arguments)


def split_tool_calls(text: str) -> tuple[str, list[ToolCall | MalformedToolCall]]:
    """Split model text into the content before the first ``<tool_call>`` and the parsed calls, in order."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    calls: list[ToolCall | MalformedToolCall] = []
    for match in _BLOCK.finditer(text, start):
        payload, closing = match.group(1), match.group(2)
        if not closing:
            calls.append(MalformedToolCall(payload.strip(), "unterminated <tool_call> block"))
        else:
            calls.append(parse_call_payload(payload))
    return text[:start], calls
