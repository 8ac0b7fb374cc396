"""Row formats of the dataset presets (``dataset.format``): which columns hold the conversation.

``auto`` (local files) reads ``messages``, else ``conversations``, else ``prompt`` (a non-empty string or
a message list) and refuses to guess other columns. The preset formats read their dataset's own
columns (see ``configs/dataset/``). Every format also reads a ``tools`` column when the row has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.chat_records import MESSAGE_COLUMNS
from regen.rows.conversation import Conversation, RowError, ToolResult, read_messages, read_tools

Turns = tuple[list[dict[str, str]], list[ToolResult]]

CONVERSATION_COLUMNS = (*MESSAGE_COLUMNS, "prompt")
# Columns other tools read prompts from; regen names them in the error instead of guessing.
UNREAD_PROMPT_COLUMNS = ("instruction", "question", "text", "input", "query")


def _auto(row: dict[str, Any]) -> Turns:
    for column in CONVERSATION_COLUMNS:
        if column not in row:
            continue
        value = row[column]
        if column == "prompt" and isinstance(value, str):
            if not value.strip():
                raise RowError("'prompt' is an empty string")
            return [{"role": "user", "content": value}], []
        return read_messages(value, column)
    found = [column for column in UNREAD_PROMPT_COLUMNS if column in row]
    hint = f"; found {', '.join(repr(c) for c in found)}, which regen does not read (rename it)" if found else ""
    raise RowError(
        "expected a 'prompt' (string or message list), 'messages' or 'conversations' column" + hint
    )


def _column(name: str) -> Callable[[dict[str, Any]], Turns]:
    def read(row: dict[str, Any]) -> Turns:
        if name not in row:
            raise RowError(f"row has no '{name}' column")
        return read_messages(row[name], name)

    return read


def _gsm8k(row: dict[str, Any]) -> Turns:
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise RowError("'question' must be a non-empty string")
    return [{"role": "user", "content": question}], []  # the reference 'answer' is discarded


def _nemotron(row: dict[str, Any]) -> Turns:
    # 'input' holds the user (and earlier) turns; 'output' is the reply being regenerated, and
    # 'system_prompt' (the Nemotron "detailed thinking" switch) is dropped, as speculators does.
    return read_messages(row.get("input"), "input")


# The reader of each of regen.settings.FORMAT_NAMES (the names dataset.format is checked against at start).
FORMATS: dict[str, Callable[[dict[str, Any]], Turns]] = {
    "auto": _auto,
    "messages": _column("messages"),
    "sharegpt": _column("conversations"),
    "hermes_fc": _column("conversations"),
    "gsm8k": _gsm8k,
    "nemotron": _nemotron,
}


def to_conversation(row: Any, format_name: str, idx: int, primary_id: str) -> Conversation:
    """Normalize one dataset row; raises :class:`RowError` saying what is wrong with it."""
    if not isinstance(row, dict):
        raise RowError(f"row is {type(row).__name__}, expected a JSON object")
    turns, results = FORMATS[format_name](row)
    return Conversation(primary_id, idx, turns, read_tools(row), results)
