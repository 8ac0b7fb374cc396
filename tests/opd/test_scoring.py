"""Evaluation metrics on scripted episodes (correct, wrong, tool errors, call error types, recovery, truncation, think
blocks) against hand counts, and the accuracy's SE over prompts against a hand calculation."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from common.chat_records import AgentRecord, RecordError, load_agent_records
from opd.config import RolloutConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.scoring import EpisodeScore, aggregate, expected_outcomes, score_episode, score_from_row
from opd.rollouts.rollout import AgentRollout
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
    assert [s.call_types for s in scores] == [["unchecked"], ["unchecked"], ["failed_call", "broken_json"], [], [],
                                              ["broken_json"]]
    assert [s.turns for s in scores] == [2, 2, 2, 1, 1, 1]
    lengths = [sum(len(turn) for turn in scripts[f"heldout.jsonl:{n}"]) for n in range(1, 7)]
    assert [s.assistant_tokens for s in scores] == lengths
    metrics = aggregate(scores)
    assert metrics == {
        "episodes": 6, "prompts": 6, "accuracy": 3 / 6, "accuracy_se": pytest.approx(math.sqrt(0.25 * 6 / 5 / 6)),
        "tool_calls": 5,
        "tool_success_rate": 3 / 5,  # ok, ok, tool_error (a real call the tool failed on); not the non-calls
        "tool_error_rate": 3 / 5,  # tool_error and the two blocks that are not calls returned no result
        # no expected_calls: only the tool world's errors are counted, every call that ran is unchecked
        "checked_calls": 0, "call_types": {"broken_json": 2, "failed_call": 1, "correct": 0, "wrong_operation": 0,
                                           "wrong_value": 0, "extra_call": 0, "unchecked": 2},
        "broken_json_rate": 2 / 5, "failed_call_rate": 1 / 5, "wrong_operation_rate": None, "wrong_value_rate": None,
        "extra_call_rate": None,
        "error_episodes": 2, "recovery_rate_all_errors": 2 / 2,  # episodes 3 and 6 had a tool error, ended correct
        # episode 3's first error, a failed call, was answered and a turn followed; episode 6's, broken JSON, ended it
        "first_errors": {"broken_json": 1, "failed_call": 1, "wrong_operation": 0, "wrong_value": 0, "extra_call": 0},
        "recoverable_first_errors": 1, "recovery_rate": 1 / 1,
        "truncation_rate": 1 / 6, "mean_turns": 9 / 6, "mean_assistant_tokens": sum(lengths) / 6,
        "teacher_token_share": 0.0,  # the model evaluated on its own wrote every token
        "stop_reasons": {"answer": 5, "max_gen_len": 1, "max_total_len": 0, "max_turns": 0},
        "call_statuses": {"not_a_call": 2, "ok": 2, "tool_error": 1},
    }


def test_calls_in_the_last_allowed_turn_count_and_the_episode_is_truncated(tokenizer):
    """The last turn's calls are checked, not run, by the rollout (status ok); the classifier runs them to compare."""
    chat_format = ChatFormat(tokenizer)
    record = replace(with_gt(agent_record("h.jsonl:1", "What is 2+3?"), "5"),
                     expected_calls=[{"name": "calculate_math", "arguments": {"expression": "2+3"}}])
    eos = [tokenizer.eos_token_id]
    calc = encode(tokenizer, "5 " + call_text("calculate_math", expression="2+3")) + eos
    for last, kind in (("2+3", "extra_call"), ("1/0", "failed_call")):
        late = encode(tokenizer, call_text("calculate_math", expression=last)) + eos
        rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler({"h.jsonl:1": [calc, late]}),
                               RolloutConfig(2, 200, 4096, open_thinking=False))
        score = score_episode(rollout.run([record])[0], chat_format)
        assert (score.stop_reason, score.final_answer, score.correct, score.call_statuses, score.call_types) == (
            "max_turns", None, False, ["ok", "ok"], ["correct", kind])
        assert aggregate([score])["truncation_rate"] == 1.0 and aggregate([score])["tool_error_rate"] == 0.0


def test_closed_calls_of_a_turn_cut_by_a_limit_are_checked_not_run(tokenizer):
    """A T=1 turn that closes a call block and goes on talking until max_gen_len never reached its EOS, so the rollout
    read no calls from it (before: the classifier's zip of blocks and outcomes failed, stopping a whole evaluation)."""
    chat_format = ChatFormat(tokenizer)
    record = replace(with_gt(agent_record("h.jsonl:1", "What is 2+3?"), "5"),
                     expected_calls=[{"name": "calculate_math", "arguments": {"expression": "2+3"}}])
    call = encode(tokenizer, call_text("calculate_math", expression="2+3"))
    cut = call + encode(tokenizer, " and then" * 40)
    room = len(chat_format.prompt_ids(record)) + len(call) + 5  # the total cuts the turn 5 tokens after the block
    for limits in (RolloutConfig(3, len(call) + 5, 4096, open_thinking=False),
                   RolloutConfig(3, 200, room, open_thinking=False)):
        rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler({"h.jsonl:1": [cut]}), limits)
        episode = rollout.run([record])[0]
        assert episode.stop_reason in ("max_gen_len", "max_total_len") and episode.turns[0].calls == []
        score = score_episode(episode, chat_format)
        assert (score.call_statuses, score.call_types, score.correct) == (["ok"], ["correct"], False)


# A two-step chain in MiniMind's tool world: (3 + 4) % 20 = 7, then (7 + 4) % 20 = 11.
CHAIN = [{"name": "calculate_math", "arguments": {"expression": "(3 + 4) % 20"}},
         {"name": "calculate_math", "arguments": {"expression": "(7 + 4) % 20"}}]


def test_call_error_types_and_recovery_on_scripted_episodes(tokenizer):
    """Seven hand-built episodes whose every call's type is known; the rates and the recovery rate by hand."""
    chat_format = ChatFormat(tokenizer)
    eos = [tokenizer.eos_token_id]

    def calc(expression: str) -> list[int]:
        return encode(tokenizer, call_text("calculate_math", expression=expression)) + eos

    def say(text: str) -> list[int]:
        return encode(tokenizer, text) + eos

    scripts = {  # source -> (turns, the call types they must get)
        "c.jsonl:1": ([calc("(3 + 4) % 20"), calc("(7 + 4) % 20"), say("The result is 11.")], ["correct", "correct"]),
        # a wrong number (after a space the tool skips, as Python's eval does), then the retry of the same step: the
        # retry is compared with the same expected call
        "c.jsonl:2": ([calc(" (3 + 5) % 20"), calc("(3 + 4) % 20"), calc("(7 + 4) % 20"), say("The result is 11.")],
                      ["wrong_value", "correct", "correct"]),
        # subtracting instead of adding, then going on from the wrong result: still not the expected first call
        "c.jsonl:3": ([calc("(3 - 4) % 20"), calc("(19 - 4) % 20"), say("The result is 15.")],
                      ["wrong_operation", "wrong_operation"]),
        # a block that is not JSON: no call, so the episode ends there (its final answer is empty)
        "c.jsonl:4": ([say('<tool_call>{"name": "calculate_math", "arguments": {"expression": "(3 + 4) % 20"</tool_call>')],
                      ["broken_json"]),
        # an invalid expression (the tool world's error), the chain written differently (the same results), one
        # call too many
        "c.jsonl:5": ([calc("(3 + 4) %"), calc("(3+4)%20"), calc("((7) + 4) % 20"), calc("11 % 20"),
                       say("The result is 11.")], ["failed_call", "correct", "correct", "extra_call"]),
        # another tool of the record's (it runs): a wrong operation
        "c.jsonl:6": ([encode(tokenizer, call_text("unit_converter", value=3, from_unit="km", to_unit="miles")) + eos,
                       say("The result is 7.")], ["wrong_operation"]),
        # no expected calls: a call that ran is unchecked, only the tool world's errors count
        "g.jsonl:1": ([calc("3 + 4"), calc("1/0"), say("The result is 11.")], ["unchecked", "failed_call"]),
    }
    tools = ("calculate_math", "unit_converter")
    records = [replace(with_gt(agent_record(source, "Start with 3. Add four, twice, modulo 20.", tools), "result is 11."),
                       expected_calls=None if source.startswith("g") else CHAIN) for source in scripts]
    rollout = AgentRollout(tiny_model(), chat_format, ScriptedSampler({s: turns for s, (turns, _) in scripts.items()}),
                           RolloutConfig(6, 200, 4096, open_thinking=False))
    scores = [score_episode(episode, chat_format) for episode in rollout.run(records)]
    assert [score.call_types for score in scores] == [types for _, types in scripts.values()]
    assert [score.correct for score in scores] == [True, True, False, False, True, False, True]
    assert [score.expected_calls for score in scores] == [2] * 6 + [None]
    metrics = aggregate(scores)
    assert metrics["call_types"] == {"broken_json": 1, "failed_call": 2, "correct": 6, "wrong_operation": 3,
                                     "wrong_value": 1, "extra_call": 1, "unchecked": 1}
    assert (metrics["tool_calls"], metrics["checked_calls"]) == (15, 13)  # the last episode's two are not checked
    assert {key: metrics[f"{key}_rate"] for key in ("wrong_value", "wrong_operation", "extra_call", "failed_call",
                                                    "broken_json")} == pytest.approx(
        {"wrong_value": 1 / 13, "wrong_operation": 3 / 13, "extra_call": 1 / 13, "failed_call": 2 / 15,
         "broken_json": 1 / 15})
    # episodes with a call error: 2 (recovered), 3, 4, 5 (recovered), 6, g1 (recovered); all but 4 (broken JSON
    # ends the episode) had a turn after their first error, with the tool world's answer before it
    assert [(score.first_error, score.first_error_recoverable) for score in scores] == [
        (None, False), ("wrong_value", True), ("wrong_operation", True), ("broken_json", False), ("failed_call", True),
        ("wrong_operation", True), ("failed_call", True)]
    assert metrics["error_episodes"] == 6 and metrics["recovery_rate_all_errors"] == pytest.approx(3 / 6)
    assert metrics["recoverable_first_errors"] == 5 and metrics["recovery_rate"] == pytest.approx(3 / 5)
    assert metrics["first_errors"] == {"broken_json": 1, "failed_call": 2, "wrong_operation": 2, "wrong_value": 1,
                                       "extra_call": 0}
    assert metrics["tool_error_rate"] == pytest.approx(3 / 15)  # not_a_call, tool_error, tool_error


def test_a_first_error_with_no_turn_after_it_is_not_recoverable(tokenizer):
    """A first error in the last allowed turn, in a turn cut by max_gen_len, or whose observation no longer fits the
    context: no turn followed, so the episode is out of the recovery rate's denominator (but in the all-errors one)."""
    chat_format = ChatFormat(tokenizer)
    eos = [tokenizer.eos_token_id]
    first, wrong = (encode(tokenizer, call_text("calculate_math", expression=e)) for e in ("(3 + 4) % 20", "(3 + 9) % 20"))
    record = replace(with_gt(agent_record("c.jsonl:1", "Start with 3. Add four, twice, modulo 20."), "11"),
                     expected_calls=CHAIN)
    def run(limits: RolloutConfig, script: list[list[int]]):
        return AgentRollout(tiny_model(), chat_format, ScriptedSampler({"c.jsonl:1": script}), limits).run([record])[0]

    # where the second turn starts: after the prompt, the first call and the tool world's answer to it
    second = run(RolloutConfig(2, 200, 4096, open_thinking=False), [first + eos, wrong + eos]).turns[0].observation_end
    cases = {  # stop reason -> (limits, the script)
        "max_turns": (RolloutConfig(2, 200, 4096, open_thinking=False), [first + eos, wrong + eos]),
        "max_gen_len": (RolloutConfig(6, len(wrong) + 2, 4096, open_thinking=False),
                        [first + eos, wrong + encode(tokenizer, " and so on and on")]),
        # the second turn ends with its EOS, 2 ids short of the limit: the tool world's answer would not fit
        "max_total_len": (RolloutConfig(6, 200, second + len(wrong) + 3, open_thinking=False),
                          [first + eos, wrong + eos]),
    }
    for reason, (limits, script) in cases.items():
        score = score_episode(run(limits, script), chat_format)
        assert (score.stop_reason, score.call_types, score.first_error, score.first_error_recoverable) == (
            reason, ["correct", "wrong_value"], "wrong_value", False), reason
        metrics = aggregate([score])
        assert (metrics["recoverable_first_errors"], metrics["recovery_rate"], metrics["error_episodes"],
                metrics["recovery_rate_all_errors"]) == (0, None, 1, 0.0)


def test_an_expected_call_must_run_in_the_tool_world(tmp_path):
    rows = [{"conversations": [{"role": "user", "content": "?"}], "gt": ["1"],
             "expected_calls": [{"name": "calculate_math", "arguments": {"expression": "1/0"}}]}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    record = load_agent_records(path)[0][0]
    with pytest.raises(RecordError, match=r"bad.jsonl:1: expected_calls\[0\] does not run in the tool world \(tool "
                                          r"'calculate_math' is not declared"):
        expected_outcomes(record)
    path.write_text(json.dumps({**rows[0], "expected_calls": [{"arguments": {}}]}) + "\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:1: expected_calls\[0\]: a call needs a non-empty string 'name'"):
        load_agent_records(path)


def score(source: str, correct: bool) -> EpisodeScore:
    return EpisodeScore(source, "answer", "x", correct, 1, 3, 0)


def test_accuracy_se_is_over_prompts_of_the_per_prompt_mean():
    """Four prompts, three samples each: per-prompt accuracies 2/3, 0, 1, 1/3 (mean 0.5), deviations +-1/6 and +-1/2:
    sample variance (2/36 + 2/4) / 3 = 5/27, SE sqrt(5/27 / 4) = 0.2152 (12 independent episodes would give 0.1508)."""
    outcomes = {"p:1": (1, 1, 0), "p:2": (0, 0, 0), "p:3": (1, 1, 1), "p:4": (1, 0, 0)}
    scores = [score(source, bool(c)) for source, samples in outcomes.items() for c in samples]
    metrics = aggregate(scores[::-1])  # order does not matter: samples are grouped by their prompt
    assert (metrics["episodes"], metrics["prompts"]) == (12, 4)
    assert metrics["accuracy"] == pytest.approx(0.5) and metrics["accuracy_se"] == pytest.approx(math.sqrt(5 / 108))
    assert aggregate([score("p:1", True), score("p:1", False)])["accuracy_se"] is None  # one prompt: no SE


def test_a_score_round_trips_through_its_episode_row():
    row = {**vars(EpisodeScore("p:1", "answer", "x", True, 2, 9, 0, ["ok"], ["correct"], 1)), "sample": 3, "gt": ["x"]}
    assert score_from_row(row) == EpisodeScore("p:1", "answer", "x", True, 2, 9, 0, ["ok"], ["correct"], 1)


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
