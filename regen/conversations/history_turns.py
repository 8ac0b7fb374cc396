"""The assistant turn a generation becomes in the history: answer and reasoning, split as the template renders it.

The server's reasoning parser is not trusted (vLLM's ``qwen3`` returns every answer as ``reasoning`` behind a
template whose generation prompt closes the think block). The token ids decide: the generation starts inside a think
block when it begins with ``<think>`` or the generation prompt ends with an open one; then the reasoning runs to its
``</think>`` (all of it without one), else all its text is the answer. Without think tokens the parser's split stays.
The reasoning is carried only with ``carry_reasoning``, or when the turn would otherwise be empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from regen.conversations.detokenizer import THINK_CLOSE
from regen.conversations.replies import CheckedReply

PROMPT_TAIL = 8  # ids at the prompt's end searched for the generation prompt's think markers


@dataclass(frozen=True)
class AssistantTurn:
    """A generation as the template renders it: ``answer`` (content), ``reasoning``, and whether that differs
    from the server parser's split (``corrected``)."""

    answer: str
    reasoning: str | None
    corrected: bool


def starts_in_thinking(generation: CheckedReply, think_ids: tuple[int, int]) -> bool:
    """The generation starts inside a think block: it begins with ``<think>``, or the last think marker in the
    prompt's last ``PROMPT_TAIL`` ids (the generation prompt) is ``<think>``."""
    open_id, close_id = think_ids
    if generation.generated_ids[0] == open_id:
        return True
    for token in reversed(generation.prompt_ids[-PROMPT_TAIL:]):
        if token in think_ids:
            return token == open_id
    return False


def assistant_turn(generation: CheckedReply, think_ids: tuple[int, int] | None) -> AssistantTurn:
    """Split ``generation`` into answer and reasoning by where it started (module doc); ``think_ids`` None keeps
    the parser's split."""
    parsed_reasoning, parsed_content = generation.reasoning, generation.content or ""
    if think_ids is None:
        return AssistantTurn(parsed_content, parsed_reasoning, corrected=False)
    if not starts_in_thinking(generation, think_ids):
        answer = (parsed_reasoning or "") + parsed_content
        return AssistantTurn(answer, None, corrected=bool(parsed_reasoning))
    if parsed_reasoning is not None:  # the parser started inside the block too
        return AssistantTurn(parsed_content, parsed_reasoning, corrected=False)
    reasoning, closed, answer = parsed_content.partition(THINK_CLOSE)  # a parser that assumed no thinking
    if not closed:
        reasoning, answer = parsed_content, ""
    return AssistantTurn(answer, reasoning or None, corrected=bool(reasoning))


def history_message(generation: CheckedReply, turn: AssistantTurn, carry_reasoning: bool) -> dict[str, Any]:
    """The assistant message appended to the conversation before the next request."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.answer}
    if generation.tool_calls:
        message["tool_calls"] = generation.tool_calls
    nothing_else = not turn.answer.strip() and not generation.tool_calls
    if turn.reasoning and (carry_reasoning or nothing_else):
        message[generation.reasoning_field] = turn.reasoning
    return message
