"""The synthetic tool-use task: disjoint splits in MiniMind's tables, gt from its tools, gold demonstrations, seeds."""

from __future__ import annotations

import json

import pytest

from opd.agent_records import load_agent_records
from opd.demonstrations import load_demonstrations
from opd.synthetic_task import KINDS, TASK_TOOLS, Problem, generate_problems, solve, split_of, write_task
from tools.answer_check import answer_is_correct, final_answer
from tools.mock_tools import EXCHANGE_RATES, UNIT_FACTORS, WEATHER
from tools.tool_calls import ToolCall
from tools.tool_environment import execute_call


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("task")
    summary = write_task(out, train=300, heldout=60, seed=3)
    return out, summary


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_splits_share_no_problem(task):
    out, summary = task
    train, heldout = rows(out / "train_demonstrations.jsonl"), rows(out / "heldout_prompts.jsonl")
    assert (len(train), len(heldout)) == (300, 60)
    train_keys = {tuple(row["task"]["key"]) for row in train}
    heldout_keys = {tuple(row["task"]["key"]) for row in heldout}
    assert train_keys.isdisjoint(heldout_keys)
    assert not {row["conversations"][1]["content"] for row in train} & {row["conversations"][1]["content"] for row in heldout}
    # a held-out city's weather or currency pair's rate is never asked in training
    for kind in ("weather", "rate"):
        train_kind, heldout_kind = ({key for key in keys if key[0] == kind} for keys in (train_keys, heldout_keys))
        assert heldout_kind and train_kind.isdisjoint(heldout_kind)
    assert summary["train_kinds"] == dict.fromkeys(sorted(KINDS), 60)
    assert summary["heldout_kinds"] == dict.fromkeys(sorted(KINDS), 12)
    assert summary["heldout_distinct_problems"] < 60  # MiniMind's tables are small: held-out problems repeat


def test_problems_come_from_minimind_s_tables(task):
    out, _ = task
    keys = [tuple(row["task"]["key"]) for name in ("train_prompts", "heldout_prompts") for row in rows(out / f"{name}.jsonl")]
    assert {key[1] for key in keys if key[0] == "weather"} <= set(WEATHER)
    assert {key[-2:] for key in keys if key[0] in ("rate", "amount")} <= set(EXCHANGE_RATES)
    assert {f"{key[2]}_{key[3]}" for key in keys if key[0] == "unit"} <= set(UNIT_FACTORS)
    # at the default share, 4 of the 15 cities and 1 of the 8 currency pairs are held out (the docstring says so)
    assert [city for city in WEATHER if split_of(("weather", city), 0.2) == "heldout"] == ["重庆", "New York", "London",
                                                                                          "Paris"]
    assert [pair for pair in EXCHANGE_RATES if split_of(("rate", *pair), 0.2) == "heldout"] == [("GBP", "CNY")]


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
        assert row["gt"] and answer_is_correct(final_answer(answer["content"]), row["gt"])
    assert kinds_seen == set(KINDS)


def test_two_step_problem_multiplies_by_the_looked_up_rate():
    problem = next(p for p in generate_problems({"train": 50}, seed=0)["train"] if p.kind == "amount")
    turns, gt = solve(problem)
    rate = json.loads(turns[1]["content"])["rate"]
    assert rate == EXCHANGE_RATES[(problem.values["source"], problem.values["target"])]
    expression = turns[2]["tool_calls"][0]["function"]["arguments"]["expression"]
    assert expression == f"{problem.values['amount']} * {json.dumps(rate)}"
    assert gt == [json.loads(turns[3]["content"])["result"]]  # calculate_math's result is already a string


@pytest.mark.parametrize("kind,key,gt,answer", [
    ("weather", ("weather", "北京"), ["28°C", "晴"], "It is 28°C and 晴 in 北京."),
    ("rate", ("rate", "JPY", "CNY"), ["0.048"], "One JPY is 0.048 CNY."),
    ("unit", ("unit", 100, "celsius", "fahrenheit"), ["180.0"], "That is 180.0 fahrenheit."),
    ("unit", ("unit", 10, "km", "miles"), ["6.2137"], "That is 6.2137 miles."),
    ("amount", ("amount", 3, "USD", "CNY"), ["21.63"], "3 USD is 21.63 CNY."),
    ("amount", ("amount", 3, "CNY", "JPY"), ["62.489999999999995"], "3 CNY is 62.489999999999995 JPY."),  # full repr
    ("arithmetic", ("arithmetic", "(12 * 7) - 5"), ["79"], "The result is 79."),
])
def test_gt_is_as_minimind_s_observations_render_it(kind, key, gt, answer):
    values = {"weather": lambda: {"city": key[1]}, "rate": lambda: {"source": key[1], "target": key[2]},
              "unit": lambda: {"value": key[1], "source": key[2], "target": key[3]},
              "amount": lambda: {"amount": key[1], "source": key[2], "target": key[3]},
              "arithmetic": lambda: {"expression": key[1]}}[kind]()
    turns, solved_gt = solve(Problem(kind, key, "?", values))
    assert (solved_gt, turns[-1]["content"]) == (gt, answer)


def test_generation_is_seeded(tmp_path):
    first = write_task(tmp_path / "a", train=40, heldout=10, seed=5)
    again = write_task(tmp_path / "b", train=40, heldout=10, seed=5)
    other = write_task(tmp_path / "c", train=40, heldout=10, seed=6)
    text = {name: (tmp_path / name / "train_demonstrations.jsonl").read_text() for name in "abc"}
    assert text["a"] == text["b"] != text["c"]
    assert first["train_kinds"] == again["train_kinds"] == other["train_kinds"]


def test_impossible_requests_fail_clearly():
    # at share 0.1 none of MiniMind's 8 currency pairs falls in the held-out split
    with pytest.raises(ValueError, match="could not draw enough problems .* choose another heldout_share"):
        generate_problems({"train": 1, "heldout": 20}, seed=0, heldout_share=0.1, kinds=("rate",), max_draws=5000)
    with pytest.raises(ValueError, match="kinds must be"):
        generate_problems({"train": 1}, seed=0, kinds=("poetry",))
