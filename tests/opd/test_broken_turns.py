"""Broken turns (tool calls the tool world could not read, turns cut at max_gen_len): which turns they are, their share
of the targets in the step log, the warning an on-policy forward-KL run gives once, and ``loss.mask_broken_turns``
leaving exactly those turns out of the loss."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from common.minimind.precision import resolve_precision
from opd.config import LossConfig, RolloutConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import pack_episodes
from opd.rollouts.guidance import BehaviourPolicy
from opd.rollouts.rollout import AgentRollout
from opd.train import train
from opd.training.loss import TargetLogits, distill_loss_step, token_divergence
from opd.training.train_log import BrokenTurnWatch, episode_counts, episode_figures
from standins.scripted_sampler import ScriptedSampler
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import (
    TINY_TEACHER,
    agent_record,
    call_text,
    encode,
    tiny_model,
    write_agent_data,
)
from tests.opd.test_guidance import guidance

CPU = resolve_precision("cpu", "float32")
LIMITS = RolloutConfig(max_turns=3, max_gen_len=128, max_total_len=4096, open_thinking=False)


def turns_of(tokenizer) -> dict[str, list[int]]:
    """Scripted assistant turns, each ending with EOS but ``cut``."""
    eos = [tokenizer.eos_token_id]
    call = encode(tokenizer, call_text("calculate_math", expression="2+3"))
    return {
        "call": call + eos,
        "answer": encode(tokenizer, "The answer is 5.") + eos,
        # a readable call and a block that is no closed JSON object: the call runs, the turn is broken
        "call_and_broken": call + encode(tokenizer, '<tool_call>{"name": "calculate_math", "arguments": {') + eos,
        # only an unreadable block: no call, so the episode ends with this turn as its answer (as in MiniMind)
        "broken": encode(tokenizer, '<tool_call>{"name": "calculate_math", "arguments": {"expression": "2+') + eos,
        # a JSON object without a usable name: the tool world answers with its error (status malformed)
        "malformed": encode(tokenizer, '<tool_call>\n{"arguments": {"expression": "2+3"}}\n</tool_call>') + eos,
        "cut": encode(tokenizer, "The answer is" + " very" * 200),
    }


@pytest.fixture(scope="module")
def scripted(tokenizer):
    t = turns_of(tokenizer)
    scripts = {"b.jsonl:1": [t["call"], t["answer"]],  # clean
               "b.jsonl:2": [t["call_and_broken"], t["answer"]],  # turn 0 broken, turn 1 clean
               "b.jsonl:3": [t["malformed"], t["call"], t["answer"]],  # turn 0 broken (malformed)
               "b.jsonl:4": [t["call"], t["cut"]],  # turn 1 cut at max_gen_len
               "b.jsonl:5": [t["broken"]]}  # the only turn broken
    records = [agent_record(source, "What is 2+3?") for source in scripts]
    return records, scripts


def test_which_turns_are_broken_and_their_target_counts(scripted, tokenizer):
    records, scripts = scripted
    chat_format = ChatFormat(tokenizer)
    episodes = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts), LIMITS).run(records)
    assert [e.stop_reason for e in episodes] == ["answer", "answer", "answer", "max_gen_len", "answer"]
    assert [[e.broken(i) for i in range(len(e.turns))] for e in episodes] == [
        [False, False], [True, False], [True, False, False], [False, True], [True]]
    lengths = [[e.turns[i].end - e.turns[i].start for i in range(len(e.turns))] for e in episodes]
    assert lengths[3][1] == LIMITS.max_gen_len  # the cut turn holds max_gen_len generated ids
    broken = [lengths[1][0], lengths[2][0], lengths[3][1], lengths[4][0]]
    assert [e.target_counts() for e in episodes] == [(sum(n), 0, 0) for n in lengths[:1]] + [
        (sum(n), b, 0) for n, b in zip(lengths[1:], broken, strict=True)]
    masked = [e.without_broken_turns() for e in episodes]
    assert masked[0] is episodes[0]  # nothing to leave out: the very same episode
    for before, after in zip(episodes, masked, strict=True):
        # the same ids and turns, the broken ones context only: exactly their spans leave the target mask
        expected = [flag and not any(turn.start <= p < turn.end for i, turn in enumerate(before.turns)
                                     if before.broken(i)) for p, flag in enumerate(before.target_mask())]
        assert after.ids == before.ids and after.target_mask() == expected
        assert after.target_counts() == (*before.target_counts()[:2], before.target_counts()[1])
    figures = episode_figures(episode_counts(masked, chat_format))
    assert figures["broken_target_share"] == pytest.approx(sum(broken) / sum(map(sum, lengths)))
    assert figures["masked_targets"] == sum(broken)
    assert episode_figures(episode_counts(episodes, chat_format))["masked_targets"] == 0


def test_a_broken_turn_left_out_gets_exactly_zero_gradient_and_the_others_keep_theirs(scripted, tokenizer):
    records, scripts = scripted
    chat_format = ChatFormat(tokenizer)
    student, teacher = tiny_model(seed=1), tiny_model(TINY_TEACHER, seed=2)
    episode = AgentRollout(student, chat_format, ScriptedSampler(scripts), LIMITS).run(records[1:2])[0]
    first, second = episode.turns
    assert episode.broken(0) and not episode.broken(1)
    settings = LossConfig("forward_kl", 1.0, 0.5, mask_broken_turns=True)

    def hidden_gradient(chosen):
        """The loss of ``chosen`` and its gradient at the student's final hidden states (one row per position:
        position t predicts id t + 1)."""
        kept = {}
        handle = student.model.norm.register_forward_hook(lambda module, args, out: kept.setdefault("h", out))
        kept.clear()
        batch = pack_episodes([chosen], chat_format.pad_token_id)
        student.zero_grad()
        loss, _ = distill_loss_step(TargetLogits(student), teacher, [chosen], batch, settings, CPU)
        kept["h"].retain_grad()
        loss.backward()
        handle.remove()
        return loss.item(), kept["h"].grad[0].abs().sum(-1)

    loss, gradient = hidden_gradient(episode.without_broken_turns())
    predicts = {name: range(turn.start - 1, turn.end - 1) for name, turn in (("broken", first), ("kept", second))}
    assert all(gradient[t] == 0 for t in predicts["broken"])  # exactly zero, not small
    assert all(gradient[t] > 0 for t in predicts["kept"])
    assert gradient[first.start - 1:].count_nonzero() == len(predicts["kept"])  # no other position is trained
    # the loss is the kept turn's alone: the per-position divergence of a full forward, summed over its targets
    ids = torch.tensor([episode.ids])
    with torch.no_grad():
        full = [model(input_ids=ids).logits[0, :-1] for model in (student, teacher)]
    by_position = token_divergence(*full, settings)
    assert loss == pytest.approx(by_position[predicts["kept"].start:predicts["kept"].stop].sum().item(), rel=1e-5)
    unmasked, _ = hidden_gradient(episode)  # both turns, not the observation between them
    assert unmasked == pytest.approx(sum(by_position[list(span)].sum().item() for span in predicts.values()), rel=1e-5)


def test_masking_changes_nothing_on_episodes_without_broken_turns(scripted, tokenizer):
    records, scripts = scripted
    chat_format = ChatFormat(tokenizer)
    episode = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts), LIMITS).run(records[:1])[0]
    assert episode.without_broken_turns() is episode
    packed = pack_episodes([episode], chat_format.pad_token_id)
    again = pack_episodes([episode.without_broken_turns()], chat_format.pad_token_id)
    assert torch.equal(packed.target_mask, again.target_mask) and packed.target_count == episode.assistant_tokens


def test_a_guided_rollout_s_kept_teacher_logits_lose_exactly_the_broken_turns_rows(scripted, tokenizer):
    records, scripts = scripted
    chat_format = ChatFormat(tokenizer)
    student, teacher = tiny_model(seed=1), tiny_model(TINY_TEACHER, seed=2)
    policy = BehaviourPolicy(teacher, guidance(token_mix=0.5), ScriptedSampler(scripts), [1, 2])
    episodes = AgentRollout(student, chat_format, ScriptedSampler(scripts), LIMITS).run(records[1:3], policy)
    for episode in episodes:
        kept = episode.teacher_logits
        first = episode.turns[0]
        masked = episode.without_broken_turns()
        assert torch.equal(masked.teacher_logits, kept[first.end - first.start:])
        assert len(masked.teacher_logits) == pack_episodes([masked], chat_format.pad_token_id).target_count


@pytest.mark.parametrize(("shares", "warned_at"), [
    ([0.05] * 20, None),  # a clean run: never
    ([0.25, 0.3, 0.22] + [0.3] * 10, 3),  # above the limit from the start: once the window is full
    ([0.0] * 5 + [0.12] * 10, 8),  # a sharp rise from a clean start, under the absolute limit
    ([0.1] * 5 + [0.18] * 10, None),  # a rise, but less than three times the first steps
    ([0.3, 0.0, 0.0, 0.0], None),  # one noisy step: the window's mean stays under the limit
])
def test_the_watch_warns_once_on_a_high_or_sharply_rising_share(shares, warned_at):
    watch = BrokenTurnWatch()
    warnings = [(step, line) for step, share in enumerate(shares, 1) if (line := watch.check(step, share))]
    assert [step for step, _ in warnings] == ([] if warned_at is None else [warned_at])
    if warnings:
        assert "loss.kl_direction=reverse_kl" in warnings[0][1] and "loss.mask_broken_turns=true" in warnings[0][1]


class ScriptedRollouts(ScriptedSampler):
    """A run's token sampler that writes every record's episode from one script (with a sampler's resume state)."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__({})
        self.script = script

    def __call__(self, logits, episodes):
        self.scripts = {episode.record.source: self.script for episode in episodes}
        return super().__call__(logits, episodes)

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_agent_data(tmp_path_factory.mktemp("broken") / "agent.jsonl", 5)


def scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path, script, *overrides):
    """An on-policy run of 6 steps (5 records, batch 2, 2 epochs) whose every episode is ``script``; its metrics lines
    and its warning lines."""
    monkeypatch.setattr("opd.train.TokenSampler", lambda *args: ScriptedRollouts(script))
    cfg = entry_config("opd", [*tiny_pair, f"data={data}", "batch_size=2", "epochs=2", "rollout.max_gen_len=256",
                               "rollout.max_total_len=4096", "device=cpu", f"out_dir={tmp_path}", *overrides])
    with caplog.at_level(logging.WARNING, logger="opd"):
        train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return rows, [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING
                  and "broken turns" in record.getMessage()]


def test_a_forward_kl_run_with_broken_turns_warns_once_and_a_clean_one_never(monkeypatch, caplog, tiny_pair, data,
                                                                            tmp_path, tokenizer):
    t = turns_of(tokenizer)
    rows, warnings = scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path / "broken", [t["broken"]])
    assert len(rows) == 6 and [row["broken_target_share"] for row in rows] == [1.0] * 6
    assert len(warnings) == 1 and warnings[0].startswith("warning: step 3: 100% of the targets")
    caplog.clear()
    rows, warnings = scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path / "clean", [t["call"], t["answer"]])
    assert [row["broken_target_share"] for row in rows] == [0.0] * 6 and warnings == []
    caplog.clear()  # reverse KL is the setting the warning names: no warning however broken
    rows, warnings = scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path / "reverse", [t["broken"]],
                                  "loss.kl_direction=reverse_kl")
    assert [row["broken_target_share"] for row in rows] == [1.0] * 6 and warnings == []


def test_a_masked_run_counts_what_it_left_out_and_trains_on_the_rest(monkeypatch, caplog, tiny_pair, tiny_checkpoints,
                                                                    data, tmp_path, tokenizer):
    t = turns_of(tokenizer)
    rows, warnings = scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path / "mixed",
                                  [t["call_and_broken"], t["answer"]], "loss.mask_broken_turns=true")
    per_episode = len(t["call_and_broken"]), len(t["answer"])
    assert [row["masked_targets"] for row in rows] == [row["episodes"] * per_episode[0] for row in rows]
    assert [row["target_tokens"] for row in rows] == [row["episodes"] * per_episode[1] for row in rows]
    assert all(row["broken_target_share"] == pytest.approx(per_episode[0] / sum(per_episode)) for row in rows)
    assert all(row["grad_norm"] > 0 for row in rows) and warnings == []
    # every target broken and left out: each step moves the schedule and leaves the weights alone
    rows, _ = scripted_run(monkeypatch, caplog, tiny_pair, data, tmp_path / "all", [t["broken"]],
                           "loss.mask_broken_turns=true")
    assert [(row["target_tokens"], row["grad_norm"], row["loss"]) for row in rows] == [(0, 0.0, 0.0)] * 6
    assert all(row["masked_targets"] == row["episodes"] * len(t["broken"]) for row in rows)
    start, end = (torch.load(path, weights_only=True) for path in (tiny_checkpoints["student"],
                                                                   tmp_path / "all" / "agent_opd_64.pth"))
    assert start.keys() == end.keys() and all(torch.equal(start[key], end[key]) for key in start)
