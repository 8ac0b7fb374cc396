"""The pilot gates: whether the study is in the regime where on-policy distillation should beat KD, each a measured
value against a threshold stated before the full study (``configs/study.yaml`` ``gates``).

- ``G0_teacher_t1_accuracy`` (at least): the robust teacher's held-out accuracy at temperature 1, all horizons.
- ``G1_student_intermediate_errors`` (at least): of the warm students' *intermediate* calls at temperature 1 (a call
  whose expected position is past the first and within the horizon: ``intermediate_calls``), the share with a call
  error (``opd.episodes.scoring``'s types: wrong value, wrong operation, failed call, broken JSON), pooled over seeds.
- ``G2_recoverable_errors`` (at least): of those errors, the share the student can recover from: the tool world
  answered the call (not broken JSON, which ends a MiniMind episode) and a turn was left for a retry.
- ``G3_kd_horizon_drop`` (at least): KD's temperature-1 accuracy at H=1 minus at the longest horizon, after the last
  step, mean over seeds: errors compound over the horizon.
- ``G4_teacher_continuation`` (at least): the robust teacher continuing the warm students' temperature-1 episodes
  after their first recoverable call error ends correct (``experiments.study.continuation``), pooled over seeds.
- ``G5_kd_recovery`` (at most): KD's temperature-1 recovery rate after the last step (of its episodes whose first
  call error was recoverable, the share still correct), mean over seeds: the off-policy student has not learnt to
  recover.
- ``G6_student_retry_note`` (at least): the warm students, teacher-forced on their own temperature-1 episodes up to
  their first recoverable call error, put this probability on the retry note's first token for their next turn
  (``experiments.study.continuation``'s ``note_probability``), mean over the prefixes pooled over seeds: recovery is
  in the students' support before any distillation, so per-token on-policy distillation can push it.
- ``G7_student_recovery`` (at least): the warm students' temperature-1 recovery rate (of the held-out episodes whose
  first call error was recoverable, the share still correct), pooled over seeds.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from experiments.estimates import episodes_file, jsonl_rows
from experiments.study.chain_task import GUARD_NUMBERS, guard_numbers_of, step_numbers
from opd.episodes.scoring import (
    BROKEN_JSON,
    CALL_ERRORS,
    CORRECT,
    FAILED_CALL,
    WRONG_OPERATION,
    WRONG_VALUE,
    aggregate,
    score_from_row,
)
from tools.tool_calls import MalformedToolCall, ToolCall, split_tool_calls

AT_MOST = ("G5_kd_recovery",)
ALL = "all"  # the report's group of every horizon


def intermediate_calls(row: dict, max_turns: int) -> list[tuple[str, bool]]:
    """(call type, recoverable) of every intermediate call of an evaluation's episode row: the calls made while the
    expected position (correct calls so far) is between 1 and ``expected_calls - 1``; an error is recoverable when
    the tool world answered it and its turn was not the last one allowed; none without ``expected_calls``."""
    if row["expected_calls"] is None:
        return []
    turn_of = [turn for turn, text in enumerate(row["turn_texts"]) for _ in split_tool_calls(text)[1]]
    found, made = [], 0
    for kind, turn in zip(row["call_types"], turn_of, strict=True):
        if 1 <= made < row["expected_calls"]:
            found.append((kind, kind != BROKEN_JSON and turn + 1 < max_turns))
        made += kind == CORRECT
    return found


GUARD_FAILED = "guard_failed"  # a checked task's failed call whose step reads back: a wrong number the guard caught


def _rows(path: Path) -> list[dict]:
    return jsonl_rows(path)


def _gate(name: str, value: float | None, threshold: float, detail: str) -> dict:
    passed = None if value is None else (value <= threshold if name in AT_MOST else value >= threshold)
    return {"value": value, "threshold": threshold, "direction": "at most" if name in AT_MOST else "at least",
            "passed": passed, "detail": detail}


def _step_numbers(call: ToolCall | MalformedToolCall) -> tuple[int, str, int] | None:
    """(input, op, k) of a chain task call, None for any other call."""
    return step_numbers(str(call.arguments.get("expression", ""))) if isinstance(call, ToolCall) else None


def wrong_number(row: dict, expected: list[dict], position: int) -> str | None:
    """Which number of the episode's first wrong value (or failed guard) is wrong, against the gold call at
    ``position`` (the correct calls before it): ``k`` (k alone), ``input`` (the input value, k right or not),
    ``guard`` (the step right: a guard operand), None when unreadable."""
    wrong = next((call for kind, call in zip(row["call_types"], _calls(row), strict=True) if kind in CALL_ERRORS), None)
    said = _step_numbers(wrong) if wrong else None
    want = (_step_numbers(ToolCall(expected[position]["name"], expected[position]["arguments"]))
            if position < len(expected) else None)
    if said is None or want is None:
        return None
    if said == want:
        return "guard"
    return "k" if said[0] == want[0] else "input"  # a wrong value with the right input: k


def wrong_guard_number(row: dict, expected: list[dict], position: int) -> str | None:
    """Of a first error whose step is right and whose guard failed (``wrong_number`` "guard"): the one guard number
    that differs from the gold call's (a, b, c or m, ``chain_task.GUARD_NUMBERS``), ``several``, or None (none
    differs, or unreadable)."""
    wrong = next((call for kind, call in zip(row["call_types"], _calls(row), strict=True) if kind in CALL_ERRORS), None)
    said = guard_numbers_of(str(wrong.arguments.get("expression", ""))) if isinstance(wrong, ToolCall) else None
    want = guard_numbers_of(str(expected[position]["arguments"].get("expression", ""))) if position < len(expected) else None
    if said is None or want is None or said.keys() != want.keys():
        return None
    differ = [name for name in want if said[name] != want[name]]
    return differ[0] if len(differ) == 1 else "several" if differ else None


def misread_number(row: dict, expected: list[dict], position: int) -> str | None:
    """The number of the episode's first error that was misread, against the gold call at ``position``: ``input``
    or ``k`` (``wrong_number``), or for a right step under a failed guard the guard number (a, b, c or m) or
    ``several`` (``wrong_guard_number``); None when it does not read back (a wrong operation, an invalid expression)."""
    number = wrong_number(row, expected, position)
    return wrong_guard_number(row, expected, position) if number == "guard" else number


def source_line(source: str) -> int:
    """The line number of an episode's record (sources are ``path:line``)."""
    return int(source.rsplit(":", 1)[1])


def gold_calls(prompts: list[dict], row: dict) -> list[dict]:
    """The gold calls (the raw ``expected_calls``, results included) of the prompt in ``prompts`` (a JSONL file's
    decoded lines) that the episode ``row`` was rolled out from; [] when it has none."""
    return prompts[source_line(row["source"]) - 1].get("expected_calls") or []


def _calls(row: dict) -> list[ToolCall | MalformedToolCall]:
    return [call for text in row["turn_texts"] for call in split_tool_calls(text)[1]]


def error_rates(prompts: list[dict], rows: Iterable[dict]) -> dict:
    """The first call errors at temperature 1 of evaluation episode ``rows`` (their ``source`` a line of the held-out
    ``prompts``) per call at risk (a call made while every earlier call of its episode was right: where a
    demonstration injects its noise), by type. ``confused``: wrong values and operations, and in a checked task the
    failed calls whose step reads back (a guard that failed: a wrong number, ``guard_failed``); ``failed_call``: the
    other failed calls (a corrupted one); broken JSON is reported, not injectable (MiniMind gives it no observation).
    Of the first confused calls whose numbers read back: ``wrong_k_share``, the share with only k wrong;
    ``wrong_guard_share``, the share with a right step and a failed guard (a guard operand wrong); the rest have a
    wrong input; ``wrong_guard_numbers``, of those with a guard operand wrong, the share by the one guard number
    misread (``wrong_guard_number``)."""
    at_risk, first, numbers, guard_numbers = 0, Counter(), Counter(), Counter()
    for row in rows:
        for position, kind in enumerate(row["call_types"]):
            at_risk += 1
            if kind in CALL_ERRORS:
                guard_failed = kind == FAILED_CALL and _step_numbers(_calls(row)[position]) is not None
                first[GUARD_FAILED if guard_failed else kind] += 1
                if kind == WRONG_VALUE or guard_failed:
                    expected = gold_calls(prompts, row)
                    number = wrong_number(row, expected, position)
                    numbers[number] += 1
                    if number == "guard":
                        guard_numbers[wrong_guard_number(row, expected, position)] += 1
                break

    def rate(*kinds: str) -> float | None:
        return sum(first[kind] for kind in kinds) / at_risk if at_risk else None

    readable = numbers["k"] + numbers["input"] + numbers["guard"]
    return {"calls_at_risk": at_risk, "confused": rate(WRONG_VALUE, WRONG_OPERATION, GUARD_FAILED),
            "wrong_value": rate(WRONG_VALUE), "wrong_operation": rate(WRONG_OPERATION),
            "guard_failed": rate(GUARD_FAILED), "failed_call": rate(FAILED_CALL), "broken_json": rate(BROKEN_JSON),
            "wrong_k_share": numbers["k"] / readable if readable else None,
            "wrong_guard_share": numbers["guard"] / readable if readable else None,
            "wrong_guard_numbers": {name: guard_numbers[name] / numbers["guard"] for name in (*GUARD_NUMBERS, "several")
                                    if guard_numbers[name]} if numbers["guard"] else None}


def student_episodes(cfg, paths) -> list[Path]:
    """The warm students' temperature-1 held-out episodes, one file per seed."""
    return [episodes_file(paths.evaluation(seed, "student", "t1"), "student") for seed in cfg.seeds]


def student_error_rates(cfg, paths) -> dict:
    """What the noise-injected demonstrations are matched to: the warm students' first call errors at temperature 1
    (``error_rates``), pooled over seeds, beside the rates the noisy files injected: ``value_noise`` matches the
    confused calls, ``syntax_noise`` the other failed calls, ``operand_share`` the share with k alone wrong,
    ``guard_share`` the share with a guard number alone wrong, ``guard_numbers`` which one. With
    ``data.match_noise`` the injected rates are those the ``noise-match`` stage set from these same episodes
    (``noise_rates.json``), else the configured ones."""
    measured = error_rates(_rows(paths.file("heldout_prompts")),
                           (row for path in student_episodes(cfg, paths) for row in _rows(path)))
    if cfg.data.match_noise:
        injected = json.loads(paths.noise_rates().read_text())["settings"]
    else:
        d = cfg.data
        injected = {"value_noise": d.value_noise, "syntax_noise": d.syntax_noise, "operand_share": d.operand_share,
                    "guard_share": d.guard_share, "guard_numbers": dict(d.guard_numbers)}
    return {**measured, **injected}


def continuation_counts(cfg, paths) -> dict:
    """G4's continued prefixes and those the teacher ended correct, pooled over seeds, by the erring call (the
    first or a later one) and by the number the student misread (``experiments.study.continuation``)."""
    pooled = {"by_error_call": {}, "by_misread_number": {}}
    for seed in cfg.seeds:
        found = json.loads(paths.continuation(seed).read_text())
        for group, counts in pooled.items():
            for key, count in found.get(group, {}).items():
                total = counts.setdefault(key, {"continued": 0, "correct": 0})
                total["continued"] += count["continued"]
                total["correct"] += count["correct"]
    return pooled


def gate_values(cfg, paths, report: dict) -> dict:
    """Every gate of ``cfg.gates`` with its measured value (None when its inputs were not run)."""
    t1, baseline, longest = report["decodings"]["t1"], report["baseline_arm"], max(cfg.horizons)
    calls = [call for path in student_episodes(cfg, paths) for row in _rows(path)
             for call in intermediate_calls(row, cfg.evaluation.max_turns)]
    errors = [recoverable for kind, recoverable in calls if kind in CALL_ERRORS]
    continuations = [json.loads(paths.continuation(seed).read_text()) for seed in cfg.seeds]
    continued = sum(c["continued"] for c in continuations)
    kd = t1["curves"][baseline]
    recovery = kd[ALL][-1]["recovery_rate"]
    notes = [json.loads(paths.continuation(seed, "student-continuation").read_text()) for seed in cfg.seeds]
    noted = sum(n["continued"] for n in notes)
    warm = aggregate([score_from_row(row) for path in student_episodes(cfg, paths) for row in _rows(path)])
    values = {
        "G0_teacher_t1_accuracy": (t1["teachers"]["robust"][ALL]["accuracy"], "robust teacher, all horizons"),
        "G1_student_intermediate_errors": (len(errors) / len(calls) if calls else None,
                                           f"{len(errors)} of {len(calls)} intermediate calls"),
        "G2_recoverable_errors": (sum(errors) / len(errors) if errors else None,
                                  f"{sum(errors)} of {len(errors)} intermediate call errors"),
        "G3_kd_horizon_drop": (kd[min(cfg.horizons)][-1]["accuracy"] - kd[longest][-1]["accuracy"],
                               f"{baseline} at H={min(cfg.horizons)} minus H={longest}, step {report['steps'][-1]}"),
        "G4_teacher_continuation": (sum(c["correct"] for c in continuations) / continued if continued else None,
                                    f"{sum(c['correct'] for c in continuations)} of {continued} continued prefixes"),
        "G5_kd_recovery": (recovery, f"{baseline}, all horizons, step {report['steps'][-1]}"),
        "G6_student_retry_note": (sum(n["note_probability"] * n["continued"] for n in notes if n["continued"]) / noted
                                  if noted else None, f"warm students, {noted} recoverable error prefixes"),
        "G7_student_recovery": (warm["recovery_rate"], f"warm students, {warm['recoverable_first_errors']} recoverable "
                                                       "first errors, all horizons"),
    }
    return {name: _gate(name, values[name][0], threshold, values[name][1]) for name, threshold in cfg.gates.items()}
