"""Evaluation metrics on scripted episodes (correct, wrong, tool errors, truncation, think blocks) against hand counts,
and the evaluation's determinism for a fixed seed."""

from __future__ import annotations

from dataclasses import replace

from opd.agent_records import AgentRecord
from opd.chat_format import ChatFormat
from opd.config import RolloutConfig
from opd.rollout import AgentRollout
from opd.sampling import ScriptedSampler
from opd.scoring import EpisodeScore, aggregate, answer_text, score_episode
from tests.opd_helpers import agent_record, call_text, encode, tiny_model


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
    rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts), RolloutConfig(3, 200, 4096, open_thinking=False))
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
                           RolloutConfig(2, 200, 4096, open_thinking=False))
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
