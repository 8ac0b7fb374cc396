"""Regenerating one conversation turn by turn against the target's own earlier answers.

Each generation (a final answer or a tool call) becomes one training row: ``input_ids`` = the reply's
``prompt_token_ids`` + its generated ``token_ids``, ``loss_mask`` 0 over the prompt and 1 over the
generation; it joins the history as ``history_turns`` renders it. The k-th regenerated tool call is answered
with the k-th cached result; the conversation stops early, keeping its rows, when a call cannot be paired 1:1 or a
generation hits ``max_tokens``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from common.endpoints.api_client import ApiClient, Reply, RequestFailedError, Retries
from common.endpoints.endpoint_pool import Affinity
from regen.conversations.detokenizer import Detokenizer
from regen.conversations.history_turns import assistant_turn, history_message
from regen.conversations.replies import CheckedReply, ReplyError, parse_reply
from regen.conversations.request_params import RequestParams
from regen.rows.conversation import Conversation

# send(payload) -> the reply (its JSON, the endpoint URL that answered, its retries)
Send = Callable[[dict[str, Any]], Awaitable[Reply]]


class ConversationFailed(Exception):
    """A conversation that could not finish (request or reply error); it writes only an error-file record.
    ``retries``: what its requests' retries took, the failed request's included."""

    def __init__(self, cause: Exception, generations_completed: int, endpoint: str | None, retries: Retries):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.generations_completed = generations_completed
        self.endpoint = endpoint
        self.retries = retries


@dataclass
class Outcome:
    """The rows of a finished conversation; ``truncation`` says why it stopped early (``None``: complete)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    truncation: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_corrected: int = 0  # turns whose reasoning/answer split the server's parser got wrong
    other_model_replies: int = 0  # replies naming another model than the requests (vLLM echoes the served name)
    retries: Retries = field(default_factory=Retries)  # what its requests' retries took


@dataclass(frozen=True)
class RequestShape:
    """What every request of the run carries besides messages and per-conversation parameters."""

    model: str
    max_tokens: int
    carry_reasoning: bool = False
    top_logprobs: int | None = None  # k: ask for each generated token's top-k log-probabilities, keep them in its row


def _tool_message(call: dict, result_content: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": result_content}
    if call.get("id"):
        message["tool_call_id"] = call["id"]
    return message


def _unpairable(generation: CheckedReply, results: deque) -> str | None:
    """Why this tool-call generation cannot be answered from the cached results, or ``None``."""
    if len(generation.tool_calls) > 1:
        return "parallel_tool_calls"
    if not results:
        return "tool_results_exhausted"
    function = generation.tool_calls[0].get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if results[0].names and name not in results[0].names:
        return "tool_name_mismatch"
    return None


def _row(conversation: Conversation, index: int, generation: CheckedReply, endpoint: str,
         params: dict[str, Any], decode: Callable[[list[int]], str]) -> dict[str, Any]:
    input_ids = generation.prompt_ids + generation.generated_ids
    return {
        "id": f"{conversation.primary_id}_gen{index}",
        "primary_id": conversation.primary_id,
        "input_ids": input_ids,
        "loss_mask": [0] * len(generation.prompt_ids) + [1] * len(generation.generated_ids),
        "text": decode(input_ids),
        **({"top_logprobs": generation.top_logprobs} if generation.top_logprobs is not None else {}),
        "metadata": {
            "idx": conversation.idx,
            "finish_reason": generation.finish_reason,
            "is_tool_call": bool(generation.tool_calls),
            "usage": generation.usage,
            "endpoint": endpoint,
            "sampling_params": params,
        },
    }


async def regenerate(conversation: Conversation, send: Send, shape: RequestShape, params: dict[str, Any],
                     tokens: Detokenizer) -> Outcome:
    """All rows of one conversation; raises :class:`ConversationFailed` (no rows kept) on any error."""
    outcome = Outcome()
    results = deque(conversation.tool_results)
    history: list[dict[str, Any]] = []
    endpoint = None
    try:
        for turn in conversation.turns:
            history.append(dict(turn))
            if turn["role"] == "system":
                continue
            while True:  # one user turn: generations until a final answer
                payload = {**params, "model": shape.model, "messages": history,
                           "max_tokens": shape.max_tokens, "return_token_ids": True}
                if conversation.tools:
                    payload["tools"] = conversation.tools
                    payload["tool_choice"] = "auto"
                if shape.top_logprobs:
                    payload.update(logprobs=True, top_logprobs=shape.top_logprobs, return_tokens_as_token_ids=True)
                reply = await send(payload)
                endpoint, outcome.retries = reply.endpoint, outcome.retries + reply.retries
                generation = parse_reply(reply.data, shape.max_tokens, shape.top_logprobs)
                outcome.other_model_replies += generation.model not in (None, shape.model)
                outcome.rows.append(_row(conversation, len(outcome.rows), generation, endpoint, params, tokens.decode))
                outcome.prompt_tokens += len(generation.prompt_ids)
                outcome.completion_tokens += len(generation.generated_ids)
                turn = assistant_turn(generation, tokens.think_ids)
                outcome.reasoning_corrected += turn.corrected
                history.append(history_message(generation, turn, shape.carry_reasoning))
                if generation.finish_reason == "length":
                    outcome.truncation = "length"
                elif generation.tool_calls:
                    outcome.truncation = _unpairable(generation, results)
                    if outcome.truncation is None:
                        history.append(_tool_message(generation.tool_calls[0], results.popleft().content))
                        continue
                break
            if outcome.truncation:
                break
    except ReplyError as error:
        raise ConversationFailed(error, len(outcome.rows), endpoint, outcome.retries) from error
    except RequestFailedError as error:
        raise ConversationFailed(error, len(outcome.rows), error.endpoint or endpoint,
                                 outcome.retries + error.retries) from error
    for row in outcome.rows:
        row["metadata"]["num_generations"] = len(outcome.rows)
    return outcome


@dataclass(frozen=True)
class Regeneration:
    """What every conversation of a run shares: client, request shape, parameters and the row-text tokenizer."""

    client: ApiClient
    shape: RequestShape
    params: RequestParams
    detokenizer: Detokenizer

    async def conversation(self, conversation: Conversation, affinity: Affinity) -> Outcome:
        """The rows of ``conversation``, its requests sent on the endpoint ``affinity`` holds (see :func:`regenerate`)."""
        return await regenerate(conversation, lambda payload: self.client.complete(payload, affinity), self.shape,
                                self.params.for_conversation(conversation.primary_id), self.detokenizer)
