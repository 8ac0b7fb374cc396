"""The assistant turn a generation becomes in the conversation's history: reasoning and answer, split as the
chat template renders that turn.

A server's reasoning parser splits a reply into ``reasoning`` and ``content`` by its own assumption of where
the generation starts. vLLM's ``qwen3`` parser, for one, starts inside a think block unless the request sets
``chat_template_kwargs.enable_thinking: false``; behind a template whose generation prompt closes the block
(MiniMind-3's ``<think>\\n\\n</think>\\n\\n``) it returns every answer as ``reasoning`` with ``content: null``.
regen does not take that split on trust. The prompt's and the generation's own token ids say where the
generation started (with a tokenizer that has ``<think>`` and ``</think>`` tokens; without them the parser's
split is kept as it is):

- inside a think block when the generation prompt ends with an open ``<think>`` or the generation begins
  with one: the reasoning runs up to the generation's ``</think>``, the answer is what follows (no
  ``</think>``: all of it is reasoning, e.g. cut by ``max_tokens``);
- otherwise the generation has no reasoning: all of its text (the parser's ``reasoning`` and ``content``,
  in that order) is the answer.

The history message carries the answer as ``content`` (and the tool calls), and the reasoning under the
server's field name when ``carry_reasoning`` -- or when there is nothing else, so that a non-empty generation
never becomes an empty turn.
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
    """Split ``generation`` into answer and reasoning by where it started (module doc); the parser's split as it
    is when the tokenizer has no ``<think>``/``</think>`` tokens (``think_ids`` None)."""
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
