"""Agent prompt records: JSONL rows of a conversation plus the tools it may call.

Messages in ``conversations`` or ``messages``; tools from the system message's or the row's ``tools``; a trailing
assistant answer is dropped. A bad row raises ``RecordError`` naming file, line and field. :func:`json_lines` is the
guarded JSONL reader (also regen's): overlong lines (never held whole), deep nesting and lone surrogates are refused.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from common.user_errors import UserError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_COLUMNS = ("messages", "conversations")  # regen reads rows the same way
_MESSAGE_KEYS = ("role", "content", "tool_calls", "reasoning_content", "name", "tool_call_id", "weight")
# 8 MiB: a record that long is far past any context MiniMind has (32k positions); an agent prompt is kilobytes
MAX_LINE_BYTES = 8 << 20
MAX_NESTING = 100  # levels of arrays/objects; tool schemas use about ten
TOO_DEEP = f"nested deeper than {MAX_NESTING} levels of arrays and objects"
_SURROGATE = re.compile("[\ud800-\udfff]")


class RecordError(UserError):
    """A data row that cannot be used as an agent prompt."""


@dataclass(frozen=True)
class AgentRecord:
    """One prompt: messages for the chat template, declared tools, optional ground truth, and where it came from."""

    messages: list[dict]
    tools: list[dict] | None
    source: str
    gt: list[str] = field(default_factory=list)
    expected_calls: list[dict] | None = None  # [{"name": str, "arguments": dict}] in order; None: not known

    @property
    def declared_tools(self) -> frozenset[str]:
        """Names of the tools this record may call."""
        return frozenset(_tool_name(tool) for tool in self.tools or [])


def message_column(row: dict) -> str | None:
    """The column a chat row keeps its messages in (``MESSAGE_COLUMNS``, in order of preference), if any."""
    return next((column for column in MESSAGE_COLUMNS if column in row), None)


def structure_problem(value) -> str | None:
    """What makes a decoded JSON value unusable, if anything: nesting deeper than ``MAX_NESTING`` levels, or a
    string (or key) holding a lone surrogate; walked without recursion."""
    stack = [(value, 1, "")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_NESTING:
                return TOO_DEEP
            entries = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in entries:
                if isinstance(key, str):
                    stack.append((key, depth, where))
                stack.append((child, depth + 1, f"{where}.{key}" if isinstance(item, dict) else f"{where}[{key}]"))
        elif isinstance(item, str) and (found := _SURROGATE.search(item)):
            return (f"{where.lstrip('.') or 'the value'}: holds a lone surrogate ({found.group()!a} at char "
                    f"{found.start()}), which is not text")
    return None


def decode_json(text: bytes | str):
    """``json.loads``, refusing what ``structure_problem`` finds (or a ``RecursionError``) with a ``ValueError``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    problem = structure_problem(value)
    if problem:
        raise ValueError(problem)
    return value


@dataclass(frozen=True)
class JsonLine:
    """One non-blank JSONL line: its 1-based ``number`` and decoded ``value``, or the ``problem`` refusing it."""

    number: int
    value: object = None
    problem: str | None = None


def _whole_lines(stream: BinaryIO, limit: int) -> Iterator[tuple[bytes, bool]]:
    """``(line, too_long)`` for each line of ``stream``; a line over ``limit`` bytes comes as its first ``limit``
    bytes with ``too_long`` set, its rest read and dropped a MiB at a time (never held whole)."""
    while line := stream.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            while (rest := stream.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield line[:limit], True
        else:
            yield line, len(line.rstrip(b"\r\n")) > limit


def json_lines(stream: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[JsonLine]:
    """Every non-blank line of a JSONL byte stream as a :class:`JsonLine` (a first-line UTF-8 BOM dropped), decoded
    with :func:`decode_json` or with the problem that refuses it."""
    for number, (line, too_long) in enumerate(_whole_lines(stream, max_line_bytes), start=1):
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        if too_long:
            yield JsonLine(number, problem=f"the line is over {max_line_bytes / (1 << 20):g} MiB (MAX_LINE_BYTES), far "
                                           "past any context a record must fit")
        elif line.strip():
            try:
                yield JsonLine(number, decode_json(line.decode("utf-8")))
            except UnicodeDecodeError as error:
                yield JsonLine(number, problem=f"not UTF-8 ({error.reason} at byte {error.start})")
            except json.JSONDecodeError as error:
                yield JsonLine(number, problem=f"invalid JSON: {error.msg} (column {error.colno})")
            except ValueError as error:  # decode_json's refusals
                yield JsonLine(number, problem=str(error))


def parse_tools_field(value) -> list[dict]:
    """A row's tools: a list of OpenAI tool schemas, or a JSON string of one; ``ValueError`` says what is wrong."""
    if isinstance(value, str):
        try:
            value = decode_json(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"a string that is not JSON ({error.msg} at char {error.pos})") from None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise ValueError(f"expected a list of tool schemas (or a JSON string of one), got {type(value).__name__}")
    return value


def _tool_name(tool: dict) -> str:
    function = tool.get("function", tool)
    return function.get("name") if isinstance(function, dict) else None


def _parse_tools(value, where: str) -> list[dict]:
    try:
        value = parse_tools_field(value)
    except ValueError as error:
        raise RecordError(f"{where}: {error}") from None
    for index, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(_tool_name(tool), str) or not _tool_name(tool):
            raise RecordError(f"{where}[{index}]: a tool needs a string 'name' (or 'function.name')")
    return value


def parse_message(message, where: str) -> dict:
    """Validate one chat message (role, string content or assistant tool calls); keeps the keys templates use."""
    if not isinstance(message, dict):
        raise RecordError(f"{where}: expected an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise RecordError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
    content = message.get("content")
    if not isinstance(content, str) and not (role == "assistant" and content is None and message.get("tool_calls")):
        raise RecordError(f"{where}.content: expected a string, got {type(content).__name__}")
    if "weight" in message and (role != "assistant" or type(message["weight"]) is not int or message["weight"] not in (0, 1)):
        raise RecordError(f"{where}.weight: only an assistant message has a weight, 0 (context, not learned) or 1, "
                          f"got {message['weight']!r} on {'an' if role == 'assistant' else 'a'} {role} message")
    return {key: message[key] for key in _MESSAGE_KEYS if key in message}


def parse_record(row, source: str) -> AgentRecord:
    """Validate one decoded JSON row; ``source`` ("file:line") prefixes every error."""
    if not isinstance(row, dict):
        raise RecordError(f"{source}: expected a JSON object, got {type(row).__name__}")
    key = message_column(row) or MESSAGE_COLUMNS[0]
    raw_messages = row.get(key)
    if not isinstance(raw_messages, list) or not raw_messages:
        raise RecordError(f"{source}: needs a non-empty 'messages' or 'conversations' list")
    messages = [parse_message(m, f"{source}: {key}[{i}]") for i, m in enumerate(raw_messages)]
    tools = _parse_tools(row["tools"], f"{source}: tools") if row.get("tools") else None
    for index, message in enumerate(raw_messages):
        if message["role"] == "system" and message.get("tools"):
            tools = _parse_tools(message["tools"], f"{source}: {key}[{index}].tools")
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise RecordError(f"{source}: {key} must end with a user or tool turn (a final assistant answer is dropped)")
    gt = row.get("gt", [])
    gt = [gt] if isinstance(gt, str) else gt
    if not isinstance(gt, list) or not all(isinstance(item, str | int | float) for item in gt):
        raise RecordError(f"{source}: gt must be a string or a list of strings")
    return AgentRecord(messages=messages, tools=tools, source=source, gt=[str(item) for item in gt],
                       expected_calls=_parse_expected_calls(row.get("expected_calls"), source))


def _parse_expected_calls(value, source: str) -> list[dict] | None:
    """A row's ``expected_calls``: null, or a list of ``{"name": non-empty string, "arguments": object}`` (arguments
    default to ``{}``)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RecordError(f"{source}: expected_calls must be a list of calls, got {type(value).__name__}")
    calls = []
    for index, call in enumerate(value):
        where = f"{source}: expected_calls[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise RecordError(f"{where}: a call needs a non-empty string 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise RecordError(f"{where}.arguments: expected an object, got {type(arguments).__name__}")
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


def read_rows(path: str | Path) -> tuple[list[tuple[object, str]], str]:
    """Every decoded JSON line of a JSONL file with its ``file:line`` source, plus the file's sha256; a refused line
    raises ``RecordError``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"agent data file not found: {path}")
    rows, digest = [], hashlib.sha256()
    with path.open("rb") as stream:
        for line in json_lines(_Digesting(stream, digest)):
            if line.problem:
                raise RecordError(f"{path}:{line.number}: {line.problem}")
            rows.append((line.value, f"{path}:{line.number}"))
    if not rows:
        raise RecordError(f"{path}: no records")
    return rows, digest.hexdigest()


class _Digesting:
    """A binary stream whose ``readline`` also feeds what it reads to ``digest``."""

    def __init__(self, stream: BinaryIO, digest) -> None:
        self.stream, self.digest = stream, digest

    def readline(self, size: int = -1) -> bytes:
        line = self.stream.readline(size)
        self.digest.update(line)
        return line


def load_agent_records(path: str | Path) -> tuple[list[AgentRecord], str]:
    """All records of a JSONL file, plus the file's sha256 (its identity for resume checks)."""
    rows, sha256 = read_rows(path)
    return [parse_record(row, source) for row, source in rows], sha256
