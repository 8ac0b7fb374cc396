"""Scoring finished agent episodes against ``gt`` and ``expected_calls``. Exact definitions: ``opd/NOTES.md``
("evaluation, the exact definitions") and the README's metric tables.

Each ``<tool_call>`` block gets one call type, checked in order: ``broken_json``, ``failed_call``, then a comparison
with the first expected call not yet made correctly, or ``unchecked`` without ``expected_calls``. Last-turn calls
(checked, not run, by the rollout) are run here; closed blocks of a turn cut by a limit count as calls.
``accuracy_se`` is over prompts, since one prompt's k samples are correlated.
"""

from __future__ import annotations

import ast
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields

from common.chat_records import AgentRecord, RecordError
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import ANSWER, STOP_REASONS, Episode
from tools.answer_check import answer_is_correct, final_answer
from tools.mock_tools import math_expression
from tools.safe_math import parse_expression
from tools.tool_calls import MalformedToolCall, ToolCall, split_tool_calls
from tools.tool_environment import NOT_A_CALL, OK, TOOL_ERROR, CallOutcome, check_call, execute_call

# call types (see the module doc), in the order they are checked
BROKEN_JSON, FAILED_CALL, CORRECT, WRONG_OPERATION, WRONG_VALUE, EXTRA_CALL, UNCHECKED = (
    "broken_json", "failed_call", "correct", "wrong_operation", "wrong_value", "extra_call", "unchecked")
CALL_TYPES = (BROKEN_JSON, FAILED_CALL, CORRECT, WRONG_OPERATION, WRONG_VALUE, EXTRA_CALL, UNCHECKED)
CALL_ERRORS = (BROKEN_JSON, FAILED_CALL, WRONG_OPERATION, WRONG_VALUE, EXTRA_CALL)
NEEDS_EXPECTED_CALLS = (WRONG_OPERATION, WRONG_VALUE, EXTRA_CALL)  # rates over checked calls only


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
    call_types: list[str] = field(default_factory=list)  # one per call, parallel to call_statuses
    expected_calls: int | None = None  # how many calls the record expects; None: not known (calls unchecked)
    first_error: str | None = None  # the type of the first call error, None without one
    first_error_recoverable: bool = False  # the tool world answered it and another turn followed

    @property
    def calls(self) -> int:
        return len(self.call_statuses)

    @property
    def successful_calls(self) -> int:
        return sum(status in (OK, TOOL_ERROR) for status in self.call_statuses)

    @property
    def error_calls(self) -> int:
        return sum(status != OK for status in self.call_statuses)

    @property
    def call_error(self) -> bool:
        """Whether any call went wrong (a call type in ``CALL_ERRORS``)."""
        return any(kind in CALL_ERRORS for kind in self.call_types)


def score_from_row(row: dict) -> EpisodeScore:
    """The score of one line of an evaluation's ``episodes_{name}.jsonl`` (which holds every field)."""
    missing = [item.name for item in fields(EpisodeScore) if item.name not in row]
    if missing:
        raise RecordError(f"an episode row of {row.get('source')} has no {', '.join(missing)}: written by an older "
                          "evaluation, rerun it")
    return EpisodeScore(**{item.name: row[item.name] for item in fields(EpisodeScore)})


def expression_shape(call: ToolCall) -> str:
    """The expression of a ``calculate_math`` call that ran, parsed as the tool parses it, every number replaced by 0."""
    tree = parse_expression(math_expression(call.arguments))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
            node.value = 0
    return ast.dump(tree)


def _operation(call: ToolCall) -> tuple[str, str | None]:
    return call.name, expression_shape(call) if call.name == "calculate_math" else None


def expected_outcomes(record: AgentRecord) -> list[tuple[ToolCall, dict]] | None:
    """The record's expected calls with the result each gets in MiniMind's tool world (None when it has none);
    ``RecordError`` when one does not run there (undeclared by the record, or failing)."""
    if record.expected_calls is None:
        return None
    expected = []
    for index, call in enumerate(record.expected_calls):
        tool_call = ToolCall(call["name"], call["arguments"])
        outcome = execute_call(tool_call, record.declared_tools)
        if outcome.status != OK:
            raise RecordError(f"{record.source}: expected_calls[{index}] does not run in the tool world ({outcome.detail})")
        expected.append((tool_call, outcome.result))
    return expected


def classify_calls(blocks: list[ToolCall | MalformedToolCall], outcomes: list[CallOutcome],
                   expected: list[tuple[ToolCall, dict]] | None, declared) -> list[str]:
    """One call type per block of an episode, in order (module doc); ``expected`` is ``expected_outcomes``."""
    types, made = [], 0
    for block, outcome in zip(blocks, outcomes, strict=True):
        if outcome.status == NOT_A_CALL:
            types.append(BROKEN_JSON)
            continue
        if outcome.status == OK and not outcome.executed:  # the last allowed turn's call: checked, not run
            outcome = execute_call(block, declared)
        if outcome.status != OK:
            types.append(FAILED_CALL)
        elif expected is None:
            types.append(UNCHECKED)
        elif made == len(expected):
            types.append(EXTRA_CALL)
        else:
            call, result = expected[made]
            if block.name == call.name and outcome.result == result:
                types.append(CORRECT)
                made += 1
            else:
                types.append(WRONG_OPERATION if _operation(block) != _operation(call) else WRONG_VALUE)
    return types


def episode_answer(episode: Episode, chat_format: ChatFormat) -> str | None:
    """MiniMind's final answer of the last turn (``final_answer``), or None when the episode did not end with one."""
    if episode.stop_reason != ANSWER:
        return None
    return final_answer(chat_format.decode(episode.turn_ids(len(episode.turns) - 1)))


def score_episode(episode: Episode, chat_format: ChatFormat) -> EpisodeScore:
    """Score one finished episode against its record's ``gt`` and ``expected_calls``."""
    record = episode.record
    answer = episode_answer(episode, chat_format)
    blocks, outcomes, turn_of = [], [], []
    for index, turn in enumerate(episode.turns):
        found = split_tool_calls(chat_format.decode(episode.turn_ids(index)))[1]
        blocks += found
        turn_of += [index] * len(found)
        # a turn cut by a limit (max_gen_len, max_total_len) before its EOS never had its calls read: they are
        # checked here, not run, as the last allowed turn's are
        ended = len(turn.calls) == len(found)
        outcomes += turn.calls if ended else [check_call(block, record.declared_tools) for block in found]
    expected = expected_outcomes(record)
    types = classify_calls(blocks, outcomes, expected, record.declared_tools)
    first = next((call for call, kind in enumerate(types) if kind in CALL_ERRORS), None)
    return EpisodeScore(
        source=record.source, stop_reason=episode.stop_reason, final_answer=answer,
        correct=answer is not None and answer_is_correct(answer, record.gt), turns=len(episode.turns),
        assistant_tokens=episode.assistant_tokens, teacher_tokens=episode.teacher_tokens,
        call_statuses=[call.status for call in outcomes], call_types=types,
        expected_calls=None if expected is None else len(expected),
        first_error=None if first is None else types[first],
        first_error_recoverable=first is not None and types[first] != BROKEN_JSON and turn_of[first] + 1 < len(
            episode.turns))


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (sample standard deviation / sqrt(n); None for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    variance = sum((value - mean) ** 2 for value in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def aggregate(scores: list[EpisodeScore]) -> dict:
    """The metrics of scored episodes, each prompt (``source``) with one or more samples; rates over nothing are
    None."""
    if not scores:
        raise ValueError("no episodes to aggregate")
    episodes, calls = len(scores), sum(score.calls for score in scores)
    stops = Counter(score.stop_reason for score in scores)
    failed = [score for score in scores if score.call_error]
    recoverable = [score for score in scores if score.first_error_recoverable]
    first_errors = Counter(score.first_error for score in failed)
    by_prompt = defaultdict(list)
    for score in scores:
        by_prompt[score.source].append(score.correct)
    _, accuracy_se = mean_and_se([sum(correct) / len(correct) for correct in by_prompt.values()])
    types = Counter(kind for score in scores for kind in score.call_types)
    checked = sum(score.calls for score in scores if score.expected_calls is not None)
    return {
        "episodes": episodes,
        "prompts": len(by_prompt),
        "accuracy": sum(score.correct for score in scores) / episodes,
        "accuracy_se": accuracy_se,
        "tool_calls": calls,
        "tool_success_rate": _share(sum(score.successful_calls for score in scores), calls),
        "tool_error_rate": _share(sum(score.error_calls for score in scores), calls),
        "checked_calls": checked,
        "call_types": {kind: types[kind] for kind in CALL_TYPES},
        **{f"{kind}_rate": _share(types[kind], checked if kind in NEEDS_EXPECTED_CALLS else calls)
           for kind in CALL_ERRORS},
        "error_episodes": len(failed),
        "first_errors": {kind: first_errors[kind] for kind in CALL_ERRORS},
        "recoverable_first_errors": len(recoverable),
        "recovery_rate": _share(sum(score.correct for score in recoverable), len(recoverable)),
        "recovery_rate_all_errors": _share(sum(score.correct for score in failed), len(failed)),
        "truncation_rate": (episodes - stops[ANSWER]) / episodes,
        "mean_turns": sum(score.turns for score in scores) / episodes,
        "mean_assistant_tokens": sum(score.assistant_tokens for score in scores) / episodes,
        "teacher_token_share": _share(sum(score.teacher_tokens for score in scores),
                                      sum(score.assistant_tokens for score in scores)),
        "stop_reasons": {reason: stops[reason] for reason in STOP_REASONS},
        "call_statuses": dict(sorted(Counter(s for score in scores for s in score.call_statuses).items())),
    }
