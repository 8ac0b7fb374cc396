"""Scoring finished agent episodes against ``gt``: the evaluation metrics and their exact definitions.

- **final answer**: MiniMind's (``tools.answer_check.final_answer``): the text of the episode's last assistant
  turn after its first ``</think>`` and after its last ``</tool_call>``, stripped — only when the episode
  ended with an answer (a turn without calls). An episode stopped by a limit (``rollout.max_turns``,
  ``max_gen_len``, ``max_total_len``) has none.
- **accuracy**: share of episodes whose final answer holds every ``gt`` item as MiniMind's
  ``validate_gt_in_text`` finds it (``tools.answer_check``: case-insensitive substring, or a number within
  1e-6 of a free-standing number of the answer, commas ignored); no final answer is wrong.
- **tool calls**: every ``<tool_call>`` block of every turn, also blocks that are not calls to MiniMind
  (``not_a_call``: not a closed JSON object; they get no observation).
- **tool success rate**: share of tool calls that name a tool the record declares and MiniMind implements,
  with readable arguments (status ``ok``, or ``tool_error``: the tool failed on those values).
- **tool error rate**: share of tool calls that did not return a result (every status but ``ok``).
  A call the tool fails on (``1/0``) counts in both rates.
- **recovery rate**: of the episodes with at least one tool error, the share that still ended correct.
- **truncation rate**: share of episodes that did not end with an answer.
- **mean turns** / **mean assistant tokens**: assistant turns / generated tokens (each turn's EOS
  included) per episode.
- **teacher token share**: share of the generated tokens the teacher wrote (a guided rollout's, or the teacher's
  own episodes; 0 for a model evaluated on its own).

Calls in a last allowed turn (``max_turns`` reached) are checked but not run; they count as calls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opd.chat_format import ChatFormat
from opd.episodes import ANSWER, STOP_REASONS, Episode
from tools.answer_check import answer_is_correct, final_answer
from tools.tool_environment import OK, TOOL_ERROR


@dataclass(frozen=True)
class EpisodeScore:
    """How one episode did."""

    source: str
    stop_reason: str
    final_answer: str | None
    correct: bool
    turns: int
    assistant_tokens: int
    teacher_tokens: int
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


def episode_answer(episode: Episode, chat_format: ChatFormat) -> str | None:
    """The final answer (see the module doc), or None when the episode did not end with one."""
    if episode.stop_reason != ANSWER:
        return None
    return final_answer(chat_format.decode(episode.turn_ids(len(episode.turns) - 1)))


def score_episode(episode: Episode, chat_format: ChatFormat) -> EpisodeScore:
    """Score one finished episode against its record's ``gt``."""
    answer = episode_answer(episode, chat_format)
    return EpisodeScore(
        source=episode.record.source, stop_reason=episode.stop_reason, final_answer=answer,
        correct=answer is not None and answer_is_correct(answer, episode.record.gt), turns=len(episode.turns),
        assistant_tokens=episode.assistant_tokens, teacher_tokens=episode.teacher_tokens,
        call_statuses=[call.status for turn in episode.turns for call in turn.calls])


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def aggregate(scores: list[EpisodeScore]) -> dict:
    """The metrics of a set of scored episodes (rates over no calls, or no failed calls, are None)."""
    if not scores:
        raise ValueError("no episodes to aggregate")
    episodes, calls = len(scores), sum(score.calls for score in scores)
    stops = Counter(score.stop_reason for score in scores)
    failed = [score for score in scores if score.error_calls]
    return {
        "episodes": episodes,
        "accuracy": sum(score.correct for score in scores) / episodes,
        "tool_calls": calls,
        "tool_success_rate": _share(sum(score.successful_calls for score in scores), calls),
        "tool_error_rate": _share(sum(score.error_calls for score in scores), calls),
        "recovery_rate": _share(sum(score.correct for score in failed), len(failed)),
        "truncation_rate": (episodes - stops[ANSWER]) / episodes,
        "mean_turns": sum(score.turns for score in scores) / episodes,
        "mean_assistant_tokens": sum(score.assistant_tokens for score in scores) / episodes,
        "teacher_token_share": _share(sum(score.teacher_tokens for score in scores),
                                      sum(score.assistant_tokens for score in scores)),
        "stop_reasons": {reason: stops[reason] for reason in STOP_REASONS},
        "call_statuses": dict(sorted(Counter(s for score in scores for s in score.call_statuses).items())),
    }
