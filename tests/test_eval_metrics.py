"""Evaluation metrics on scripted episodes (correct, wrong, tool errors, truncation, think blocks) against hand counts,
and the evaluation's determinism for a fixed seed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opd.agent_records import AgentRecord, RecordError
from opd.chat_format import ChatFormat
from opd.episode_metrics import EpisodeScore, aggregate, answer_text, score_episode
from opd.evaluation import EvalSettings, check_heldout, evaluate_checkpoint
from opd.minimind.tiny_checkpoints import tiny_arch, write_tiny_checkpoints
from opd.minimind.tokenizer import load_tokenizer
from opd.rollout import AgentRollout, RolloutLimits
from opd.sampling import SamplingSettings, ScriptedSampler
from opd.synthetic_task import write_task
from tests.opd_support import agent_record, call_text, encode, tiny_model


def with_gt(record: AgentRecord, *gt: str) -> AgentRecord:
    return replace(record, gt=list(gt))


def test_every_metric_on_scripted_episodes(tokenizer):
    chat_format = ChatFormat(tokenizer)
    eos = [tokenizer.eos_token_id]

    def t(text: str) -> list[int]:
        return encode(tokenizer, text)

    records = [with_gt(agent_record(f"heldout.jsonl:{n}", "What is 2+3?"), "5") for n in range(1, 6)]
    calc = t(call_text("calculate_math", expression="2+3")) + eos
    scripts = {
        "heldout.jsonl:1": [calc, t("The answer is 5.") + eos],  # correct
        "heldout.jsonl:2": [calc, t("The answer is 6.") + eos],  # wrong
        "heldout.jsonl:3": [t(call_text("calculate_math", expression="1/0") + "<tool_call>{oops}</tool_call>") + eos,
                            t("It is 5.") + eos],  # a refused call and a malformed one, then a correct answer
        "heldout.jsonl:4": [t("The answer is 5" + " and so on" * 80)[:200]],  # cut by max_gen_len: no final answer
        "heldout.jsonl:5": [t("<think>\nmaybe 5\n</think>\n\nNo idea.") + eos],  # the thought does not count
    }
    rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts), RolloutLimits(3, 200, 4096))
    episodes = rollout.run(records)
    scores = [score_episode(episode, chat_format) for episode in episodes]
    assert [s.final_answer for s in scores] == ["The answer is 5.", "The answer is 6.", "It is 5.", None, "No idea."]
    assert [s.correct for s in scores] == [True, False, True, False, False]
    assert [s.stop_reason for s in scores] == ["answer", "answer", "answer", "max_gen_len", "answer"]
    assert [s.call_statuses for s in scores] == [["ok"], ["ok"], ["tool_error", "malformed"], [], []]
    lengths = [sum(len(turn) for turn in scripts[f"heldout.jsonl:{n}"]) for n in range(1, 6)]
    assert [s.assistant_tokens for s in scores] == lengths
    metrics = aggregate(scores)
    assert metrics == {
        "episodes": 5, "accuracy": 2 / 5, "tool_calls": 4,
        "tool_success_rate": 3 / 4,  # ok, ok, tool_error (well-formed, refused by the tool); not the malformed one
        "tool_error_rate": 2 / 4,  # tool_error and malformed observations were errors
        "truncation_rate": 1 / 5, "mean_turns": 8 / 5, "mean_assistant_tokens": sum(lengths) / 5,
        "stop_reasons": {"answer": 4, "max_gen_len": 1, "max_total_len": 0, "max_turns": 0},
        "call_statuses": {"malformed": 1, "ok": 2, "tool_error": 1},
    }


def test_calls_in_the_last_allowed_turn_count_and_the_episode_is_truncated(tokenizer):
    chat_format = ChatFormat(tokenizer)
    record = with_gt(agent_record("h.jsonl:1", "What is 2+3?"), "5")
    calc = encode(tokenizer, "5 " + call_text("calculate_math", expression="2+3")) + [tokenizer.eos_token_id]
    rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler({"h.jsonl:1": [calc, calc]}),
                           RolloutLimits(2, 200, 4096))
    score = score_episode(rollout.run([record])[0], chat_format)
    assert (score.stop_reason, score.final_answer, score.correct, score.call_statuses) == (
        "max_turns", None, False, ["ok", "ok"])
    assert aggregate([score])["truncation_rate"] == 1.0 and aggregate([score])["tool_error_rate"] == 0.0


def test_answer_text_strips_think_and_tool_markup():
    assert answer_text("<think>\nx\n</think>\n\n It is 5. ") == "It is 5."
    assert answer_text("<think>never closed 5") == ""
    assert answer_text('Sure <tool_call>{"name": "a"}</tool_call>') == "Sure"
    no_calls = aggregate([EpisodeScore("h.jsonl:1", "answer", "hi", False, 1, 3)])
    assert no_calls["tool_success_rate"] is None and no_calls["tool_error_rate"] is None


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    checkpoints = write_tiny_checkpoints(root / "tiny")
    files = write_task(root / "task", train=5, heldout=5, seed=2)["files"]
    return root, checkpoints, files["heldout_prompts"]


def settings(temperature: float, seed: int) -> EvalSettings:
    return EvalSettings(SamplingSettings(temperature=temperature), RolloutLimits(2, 12, 2048), seed, 2, False, "cpu",
                        "float32")


def block(checkpoint, tokenizer_path) -> dict:
    return {"checkpoint": str(checkpoint), "tokenizer": str(tokenizer_path),
            **{k: v for k, v in vars(tiny_arch("student")).items()}}


def test_evaluation_is_deterministic_for_a_fixed_seed(heldout, tokenizer_path):
    root, checkpoints, data = heldout
    model = block(checkpoints["student"], tokenizer_path)
    runs = {name: evaluate_checkpoint("student", model, data, settings(1.0, seed), root / name)
            for name, seed in (("a", 7), ("b", 7), ("c", 8))}
    episodes = {name: (root / name / "episodes_student.jsonl").read_text() for name in runs}
    assert episodes["a"] == episodes["b"] != episodes["c"]
    timing = ("load_s", "wall_s", "assistant_tokens_per_s", "baseline_rss_mb")
    assert {k: v for k, v in runs["a"].items() if k not in timing} == {k: v for k, v in runs["b"].items() if k not in timing}
    assert runs["a"]["episodes"] == 5 and runs["a"]["peak_memory_mb"] is None  # cpu, not isolated: not measured


RECORDS = [with_gt(agent_record("h.jsonl:1", "What is 2+3?"), "5"), agent_record("h.jsonl:2", "And 3+4?")]


def test_heldout_records_need_gt(heldout, tokenizer_path):
    _, checkpoints, _ = heldout
    blocks = {"student": block(checkpoints["student"], tokenizer_path)}
    with pytest.raises(RecordError, match="h.jsonl:2: gt is required for evaluation"):
        check_heldout(RECORDS, blocks, settings(0.0, 0))
    check_heldout(RECORDS[:1], blocks, settings(0.0, 0))


def test_models_must_share_one_tokenizer(heldout, tokenizer_path, tmp_path):
    _, checkpoints, _ = heldout
    other = load_tokenizer(str(tokenizer_path))
    other.add_tokens(["<extra_token>"])
    other.save_pretrained(tmp_path / "other-tokenizer")
    blocks = {"student": block(checkpoints["student"], tokenizer_path),
              "other": block(checkpoints["student"], tmp_path / "other-tokenizer")}
    with pytest.raises(ValueError, match="student and other tokenizers differ"):
        check_heldout(RECORDS[:1], blocks, settings(0.0, 0))
