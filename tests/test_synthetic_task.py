"""The synthetic tool-use task: disjoint splits, gt from the mock tools, gold demonstrations, seeded output."""

from __future__ import annotations

import json

import pytest

from opd.agent_records import load_agent_records
from opd.demonstrations import load_demonstrations
from opd.synthetic_task import KINDS, TASK_TOOLS, generate_problems, solve, split_of, write_task
from tools.tool_calls import ToolCall
from tools.tool_environment import execute_call


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("task")
    summary = write_task(out, train=300, heldout=60, seed=3)
    return out, summary


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_splits_share_no_problem_and_heldout_questions_are_distinct(task):
    out, summary = task
    train, heldout = rows(out / "train_demonstrations.jsonl"), rows(out / "heldout_prompts.jsonl")
    assert (len(train), len(heldout)) == (300, 60)
    train_keys = {tuple(row["task"]["key"]) for row in train}
    heldout_keys = {tuple(row["task"]["key"]) for row in heldout}
    assert train_keys.isdisjoint(heldout_keys)
    questions = [row["conversations"][1]["content"] for row in heldout]
    assert len(set(questions)) == len(questions)
    assert not {row["conversations"][1]["content"] for row in train} & set(questions)
    # a held-out town's weather is never seen in training: the model has to copy its name from the question
    train_towns = {key[1] for key in train_keys if key[0] == "weather"}
    heldout_towns = {key[1] for key in heldout_keys if key[0] == "weather"}
    assert heldout_towns and train_towns.isdisjoint(heldout_towns)
    assert summary["train_kinds"] == dict.fromkeys(sorted(KINDS), 60)
    assert summary["heldout_kinds"] == dict.fromkeys(sorted(KINDS), 12)


def test_split_is_a_function_of_the_problem_key_alone():
    problems = generate_problems({"train": 200, "heldout": 40}, seed=11, heldout_share=0.3)
    for split, drawn in problems.items():
        assert all(split_of(problem.key, 0.3) == split for problem in drawn)


def test_prompt_files_match_the_demonstrations_and_parse(task, tokenizer):
    out, _ = task
    demonstrations, _ = load_demonstrations(out / "train_demonstrations.jsonl")
    prompts, _ = load_agent_records(out / "train_prompts.jsonl")
    heldout, _ = load_agent_records(out / "heldout_prompts.jsonl")
    assert [d.record.messages for d in demonstrations] == [p.messages for p in prompts]
    assert [d.record.gt for d in demonstrations] == [p.gt for p in prompts]
    for record in prompts + heldout:
        assert record.declared_tools == frozenset(TASK_TOOLS)
        assert [m["role"] for m in record.messages] == ["system", "user"] and record.gt


def test_demonstrations_replay_the_mock_tools_and_answer_with_gt(task):
    out, _ = task
    kinds_seen = set()
    for row in rows(out / "train_demonstrations.jsonl"):
        turns = row["conversations"][2:]
        kinds_seen.add(row["task"]["kind"])
        calls = [turn for turn in turns if turn["role"] == "assistant" and turn.get("tool_calls")]
        assert len(calls) == (2 if row["task"]["kind"] == "amount" else 1)
        for call_turn, tool_turn in zip(turns[0::2], turns[1::2], strict=False):
            function = call_turn["tool_calls"][0]["function"]
            outcome = execute_call(ToolCall(function["name"], function["arguments"]), TASK_TOOLS)
            assert tool_turn == {"role": "tool", "content": outcome.observation}
        answer = turns[-1]
        assert answer["role"] == "assistant" and not answer.get("tool_calls")
        assert row["gt"] and all(item in answer["content"] for item in row["gt"])
    assert kinds_seen == set(KINDS)


def test_two_step_problem_multiplies_by_the_looked_up_rate():
    problem = next(p for p in generate_problems({"train": 50}, seed=0)["train"] if p.kind == "amount")
    turns, gt = solve(problem)
    rate = json.loads(turns[1]["content"])["rate"]
    expression = turns[2]["tool_calls"][0]["function"]["arguments"]["expression"]
    assert expression == f"{problem.values['amount']} * {json.dumps(rate)}"
    assert gt == [json.dumps(json.loads(turns[3]["content"])["result"])]


def test_generation_is_seeded(tmp_path):
    first = write_task(tmp_path / "a", train=40, heldout=10, seed=5)
    again = write_task(tmp_path / "b", train=40, heldout=10, seed=5)
    other = write_task(tmp_path / "c", train=40, heldout=10, seed=6)
    text = {name: (tmp_path / name / "train_demonstrations.jsonl").read_text() for name in "abc"}
    assert text["a"] == text["b"] != text["c"]
    assert first["train_kinds"] == again["train_kinds"] == other["train_kinds"]


def test_impossible_requests_fail_clearly():
    with pytest.raises(ValueError, match="could not draw enough distinct problems"):
        generate_problems({"train": 1, "heldout": 200}, seed=0, kinds=("rate",), max_draws=5000)
    with pytest.raises(ValueError, match="kinds must be"):
        generate_problems({"train": 1}, seed=0, kinds=("poetry",))
