"""The study's chain task: dependent calculator calls in MiniMind's tool world, three splits disjoint by triple,
observations equal to the tool world's, noise-injected demonstrations whose corrupted calls are context only."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from common.chat_records import load_agent_records
from experiments.study import chain_task
from experiments.study.chain_task import (
    HORIZONS,
    MODULUS,
    NUMBER_WORDS,
    OPERATIONS,
    RETRY_NOTE,
    SPLITS,
    all_triples,
    corrupted,
    make_record,
    solve,
    split_of,
    step_numbers,
    write_task,
)
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import demonstration_episode, load_demonstrations
from opd.episodes.scoring import expected_outcomes
from tools.answer_check import answer_is_correct
from tools.tool_calls import ToolCall
from tools.tool_environment import execute_call


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain")
    write_task(out, train=40, distill=20, seed=5, part="noisy", value_noise=0.3, syntax_noise=0.2)
    return out, write_task(out, train=40, distill=20, seed=5)


def rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def triple_of(row) -> tuple:
    return tuple(row["task"]["triple"])


def test_splits_are_disjoint_by_triple_and_every_held_out_triple_is_asked_once_per_horizon(task):
    out, summary = task
    found = {split: {triple_of(row) for name in (f"{split}_prompts", f"{split}_demonstrations",
                                                 f"{split}_noisy_demonstrations") if (out / f"{name}.jsonl").exists()
                     for row in rows(out / f"{name}.jsonl")} for split in ("train", "distill")}
    heldout = rows(out / "heldout_prompts.jsonl")
    found["heldout"] = {triple_of(row) for row in heldout}
    for first, second in (("train", "distill"), ("train", "heldout"), ("distill", "heldout")):
        assert found[first].isdisjoint(found[second])
    for split in SPLITS:  # the split is a function of the triple alone (not of the seed or the horizon)
        assert all(split_of(triple, 0.4, 0.2) == split for triple in found[split])
    everything = {triple for triple in all_triples() if split_of(triple, 0.4, 0.2) == "heldout"}
    assert sorted((triple_of(row), row["task"]["horizon"]) for row in heldout) == sorted(
        (triple, horizon) for triple in everything for horizon in HORIZONS)
    assert summary["records"] == {"train": 40 * len(HORIZONS), "distill": 20 * len(HORIZONS), "heldout": len(heldout)}


def test_gold_and_noisy_files_hold_the_same_problems_in_the_same_order(task):
    out, _ = task
    for split in ("train", "distill"):
        gold, noisy, prompts = (rows(out / f"{split}_{kind}.jsonl")
                                for kind in ("demonstrations", "noisy_demonstrations", "prompts"))
        assert [(triple_of(r), r["task"]["horizon"]) for r in gold] == [
            (triple_of(r), r["task"]["horizon"]) for r in noisy] == [(triple_of(r), r["task"]["horizon"]) for r in prompts]
        assert [len([r for r in gold if r["task"]["horizon"] == h]) for h in HORIZONS] == [len(gold) // 4] * 4


def test_the_noise_rates_change_the_noisy_files_and_nothing_else(tmp_path):
    """The noisy part has its own generator: the task's files are the same bytes whatever the rates, so the study
    can set them from the pilot and rerun only the stages that read the noisy files."""
    for name, value in (("a", 0.1), ("b", 0.4)):
        write_task(tmp_path / name, train=10, distill=5, seed=3)
        write_task(tmp_path / name, train=10, distill=5, seed=3, part="noisy", value_noise=value, syntax_noise=0.1)
    for file in ("train_demonstrations", "train_prompts", "distill_prompts", "heldout_prompts", "warm_demonstrations"):
        assert (tmp_path / "a" / f"{file}.jsonl").read_bytes() == (tmp_path / "b" / f"{file}.jsonl").read_bytes()
    a, b = (rows(tmp_path / name / "train_noisy_demonstrations.jsonl") for name in "ab")
    assert [(triple_of(r), r["task"]["horizon"]) for r in a] == [(triple_of(r), r["task"]["horizon"]) for r in b]
    assert a != b


def replay(turns: list[dict]) -> list[tuple[str, str]]:
    """(expression, observation) of every call, the observation as the rollout's tool world returns it."""
    calls = []
    for turn, observation in zip(turns[:-1:2], turns[1::2], strict=True):
        expression = turn["tool_calls"][0]["function"]["arguments"]["expression"]
        assert execute_call(ToolCall("calculate_math", {"expression": expression}),
                            frozenset({"calculate_math"})).observation == observation["content"]
        calls.append((expression, observation["content"]))
    return calls


@pytest.mark.parametrize("horizon", HORIZONS)
def test_each_call_needs_the_previous_observation_and_the_answer_the_last(horizon):
    for triple in random.Random(horizon).sample(all_triples(), 30):
        turns, gt, noise = solve(triple, horizon)
        calls = replay(turns)
        assert noise == {"confused": 0, "corrupted": 0} and len(calls) == horizon
        value = triple[0]
        for expression, observation in calls:
            assert expression.startswith(f"({value} ")  # the argument is the previous observation's result
            value = int(json.loads(observation)["result"])
        assert gt == str(value) and turns[-1] == {"role": "assistant", "content": f"The result is {value}."}


def test_the_gt_phrase_is_found_only_in_the_right_answer():
    row = make_record((13, "-", 6), 4, demonstration=False)
    value = int(row["gt"][0].split()[-1].rstrip("."))
    assert answer_is_correct(f"The result is {value}.", row["gt"])
    assert not any(answer_is_correct(f"The result is {other}.", row["gt"]) for other in range(MODULUS * 2)
                   if other != value)  # 1 is no answer for 11 (a bare "1" gt would be found in "11")


def test_a_prompt_carries_its_gold_calls_for_the_evaluations_classifier(tmp_path):
    path = tmp_path / "prompt.jsonl"
    path.write_text(json.dumps(make_record((13, "-", 6), 4, demonstration=False)) + "\n")
    expected = expected_outcomes(load_agent_records(path)[0][0])
    assert [call.arguments["expression"] for call, _ in expected] == [
        "(13 - 6) % 20", "(7 - 6) % 20", "(1 - 6) % 20", "(15 - 6) % 20"]
    assert [result["result"] for _, result in expected] == ["7", "1", "15", "9"]
    assert "expected_calls" not in make_record((13, "-", 6), 4, demonstration=True)


def test_a_noise_call_is_a_confused_or_corrupted_step_then_the_noted_retry_from_the_last_correct_value():
    """A confused call runs (one number wrong: k at the operand share, else the input value) and returns a wrong
    result; a corrupted call gets the tool world's error; either is followed by the retry, which says RETRY_NOTE,
    with the correct call from the last correct value, so the weight-1 calls are exactly the gold episode's. A retry
    is a call too: noise may come before it again (after the note), at most horizon + 1 noise calls in all; the
    rates per call (retries included) are those asked for."""
    rng, counts, calls_made, repeated = random.Random(0), {"confused": 0, "corrupted": 0, "k": 0}, 0, 0
    for triple in all_triples():
        for horizon in (2, 6):
            turns, gt, noise = solve(triple, horizon, value_noise=0.15, syntax_noise=0.05, operand_share=0.25, rng=rng)
            gold, gold_gt, _ = solve(triple, horizon)
            calls, weights = replay(turns), [turn.get("weight", 1) for turn in turns[:-1:2]]
            assert [call for call, weight in zip(calls, weights, strict=True) if weight == 1] == replay(gold)
            assert gt == gold_gt and weights.count(0) == sum(noise.values()) <= horizon + 1
            notes = [turn["content"] for turn in turns[:-1:2]]
            assert [note == RETRY_NOTE for note in notes] == [index > 0 and weights[index - 1] == 0
                                                             for index in range(len(notes))]
            assert set(notes) <= {"", RETRY_NOTE}
            for index, ((expression, observation), weight) in enumerate(zip(calls, weights, strict=True)):
                if weight == 1:
                    continue
                repeated += weights[index + 1] == 0
                retry, _ = calls[weights.index(1, index)]  # the retry: the next learned call
                if "error" in json.loads(observation):  # corrupted: an invalid expression of the same step
                    assert expression in (retry[:-3], retry.replace(") %", " %"))  # truncated, unbalanced
                else:  # confused: a valid expression, one number other than the retry's, another result
                    wrong, right = expression.replace("(", " ").replace(")", " ").split(), retry.replace(
                        "(", " ").replace(")", " ").split()
                    differ = [position for position, (a, b) in enumerate(zip(wrong, right, strict=True)) if a != b]
                    assert len(wrong) == len(right) and len(differ) == 1 and differ[0] in (0, 2)  # input or k
                    counts["k"] += differ[0] == 2
                    assert json.loads(observation)["result"] != json.loads(calls[weights.index(1, index)][1])["result"]
            for kind in ("confused", "corrupted"):
                counts[kind] += noise[kind]
            calls_made += horizon + sum(noise.values())
    assert 0.13 < counts["confused"] / calls_made < 0.17 and 0.04 < counts["corrupted"] / calls_made < 0.06
    assert 0.2 < counts["k"] / counts["confused"] < 0.3
    assert 100 < repeated < 0.3 * sum(counts[kind] for kind in ("confused", "corrupted"))  # about 1 in 5 noise calls


def test_a_noise_call_is_context_and_its_retry_a_target(task, tokenizer):
    out, _ = task
    chat_format = ChatFormat(tokenizer)
    demonstrations, _ = load_demonstrations(out / "train_noisy_demonstrations.jsonl")
    noisy = [d for d in demonstrations if any(m.get("weight") == 0 for m in d.messages)]
    assert noisy
    for demonstration in noisy[:20]:
        episode = demonstration_episode(demonstration, chat_format, 4096)
        wrong = [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in demonstration.messages
                 if m.get("weight") == 0]
        skipped = [tokenizer.decode(episode.ids[turn.start:turn.end]) for turn in episode.turns if not turn.trained]
        targets = [tokenizer.decode(episode.ids[turn.start:turn.end]) for turn in episode.turns if turn.trained]
        assert len(skipped) == len(wrong) and all(expression in text for expression, text in zip(wrong, skipped, strict=True))
        assert all(') % 20"' in text or text.startswith("The result is") for text in targets)
        retries = [target for index, target in enumerate(targets)
                   if index < len(targets) - 1 and target.startswith(RETRY_NOTE + "\n<tool_call>")]
        weights = [m.get("weight", 1) for m in demonstration.messages if m["role"] == "assistant"]
        runs = sum(1 for before, after in itertools.pairwise(weights) if before == 0 and after == 1)
        assert len(retries) == runs  # a note before exactly the retried calls (one per run of noise calls)


def test_a_step_expression_reads_back_and_nothing_else_does():
    for triple in all_triples():
        start, op, k = triple
        assert step_numbers(chain_task.expression(start, op, k)) == triple
        assert all(step_numbers(corrupted(start, op, k, kind)) is None for kind in ("truncated", "unbalanced"))
    assert step_numbers("(13 - 6) % 20 + 1") is None and step_numbers("13 - 6") is None


def run(expression: str) -> dict:
    return json.loads(execute_call(ToolCall("calculate_math", {"expression": expression}),
                                   frozenset({"calculate_math"})).observation)


def test_a_checked_problem_states_its_check_and_guards_every_call_by_the_step_before():
    row = make_record((13, "-", 6), 4, demonstration=False, key=9)
    assert row["conversations"][1]["content"].startswith("Start with 13, which is 2 minus 9 modulo 20. Subtract six,")
    assert row["task"]["check_key"] == 9
    assert [call["arguments"]["expression"] for call in row["expected_calls"]] == [
        "1 // 0 ** ((2 - 9 - 13) % 20) * (13 - 6) % 20", "1 // 0 ** ((13 - 6 - 7) % 20) * (7 - 6) % 20",
        "1 // 0 ** ((7 - 6 - 1) % 20) * (1 - 6) % 20", "1 // 0 ** ((1 - 6 - 15) % 20) * (15 - 6) % 20"]
    for triple in random.Random(1).sample(all_triples(), 40):
        for horizon, key in ((1, 1), (6, 9)):
            checked, plain = solve(triple, horizon, key=key), solve(triple, horizon)
            observations = [turn["content"] for turn in checked[0] if turn["role"] == "tool"]
            assert observations == [turn["content"] for turn in plain[0] if turn["role"] == "tool"]
            assert checked[1] == plain[1]
            start = triple[0]
            assert f"Start with {start}, which is {(start + key) % MODULUS} minus {key} modulo" in chain_task.question(
                triple, horizon, key=key)


def test_a_checked_task_draws_the_unchecked_problems_and_a_check_per_record(tmp_path):
    """The same problems in the same order as the unchecked task, each record with its own check (so a problem's
    check cannot be learnt with it), the same in the gold and noisy files."""
    write_task(tmp_path / "plain", train=60, distill=10, seed=2)
    write_task(tmp_path / "checked", train=60, distill=10, seed=2, checked=True)
    write_task(tmp_path / "checked", train=60, distill=10, seed=2, checked=True, part="noisy", value_noise=0.3)
    for name in ("train_prompts", "distill_demonstrations", "heldout_prompts"):
        plain, checked = rows(tmp_path / "plain" / f"{name}.jsonl"), rows(tmp_path / "checked" / f"{name}.jsonl")
        assert [row["task"]["triple"] for row in plain] == [row["task"]["triple"] for row in checked]
        assert [row["gt"] for row in plain] == [row["gt"] for row in checked]
        assert all("check_key" not in row["task"] for row in plain)
    gold, noisy = (rows(tmp_path / "checked" / f"train_{kind}.jsonl") for kind in ("demonstrations", "noisy_demonstrations"))
    assert [row["task"]["check_key"] for row in gold] == [row["task"]["check_key"] for row in noisy]
    assert [row["conversations"][1] for row in gold] == [row["conversations"][1] for row in noisy]
    by_problem = {}
    for row in gold:
        by_problem.setdefault((tuple(row["task"]["triple"]), row["task"]["horizon"]), set()).add(row["task"]["check_key"])
    assert max(len(keys) for keys in by_problem.values()) > 1
    assert {key for keys in by_problem.values() for key in keys} == set(range(1, 10))


def test_a_checked_call_fails_in_the_tool_world_unless_its_input_is_the_guarded_result():
    """A wrong input, written in the guard and the step alike, gets MiniMind's error observation whatever the value;
    a wrong k passes the guard and runs (that error stays silent)."""
    for triple in all_triples():
        start, op, k = triple
        guard = ((start + 4) % MODULUS, "-", 4)
        assert run(chain_task.expression(start, op, k, guard)) == {"result": str(chain_task._step(start, op, k))}
        for wrong in range(MODULUS):
            if wrong != start:
                assert "error" in run(chain_task.expression(wrong, op, k, guard))
        for other in OPERATIONS[op][1]:
            assert "result" in run(chain_task.expression(start, op, other, guard))


def test_checked_noise_calls_are_flagged_when_the_input_or_a_guard_operand_is_wrong():
    """A confused checked call has its input wrong (guard and step alike), or k, or at the guard share the guard's
    first operand alone; all but a wrong k fail in the tool world, and the retry restores every number."""
    rng, kinds = random.Random(3), {"flagged": 0, "silent": 0, "guard": 0}
    for triple in all_triples()[::5]:
        turns, gt, noise = solve(triple, 6, value_noise=0.5, operand_share=0.3, rng=rng, key=4, guard_share=0.4)
        assert replay([turn for turn in turns]) and gt == solve(triple, 6)[1]
        for index, turn in enumerate(turns):
            if turn.get("weight") == 0:
                wrong = turn["tool_calls"][0]["function"]["arguments"]["expression"]
                retry = next(later for later in turns[index + 2::2] if later.get("weight", 1) == 1)
                retry = retry["tool_calls"][0]["function"]["arguments"]["expression"]
                assert turns[index + 2]["content"] == RETRY_NOTE
                said, want = step_numbers(wrong), step_numbers(retry)
                flagged = "error" in json.loads(turns[index + 1]["content"])
                operands = [int(n) for n in chain_task.GUARDED_STEP.match(wrong).groups() if n and n.isdigit()]
                right = [int(n) for n in chain_task.GUARDED_STEP.match(retry).groups() if n and n.isdigit()]
                differ = [position for position, (a, b) in enumerate(zip(operands, right, strict=True)) if a != b]
                # positions: guard a, b, v, modulus, step v, k, modulus
                assert differ in ([0], [2, 4], [5])
                assert flagged == (differ != [5])  # a wrong input or guard operand fails the guard, a wrong k runs
                kinds["guard" if differ == [0] else "flagged" if flagged else "silent"] += 1
                assert said == want or differ != [0]
    assert kinds["flagged"] > kinds["guard"] > kinds["silent"] > 0


def test_a_named_retry_note_states_the_last_correct_value_and_nothing_else_changes():
    """With retry_names_input every retry note (learned or noise) names the input of the step being redone: the
    start at the first call, the last correct result later; the same draws give the same calls, observations and
    weights as without it, and the note's number is the learned retry's input."""
    named_notes = 0
    for triple in all_triples()[::3]:
        for operand_key in (None, 7):
            plain, named = ([solve(triple, 6, value_noise=0.4, syntax_noise=0.05, rng=random.Random(sum(triple[::2])),
                                   key=5, guard_share=0.1, operand_key=operand_key, retry_names_input=flag)
                             for flag in (False, True)])
            assert plain[1:] == named[1:]
            inputs, value = [], triple[0]  # the input of each gold step, in order
            for _ in range(6):
                inputs.append(value)
                value = chain_task._step(value, triple[1], triple[2])
            learned = 0
            for before, after in zip(plain[0], named[0], strict=True):
                assert {**before, "content": ""} == {**after, "content": ""}
                if "tool_calls" not in before or not before["content"]:
                    assert after["content"] == before["content"]
                    learned += "tool_calls" in before and before.get("weight", 1) == 1
                    continue
                assert before["content"] == RETRY_NOTE
                assert after["content"] == f"That call was wrong; redoing the step from {inputs[learned]}."
                assert after["content"] == chain_task.retry_note(inputs[learned])
                if after.get("weight", 1) == 1:
                    expression = after["tool_calls"][0]["function"]["arguments"]["expression"]
                    assert step_numbers(expression)[0] == inputs[learned]
                    learned += 1
                named_notes += 1
    assert named_notes > 100


@pytest.mark.parametrize("name", ["a", "b", "c", "m"])
def test_a_guard_confusion_misreads_the_guard_number_it_is_weighted_to(name):
    """guard_numbers {name: 1}: every confused call at the guard share differs from its retry in that guard number
    alone (the step and the other guard numbers as the retry's) and fails in the tool world; the default draws as
    {a: 1} does, number for number."""
    changed = 0
    for triple in all_triples()[::4]:
        kwargs = dict(value_noise=0.5, key=3, operand_key=6, guard_share=1.0)
        turns, gt, _ = solve(triple, 6, guard_numbers={name: 1.0}, rng=random.Random(sum(triple[::2])), **kwargs)
        if name == "a":
            assert turns == solve(triple, 6, rng=random.Random(sum(triple[::2])), **kwargs)[0]
        assert gt == solve(triple, 6)[1]
        for index, turn in enumerate(turns):
            if turn.get("weight") != 0:
                continue
            wrong = turn["tool_calls"][0]["function"]["arguments"]["expression"]
            retry = next(later for later in turns[index + 2::2] if later.get("weight", 1) == 1)
            retry = retry["tool_calls"][0]["function"]["arguments"]["expression"]
            said, want = chain_task.guard_numbers_of(wrong), chain_task.guard_numbers_of(retry)
            assert step_numbers(wrong) == step_numbers(retry)
            differ = [number for number in want if said[number] != want[number]]
            # b of a product whose a is 0 fails at no value (every b gives 0): then a, which always fails, is misread
            assert differ == [name] or (name == "b" and differ == ["a"] and want["a"] == 0 and " * " in retry)
            assert json.loads(turns[index + 1]["content"]) == {"error": "unknown tool or invalid arguments"}
            changed += 1
    assert changed > 50


def test_guard_numbers_of_an_operand_check_are_refused_without_one(tmp_path):
    with pytest.raises(ValueError, match="guard_numbers c and m are the operand check's"):
        write_task(tmp_path, train=2, distill=2, part="noisy", checked=True, guard_share=0.5, guard_numbers={"c": 1.0})
    with pytest.raises(ValueError, match="guard_numbers must weigh some of a, b, c, m"):
        write_task(tmp_path, train=2, distill=2, part="noisy", checked=True, guard_numbers={"z": 1.0})


def test_retry_names_input_is_refused_outside_the_noisy_part(tmp_path):
    with pytest.raises(ValueError, match="retry_names_input changes noise-injected demonstrations only"):
        write_task(tmp_path, train=2, distill=2, part="task", retry_names_input=True)
    summary = write_task(tmp_path, train=2, distill=2, part="noisy", checked=True, retry_names_input=True)
    assert summary["retry_names_input"] is True


def test_a_guarded_expression_reads_back_as_its_step_and_its_corruptions_do_not():
    for triple in all_triples():
        start, op, k = triple
        guard = (start, op, k)
        assert step_numbers(chain_task.expression(start, op, k, guard)) == triple
        for kind in ("truncated", "unbalanced"):
            text = corrupted(start, op, k, kind, guard)
            assert step_numbers(text) is None and "error" in run(text)


def test_a_guard_share_without_checked_problems_is_refused(tmp_path):
    with pytest.raises(ValueError, match="guard_share applies to checked problems only, got 0.3 without checked"):
        write_task(tmp_path, train=4, distill=2, part="noisy", guard_share=0.3)


def test_an_operand_checked_problem_states_both_checks_and_every_call_checks_its_k():
    row = make_record((13, "-", 6), 4, demonstration=False, key=9, operand_key=4)
    assert row["conversations"][1]["content"] == (
        "Start with 13, which is 2 minus 9 modulo 20. Subtract six, which is 10 minus 4 modulo 20, four times, "
        "keeping the remainder after dividing by 20 each time. What is the result?")
    assert row["task"]["check_key"] == 9 and row["task"]["operand_key"] == 4
    assert [call["arguments"]["expression"] for call in row["expected_calls"]] == [
        "1 // 0 ** ((2 - 9 - 13) % 20 + (10 - 4 - 6) % 20) * (13 - 6) % 20",
        "1 // 0 ** ((13 - 6 - 7) % 20 + (10 - 4 - 6) % 20) * (7 - 6) % 20",
        "1 // 0 ** ((7 - 6 - 1) % 20 + (10 - 4 - 6) % 20) * (1 - 6) % 20",
        "1 // 0 ** ((1 - 6 - 15) % 20 + (10 - 4 - 6) % 20) * (15 - 6) % 20"]
    for triple in random.Random(2).sample(all_triples(), 40):
        checked, plain = solve(triple, 6, key=3, operand_key=7), solve(triple, 6)
        assert [turn["content"] for turn in checked[0] if turn["role"] == "tool"] == [
            turn["content"] for turn in plain[0] if turn["role"] == "tool"]
        assert checked[1] == plain[1]
        assert f"{NUMBER_WORDS[triple[2]]}, which is {(triple[2] + 7) % MODULUS} minus 7 modulo 20, six times" in (
            chain_task.question(triple, 6, key=3, operand_key=7))
    with pytest.raises(ValueError, match="an operand check needs a checked problem"):
        make_record((13, "-", 6), 4, demonstration=False, operand_key=4)


def test_an_operand_checked_call_fails_unless_its_input_and_its_k_are_right():
    """With the operand's check, a wrong k (written in the check and the step alike) fails like a wrong input: no
    single wrong number of a call stays silent; a k wrong in the step alone still runs."""
    for triple in all_triples():
        start, op, k = triple
        guard, check = ((start + 4) % MODULUS, "-", 4), ((k + 6) % MODULUS, 6)
        text = chain_task.expression(start, op, k, guard, check)
        assert run(text) == {"result": str(chain_task._step(start, op, k))}
        assert step_numbers(text) == triple
        for wrong in range(MODULUS):
            if wrong != start:
                assert "error" in run(chain_task.expression(wrong, op, k, guard, check))
        for other in OPERATIONS[op][1]:
            if other != k:
                assert "error" in run(chain_task.expression(start, op, other, guard, check))
                step_only = text.replace(f"* ({start} {op} {k}) %", f"* ({start} {op} {other}) %")
                assert "result" in run(step_only) and step_numbers(step_only) == (start, op, other)
        for kind in ("truncated", "unbalanced"):
            broken = corrupted(start, op, k, kind, guard, check)
            assert step_numbers(broken) is None and "error" in run(broken)


def test_operand_checked_noise_calls_are_all_flagged_and_retried_right():
    rng, noise = random.Random(5), {"confused": 0, "corrupted": 0}
    for triple in all_triples()[::3]:
        turns, gt, made = solve(triple, 6, value_noise=0.4, syntax_noise=0.1, operand_share=0.5, rng=rng, key=2,
                                guard_share=0.2, operand_key=5)
        assert replay(turns) and gt == solve(triple, 6)[1]
        noise = {kind: noise[kind] + made[kind] for kind in noise}
        for index, turn in enumerate(turns):
            if turn.get("weight") == 0:
                assert "error" in json.loads(turns[index + 1]["content"])
                assert turns[index + 2]["content"] == RETRY_NOTE
    assert noise["confused"] > 100 and noise["corrupted"] > 10


def test_an_operand_checked_task_keeps_the_checked_problems_and_draws_an_operand_check_per_record(tmp_path):
    write_task(tmp_path / "checked", train=60, distill=10, seed=2, checked=True)
    write_task(tmp_path / "operand", train=60, distill=10, seed=2, checked=True, checked_operand=True)
    write_task(tmp_path / "operand", train=60, distill=10, seed=2, checked=True, checked_operand=True, part="noisy",
               value_noise=0.3)
    for name in ("train_prompts", "distill_demonstrations", "heldout_prompts"):
        checked, operand = rows(tmp_path / "checked" / f"{name}.jsonl"), rows(tmp_path / "operand" / f"{name}.jsonl")
        assert [(row["task"]["triple"], row["task"]["check_key"], row["gt"]) for row in checked] == [
            (row["task"]["triple"], row["task"]["check_key"], row["gt"]) for row in operand]
    gold, noisy = (rows(tmp_path / "operand" / f"train_{kind}.jsonl") for kind in ("demonstrations", "noisy_demonstrations"))
    assert [row["task"]["operand_key"] for row in gold] == [row["task"]["operand_key"] for row in noisy]
    assert {row["task"]["operand_key"] for row in gold} == set(range(1, 10))
    with pytest.raises(ValueError, match="checked_operand needs checked problems"):
        write_task(tmp_path / "no", train=4, distill=2, checked_operand=True)


def test_noise_rates_from_a_file_write_the_same_files_as_the_same_rates_given_as_flags(tmp_path, capsys):
    """--noise-rates (the noise_match stage's file) sets all five noise settings, and nothing else differs."""
    common = ["--train", "12", "--distill", "4", "--seed", "2", "--checked", "--checked-operand", "--part", "noisy",
              "--retry-names-input"]
    settings = {"value_noise": 0.3, "syntax_noise": 0.05, "operand_share": 0.1, "guard_share": 0.4,
                "guard_numbers": {"a": 0.25, "c": 0.75}}
    (tmp_path / "rates.json").write_text(json.dumps({"settings": settings, "measured": {}}))
    chain_task.main(["--out", str(tmp_path / "file"), *common, "--noise-rates", str(tmp_path / "rates.json"),
                     "--value-noise", "0.9"])  # the file wins over a flag
    chain_task.main(["--out", str(tmp_path / "flags"), *common, "--value-noise", "0.3", "--syntax-noise", "0.05",
                     "--operand-share", "0.1", "--guard-share", "0.4", "--guard-numbers", "a=0.25,c=0.75"])
    capsys.readouterr()
    for name in ("train_noisy_demonstrations", "distill_noisy_demonstrations"):
        file, flags = ((tmp_path / kind / f"{name}.jsonl").read_bytes() for kind in ("file", "flags"))
        assert file == flags and b'"weight": 0' in file
    summary = json.loads((tmp_path / "file" / "noisy_summary.json").read_text())
    assert {key: summary[key] for key in settings} == settings


@pytest.mark.parametrize("content,message", [
    (None, "cannot read it"),
    ("{not json", "expected experiments.study.noise_match's JSON"),
    ('{"settings": {"value_noise": 0.1}}', "expected experiments.study.noise_match's JSON, whose settings hold "
                                           "value_noise, syntax_noise"),
    ('{"settings": {"value_noise": 0.7, "syntax_noise": 0.4, "operand_share": 0, "guard_share": 0, '
     '"guard_numbers": {"a": 1}}}', "value_noise >= 0, syntax_noise >= 0 and their sum < 1 are required"),
    ('{"settings": {"value_noise": "high", "syntax_noise": 0, "operand_share": 0, "guard_share": 0, '
     '"guard_numbers": {"a": 1}}}', "every setting must be a number or a mapping of numbers"),
])
def test_a_bad_noise_rates_file_is_one_error_naming_it(tmp_path, capsys, content, message):
    rates = tmp_path / "rates.json"
    if content is not None:
        rates.write_text(content)
    with pytest.raises(SystemExit) as stop:
        chain_task.main(["--out", str(tmp_path / "out"), "--train", "2", "--distill", "2", "--checked", "--part",
                         "noisy", "--noise-rates", str(rates)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and f"--noise-rates {rates}: " in error and message in error


def test_the_warm_noisy_demonstrations_are_the_warm_problems_a_share_of_them_noise_injected(tmp_path):
    """The warm start's SFT data with recoveries: the same problems in the same order as warm_demonstrations, a
    record noise-injected with probability warm_noisy_share (then its noise calls are context, its retries
    targets) and the gold record otherwise; the task's other files are those of a run without it."""
    noise = {"value_noise": 0.3, "syntax_noise": 0.05, "checked": True, "retry_names_input": True}
    plain = write_task(tmp_path / "plain", train=200, distill=2, horizons=(1, 2, 4, 6), warm_horizons=(2, 4))
    summary = write_task(tmp_path / "mixed", train=200, distill=2, horizons=(1, 2, 4, 6), warm_horizons=(2, 4),
                         warm_noisy_share=0.5, **noise)
    assert summary["warm_noisy_share"] == 0.5 and summary["value_noise"] == 0.3
    for name in plain["files"]:
        assert (tmp_path / "plain" / f"{name}.jsonl").read_text() != "" and name in summary["files"]
    gold = [json.loads(line) for line in (tmp_path / "mixed" / "warm_demonstrations.jsonl").read_text().splitlines()]
    mixed = [json.loads(line) for line in
             (tmp_path / "mixed" / "warm_noisy_demonstrations.jsonl").read_text().splitlines()]
    assert len(gold) == len(mixed) == 400
    assert [row["task"]["triple"] for row in gold] == [row["task"]["triple"] for row in mixed]
    noisy = [row for row in mixed if any(message.get("weight") == 0 for message in row["conversations"])]
    same = sum(g == m for g, m in zip(gold, mixed, strict=True))
    # a noise-injected record holds no noise call with probability (1 - 0.35) per call: 0.5 x that share are gold too
    assert 100 < len(noisy) < 200 and same == len(mixed) - len(noisy) > 200
    retry = next(message for row in noisy for message in row["conversations"]
                 if message["role"] == "assistant" and message.get("content", "").startswith("That call was wrong"))
    assert retry.get("weight", 1) == 1 and "redoing the step from" in retry["content"]
    with pytest.raises(ValueError, match="warm_noisy_share must be in \\[0, 1\\], and 0 but for part task"):
        write_task(tmp_path / "x", train=2, distill=2, part="noisy", warm_noisy_share=0.5)
