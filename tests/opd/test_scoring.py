"""Evaluation metrics on scripted episodes (correct, wrong, tool errors, truncation, think blocks) against hand counts,
and the evaluation's determinism for a fixed seed."""

from __future__ import annotations

from dataclasses import replace

from common.chat_records import AgentRecord
from opd.chat_format import ChatFormat
from opd.config import RolloutConfig
from opd.rollout import AgentRollout
from opd.scoring import EpisodeScore, aggregate, score_episode
from standins.scripted_sampler import ScriptedSampler
from tests.helpers.opd_support import agent_record, call_text, encode, tiny_model


def with_gt(record: AgentRecord, *gt: str) -> AgentRecord:
    return replace(record, gt=list(gt))


def test_every_metric_on_scripted_episodes(tokenizer):
    chat_format = ChatFormat(tokenizer)
    eos = [tokenizer.eos_token_id]

    def t(text: str) -> list[int]:
        return encode(tokenizer, text)

    records = [with_gt(agent_record(f"heldout.jsonl:{n}", "What is 2+3?"), "5") for n in range(1, 7)]
    calc = t(call_text("calculate_math", expression="2+3")) + eos
    scripts = {
        "heldout.jsonl:1": [calc, t("The answer is 5.") + eos],  # correct
        "heldout.jsonl:2": [calc, t("The answer is 6.") + eos],  # wrong
        "heldout.jsonl:3": [t(call_text("calculate_math", expression="1/0") + "<tool_call>{oops}</tool_call>") + eos,
                            t("It is 5.") + eos],  # a failed call and a block that is not a call, then the answer
        "heldout.jsonl:4": [t("The answer is 5" + " and so on" * 80)[:200]],  # cut by max_gen_len: no final answer
        "heldout.jsonl:5": [t("<think>\nmaybe 5\n</think>\n\nNo idea.") + eos],  # the thought does not count
        # only a block that is not a JSON object: no call, so (as in MiniMind) the episode ends here
        "heldout.jsonl:6": [t("Computing <tool_call>calculate_math(2+3)</tool_call> gives 5") + eos],
    }
    rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts), RolloutConfig(3, 200, 4096, open_thinking=False))
    episodes = rollout.run(records)
    scores = [score_episode(episode, chat_format) for episode in episodes]
    assert [s.final_answer for s in scores] == ["The answer is 5.", "The answer is 6.", "It is 5.", None, "No idea.",
                                                "gives 5"]
    assert [s.correct for s in scores] == [True, False, True, False, False, True]
    assert [s.stop_reason for s in scores] == ["answer", "answer", "answer", "max_gen_len", "answer", "answer"]
    assert [s.call_statuses for s in scores] == [["ok"], ["ok"], ["tool_error", "not_a_call"], [], [], ["not_a_call"]]
    assert [s.turns for s in scores] == [2, 2, 2, 1, 1, 1]
    lengths = [sum(len(turn) for turn in scripts[f"heldout.jsonl:{n}"]) for n in range(1, 7)]
    assert [s.assistant_tokens for s in scores] == lengths
    metrics = aggregate(scores)
    assert metrics == {
        "episodes": 6, "accuracy": 3 / 6, "tool_calls": 5,
        "tool_success_rate": 3 / 5,  # ok, ok, tool_error (a real call the tool failed on); not the non-calls
        "tool_error_rate": 3 / 5,  # tool_error and the two blocks that are not calls returned no result
        "recovery_rate": 2 / 2,  # episodes 3 and 6 had a tool error and still ended correct
        "truncation_rate": 1 / 6, "mean_turns": 9 / 6, "mean_assistant_tokens": sum(lengths) / 6,
        "teacher_token_share": 0.0,  # the model evaluated on its own wrote every token
        "stop_reasons": {"answer": 5, "max_gen_len": 1, "max_total_len": 0, "max_turns": 0},
        "call_statuses": {"not_a_call": 2, "ok": 2, "tool_error": 1},
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


def test_minimind_style_answers_are_checked_as_minimind_does(tokenizer):
    """A weather episode in MiniMind's world: gt ["28°C", "晴"] from its table; numbers with commas; a near miss."""
    chat_format = ChatFormat(tokenizer)
    eos = [tokenizer.eos_token_id]
    weather = encode(tokenizer, call_text("get_current_weather", location="北京")) + eos
    cases = {"w.jsonl:1": ("北京今天28°C，天气晴。", True), "w.jsonl:2": ("北京今天 28 °C，多云。", False),
             "w.jsonl:3": ("<think>\n28°C 晴\n</think>\n\n不知道。", False)}
    records = [with_gt(agent_record(source, "北京天气怎么样？", tools=("get_current_weather",)), "28°C", "晴")
               for source in cases]
    scripts = {source: [weather, encode(tokenizer, answer) + eos] for source, (answer, _) in cases.items()}
    episodes = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts),
                            RolloutConfig(3, 200, 4096, open_thinking=False)).run(records)
    observation = chat_format.decode(episodes[0].ids[episodes[0].turns[0].end:episodes[0].turns[0].observation_end])
    assert '{"city": "北京", "temperature": "28°C", "humidity": "65%", "condition": "晴"}' in observation
    assert [score_episode(e, chat_format).correct for e in episodes] == [correct for _, correct in cases.values()]
    money = with_gt(agent_record("m.jsonl:1", "How much?", tools=("calculate_math",)), "1,234.5")
    for answer, correct in (("It is 1234.50 yuan.", True), ("It is 1,234.5 yuan.", True), ("It is 1234.6.", False),
                            ("Code A1234.5", False)):
        scripted = {"m.jsonl:1": [encode(tokenizer, answer) + eos]}
        episode = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripted),
                               RolloutConfig(1, 200, 4096, open_thinking=False)).run([money])[0]
        assert score_episode(episode, chat_format).correct is correct, answer


def test_rates_over_no_calls_are_none():
    no_calls = aggregate([EpisodeScore("h.jsonl:1", "answer", "hi", False, 1, 3, 0)])
    assert no_calls["tool_success_rate"] is None and no_calls["tool_error_rate"] is None
    assert no_calls["recovery_rate"] is None
