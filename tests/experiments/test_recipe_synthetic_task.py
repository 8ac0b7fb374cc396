"""The synthetic task: three splits of disjoint problems in MiniMind's tables, gt from its tools, gold demonstrations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.chat_records import load_agent_records
from experiments.recipe.synthetic_task import (
    SLOTS,
    SPLITS,
    TASK_TOOLS,
    all_keys,
    generate_problems,
    solve,
    split_of,
    write_task,
)
from opd.episodes.demonstrations import load_demonstrations
from tests.helpers.paths import REPO_ROOT
from tools.answer_check import answer_is_correct, final_answer
from tools.mock_tools import EXCHANGE_RATES, LOCAL_TIMES, TRANSLATIONS, WEATHER
from tools.tool_calls import ToolCall
from tools.tool_environment import execute_call

FILES = {"train": "train_demonstrations", "distill": "distill_prompts", "heldout": "heldout_prompts"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("task")
    summary = write_task(out, train=600, distill=300, heldout=500, seed=3)
    return out, summary


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def key_of(row) -> tuple:
    return tuple(tuple(slot) for slot in row["task"]["key"])


def test_the_three_splits_share_no_problem_and_held_out_problems_are_distinct(task):
    out, summary = task
    split_rows = {split: rows(out / f"{name}.jsonl") for split, name in FILES.items()}
    assert {split: len(r) for split, r in split_rows.items()} == {"train": 600, "distill": 300, "heldout": 500}
    keys = {split: {key_of(row) for row in r} for split, r in split_rows.items()}
    questions = {split: {row["conversations"][1]["content"] for row in r} for split, r in split_rows.items()}
    for first, second in (("train", "distill"), ("train", "heldout"), ("distill", "heldout")):
        assert keys[first].isdisjoint(keys[second]) and questions[first].isdisjoint(questions[second])
    assert len(keys["heldout"]) == 500 == summary["heldout_distinct_problems"]
    # nor in the other order: no two splits share a pair of lookups
    pairs = {split: {frozenset(key) for key in split_keys} for split, split_keys in keys.items()}
    assert pairs["train"].isdisjoint(pairs["distill"] | pairs["heldout"]) and pairs["distill"].isdisjoint(pairs["heldout"])
    for split in SPLITS:
        assert all(split_of(key, 0.45, 0.15) == split for key in keys[split])


def test_every_slot_appears_in_every_split(task):
    """A held-out problem is a new combination of lookups the model has seen, never an unseen city or pair."""
    out, _ = task
    for name in FILES.values():
        seen = {slot for row in rows(out / f"{name}.jsonl") for slot in key_of(row)}
        assert seen == set(SLOTS), name


def test_problems_come_from_minimind_s_tables():
    assert len(SLOTS) == len(WEATHER) + len(EXCHANGE_RATES) + len(LOCAL_TIMES) + len(TRANSLATIONS) == 35
    assert {slot[1] for slot in SLOTS if slot[0] == "weather"} == set(WEATHER)
    assert {slot[1:] for slot in SLOTS if slot[0] == "rate"} == set(EXCHANGE_RATES)
    assert {slot[1] for slot in SLOTS if slot[0] == "time"} == set(LOCAL_TIMES)
    assert {slot[1:] for slot in SLOTS if slot[0] == "translate"} == set(TRANSLATIONS)
    keys = all_keys()
    assert len(keys) == len(set(keys)) == 35 * 34 and all(a != b for a, b in keys)
    # at the default shares 522 of the 1,190 problems are held out and 186 are for distillation (the README says so)
    assert [sum(split_of(key, 0.45, 0.15) == split for key in keys) for split in SPLITS] == [482, 186, 522]


def test_split_is_a_function_of_the_problem_key_alone():
    problems = [generate_problems({"train": 50, "distill": 50, "heldout": 50}, seed=seed) for seed in (1, 2)]
    assert problems[0] != problems[1]
    for drawn in problems:
        for split, split_problems in drawn.items():
            assert all(split_of(problem.key, 0.45, 0.15) == split for problem in split_problems)


def test_prompt_files_match_the_demonstrations_and_parse(task, tokenizer):
    out, _ = task
    demonstrations, _ = load_demonstrations(out / "train_demonstrations.jsonl")
    prompts, _ = load_agent_records(out / "train_prompts.jsonl")
    assert [d.record.messages for d in demonstrations] == [p.messages for p in prompts]
    assert [d.record.gt for d in demonstrations] == [p.gt for p in prompts]
    for name in ("train_prompts", "distill_prompts", "heldout_prompts"):
        for record in load_agent_records(out / f"{name}.jsonl")[0]:
            assert record.declared_tools == frozenset(TASK_TOOLS)
            assert [m["role"] for m in record.messages] == ["system", "user"] and record.gt


def test_demonstrations_replay_the_mock_tools_and_answer_with_gt(task):
    out, _ = task
    for row in rows(out / "train_demonstrations.jsonl"):
        call_turn, *observations, answer = row["conversations"][2:]
        assert len(call_turn["tool_calls"]) == 2 == len(observations)
        for call, observation in zip(call_turn["tool_calls"], observations, strict=True):
            outcome = execute_call(ToolCall(call["function"]["name"], call["function"]["arguments"]), TASK_TOOLS)
            assert outcome.status == "ok" and observation == {"role": "tool", "content": outcome.observation}
        assert answer["role"] == "assistant" and not answer.get("tool_calls")
        assert row["gt"] and answer_is_correct(final_answer(answer["content"]), row["gt"])


@pytest.mark.parametrize("key,gt,answer", [
    ((("weather", "北京"), ("rate", "JPY", "CNY")), ["28°C", "晴", "0.048"], "北京: 28°C, 晴. JPY to CNY: 0.048."),
    ((("time", "Asia/Tokyo"), ("weather", "Sydney")), ["2025-03-07 15:30:00", "25°C", "晴朗"],
     "Asia/Tokyo: 2025-03-07 15:30:00. Sydney: 25°C, 晴朗."),
    ((("translate", "你好世界", "english"), ("rate", "USD", "EUR")), ["Hello World", "0.92"],
     "'你好世界' in english: Hello World. USD to EUR: 0.92."),
])
def test_gt_is_as_minimind_s_observations_render_it(key, gt, answer):
    turns, solved_gt = solve(key)
    assert (solved_gt, turns[-1]["content"]) == (gt, answer)
    assert answer_is_correct(answer, gt) and not answer_is_correct(answer.split(". ")[0], gt)  # both lookups count


def test_generation_is_seeded(tmp_path):
    first = write_task(tmp_path / "a", train=40, distill=10, heldout=10, seed=5)
    again = write_task(tmp_path / "b", train=40, distill=10, heldout=10, seed=5)
    write_task(tmp_path / "c", train=40, distill=10, heldout=10, seed=6)
    text = {name: (tmp_path / name / "train_demonstrations.jsonl").read_text() for name in "abc"}
    assert text["a"] == text["b"] != text["c"]
    assert first["train_kinds"] == again["train_kinds"]


def test_impossible_requests_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="600 distinct held-out problems asked, but only 522"):
        generate_problems({"heldout": 600}, seed=0)
    with pytest.raises(ValueError, match="their sum < 1"):
        generate_problems({"train": 1}, seed=0, heldout_share=0.6, distill_share=0.5)
    result = subprocess.run([sys.executable, "-m", "experiments.recipe.synthetic_task", "--out", str(tmp_path), "--heldout", "2000"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "error: 2000 distinct held-out problems asked" in result.stderr
    assert "Traceback" not in result.stderr
