"""Scoring finished agent episodes against ``gt``: the evaluation metrics and their exact definitions.

- **final answer**: the content of the episode's last assistant turn with think blocks and tool-call markup
  removed (special tokens dropped), but only when the episode ended with an answer (a turn without tool
  calls). An episode stopped by a limit (``max_turns``, ``max_gen_len``, ``max_total_len``) has no final
  answer.
- **accuracy**: share of episodes whose final answer contains every ``gt`` string (case-sensitive
  substring match); no final answer is wrong.
- **tool success rate**: share of all tool calls that parse, name a tool the record declares and pass the
  argument checks (status ``ok`` or ``tool_error``: a well-formed call whose values the tool refused).
- **tool error rate**: share of all tool calls whose observation was an error (every status but ``ok``).
  A well-formed call the tool refuses (``1/0``, an unknown currency) counts in both rates.
- **truncation rate**: share of episodes that did not end with an answer.
- **mean turns** / **mean assistant tokens**: assistant turns / generated tokens (each turn's EOS
  included) per episode.

Calls in a last allowed turn (``max_turns`` reached) are checked but not run; they count as calls.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from opd.chat_format import ChatFormat
from opd.episodes import ANSWER, STOP_REASONS, Episode
from tools.tool_calls import split_tool_calls
from tools.tool_environment import OK, TOOL_ERROR

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@dataclass(frozen=True)
class EpisodeScore:
    """How one episode did."""

    source: str
    stop_reason: str
    final_answer: str | None
    correct: bool
    turns: int
    assistant_tokens: int
    call_statuses: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.call_statuses)

    @property
    def successful_calls(self) -> int:
        return sum(status in (OK, TOOL_ERROR) for status in self.call_statuses)

    @property
    def error_calls(self) -> int:
        return sum(status != OK for status in self.call_statuses)


def answer_text(text: str) -> str:
    """Assistant turn text without think blocks and without ``<tool_call>`` blocks, stripped."""
    content, _ = split_tool_calls(_THINK.sub("", text))
    return content.strip()


def final_answer(episode: Episode, chat_format: ChatFormat) -> str | None:
    """The final answer (see the module doc), or None when the episode did not end with one."""
    if episode.stop_reason != ANSWER:
        return None
    return answer_text(chat_format.decode(episode.turn_ids(len(episode.turns) - 1)))


def score_episode(episode: Episode, chat_format: ChatFormat) -> EpisodeScore:
    """Score one finished episode against its record's ``gt``."""
    answer = final_answer(episode, chat_format)
    gt = episode.record.gt
    return EpisodeScore(
        source=episode.record.source, stop_reason=episode.stop_reason, final_answer=answer,
        correct=answer is not None and all(item in answer for item in gt), turns=len(episode.turns),
        assistant_tokens=episode.assistant_tokens,
        call_statuses=[call.status for turn in episode.turns for call in turn.calls])


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def aggregate(scores: list[EpisodeScore]) -> dict:
    """The metrics of a set of scored episodes (rates over no calls are None)."""
    if not scores:
        raise ValueError("no episodes to aggregate")
    episodes, calls = len(scores), sum(score.calls for score in scores)
    stops = Counter(score.stop_reason for score in scores)
    return {
        "episodes": episodes,
        "accuracy": sum(score.correct for score in scores) / episodes,
        "tool_calls": calls,
        "tool_success_rate": _share(sum(score.successful_calls for score in scores), calls),
        "tool_error_rate": _share(sum(score.error_calls for score in scores), calls),
        "truncation_rate": (episodes - stops[ANSWER]) / episodes,
        "mean_turns": sum(score.turns for score in scores) / episodes,
        "mean_assistant_tokens": sum(score.assistant_tokens for score in scores) / episodes,
        "stop_reasons": {reason: stops[reason] for reason in STOP_REASONS},
        "call_statuses": dict(sorted(Counter(s for score in scores for s in score.call_statuses).items())),
    }
