"""Guided rollouts (opd.rollouts.guidance): neutral settings are plain OPD bit for bit, full teacher settings are the teacher's
own rollout, SKD stays inside the teacher's top-k, and provenance, coins and kept teacher logits are exact across
turns and tool observations."""

from __future__ import annotations

import pytest
import torch

from common.config_schema import ConfigError
from common.generation.sampler import TokenSampler
from opd.config import GuidanceConfig, RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import pack_episodes
from opd.rollouts.guidance import BehaviourPolicy, Guide, episode_seed, turn_share_at
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import logits_at_targets
from standins.scripted_sampler import ScriptedSampler
from tests.helpers.opd_support import TINY_TEACHER, agent_record, call_text, encode, tiny_model

LIMITS = RolloutConfig(max_turns=3, max_gen_len=24, max_total_len=4096, open_thinking=False)
SEEDS = [11, 12, 13, 14, 15]


def guidance(turn_share=None, token_mix=None, top_k=None, turn_share_final=None) -> GuidanceConfig:
    return GuidanceConfig(turn_share=turn_share, turn_share_final=turn_share_final, token_mix=token_mix, top_k=top_k)


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=1), tiny_model(TINY_TEACHER, seed=2)


@pytest.fixture(scope="module")
def chat_format(tokenizer):
    return ChatFormat(tokenizer)


@pytest.fixture(scope="module")
def records():
    return [agent_record(f"g.jsonl:{i}", question) for i, question in
            enumerate(["What is 2+3?", "Weather in Paris?", "Convert 3 km to miles.", "Hi", "Rate of USD to EUR?"])]


def rollout(models, chat_format, records, settings=None, *, writer="student", temperature=1.0, seed=3, limits=LIMITS):
    student, teacher = models
    sampler = TokenSampler(SamplingConfig(temperature=temperature), "cpu", seed)
    model = student if writer == "student" else teacher
    policy = BehaviourPolicy(teacher, settings, sampler, SEEDS[:len(records)]) if settings else None
    episodes = AgentRollout(model, chat_format, sampler, limits, teacher_model=writer == "teacher").run(records, policy)
    return episodes, sampler


def same_episodes(first, second) -> bool:
    return [(e.ids, [(t.start, t.end, t.observation_end) for t in e.turns], e.stop_reason) for e in first] == [
        (e.ids, [(t.start, t.end, t.observation_end) for t in e.turns], e.stop_reason) for e in second]


@pytest.mark.parametrize("settings", [guidance(token_mix=0.0), guidance(turn_share=0.0), guidance(top_k=6400)],
                         ids=["token_mix=0", "turn_share=0", "top_k=vocab"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_settings_that_never_let_the_teacher_write_are_plain_opd_bit_for_bit(models, chat_format, records, settings,
                                                                             temperature):
    plain, plain_sampler = rollout(models, chat_format, records, temperature=temperature)
    guided, guided_sampler = rollout(models, chat_format, records, settings, temperature=temperature)
    assert same_episodes(plain, guided)
    assert [e.logprobs for e in plain] == [e.logprobs for e in guided]  # the student's own log-probs, bit for bit
    assert torch.equal(plain_sampler.get_state(), guided_sampler.get_state())  # the same draws, nothing more
    assert all(e.teacher_tokens == 0 and len(e.teacher_written) == e.assistant_tokens for e in guided)
    assert all(e.teacher_logits is None for e in plain)
    assert all(e.teacher_logits.shape == (e.assistant_tokens, 6400) for e in guided)


@pytest.mark.parametrize("settings", [guidance(token_mix=1.0), guidance(turn_share=1.0)], ids=["token_mix=1", "turn_share=1"])
def test_settings_that_always_let_the_teacher_write_are_the_teachers_own_rollout(models, chat_format, records, settings):
    own, _ = rollout(models, chat_format, records, writer="teacher")
    guided, _ = rollout(models, chat_format, records, settings)
    assert same_episodes(own, guided)
    assert all(e.teacher_written == [True] * e.assistant_tokens for e in own + guided)
    plain, _ = rollout(models, chat_format, records)
    assert not same_episodes(plain, guided)  # the two models write different episodes


def teacher_target_logits(teacher, episodes, pad_token_id) -> torch.Tensor:
    """The teacher's fp32 logits at every target of the episodes, from one plain full forward."""
    with torch.no_grad():
        logits, _ = logits_at_targets(teacher, pack_episodes(episodes, pad_token_id))
    return logits


@pytest.mark.parametrize("top_k", [1, 5])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_speculative_kd_never_emits_a_token_outside_the_teachers_top_k(models, chat_format, records, top_k,
                                                                       temperature):
    episodes, _ = rollout(models, chat_format, records, guidance(top_k=top_k), temperature=temperature)
    logits = teacher_target_logits(models[1], episodes, chat_format.pad_token_id)
    generated = torch.tensor([token for e in episodes for turn in e.turns for token in e.ids[turn.start:turn.end]])
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1]
    chosen = logits.gather(1, generated[:, None])[:, 0]
    assert (chosen >= kth - 1e-5).all()
    if temperature == 1.0:  # a random student samples outside a random teacher's top k: the teacher replaced those
        assert any(flag for e in episodes for flag in e.teacher_written)
    if top_k == 1:  # inside the top 1 means the teacher's argmax, whoever proposed it
        assert torch.equal(generated, logits.argmax(dim=-1))


def test_token_mix_is_a_draw_from_the_mixture(models, chat_format):
    """With a token mixture of α = 0.3, the teacher writes about 30% of the tokens (many episodes)."""
    many = [agent_record(f"m.jsonl:{i}", f"Question {i}?") for i in range(40)]
    student, teacher = models
    sampler = TokenSampler(SamplingConfig(temperature=1.0), "cpu", 0)
    policy = BehaviourPolicy(teacher, guidance(token_mix=0.3), sampler, list(range(40)))
    episodes = AgentRollout(student, chat_format, sampler, RolloutConfig(1, 20, 4096, False)).run(many, policy)
    written = [flag for e in episodes for flag in e.teacher_written]
    share, n = sum(written) / len(written), len(written)
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5, (share, n)


def coin_draws(seed: int, count: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand((), generator=generator).item() for _ in range(count)]


@pytest.fixture(scope="module")
def tool_scripts(tokenizer):
    """Three records whose scripted turns call tools, so episodes cross observations (and one ends early)."""
    eos = [tokenizer.eos_token_id]

    def t(text: str) -> list[int]:
        return encode(tokenizer, text)

    calc = t(call_text("calculate_math", expression="2+3"))
    records = [agent_record("p.jsonl:1", "What is 2+3?"), agent_record("p.jsonl:2", "Keep calculating."),
               agent_record("p.jsonl:3", "Say nothing.")]
    scripts = {"p.jsonl:1": [t("Let me compute.") + calc + eos, t("It is 5.") + eos],
               "p.jsonl:2": [calc + eos, t("Again: ") + calc + eos, t("Done, 5.") + eos],
               "p.jsonl:3": [eos]}
    return records, scripts


@pytest.mark.parametrize("settings", [guidance(turn_share=0.5), guidance(token_mix=0.4)], ids=["turn_share", "token_mix"])
def test_provenance_and_kept_teacher_logits_are_exact_across_turns_and_observations(models, chat_format, tool_scripts,
                                                                                    settings):
    """Scripted turns (tool calls, observations, an immediate answer): who wrote each token is the policy's coin,
    drawn per turn (turn_share) or per token (token_mix) from the episode's own generator in order; the kept teacher
    logits equal a full teacher forward at exactly the generated positions, observations never among them."""
    records, scripts = tool_scripts
    student, teacher = models
    seeds = [1, 21, 2]  # their turn coins: student, teacher / teacher, student, teacher / student
    policy = BehaviourPolicy(teacher, settings, ScriptedSampler(scripts), seeds)
    # max_gen_len holds the longest scripted turn in either tokenizer (70 ids in the stand-in's bytes, fewer in MiniMind's)
    limits = RolloutConfig(max_turns=3, max_gen_len=128, max_total_len=4096, open_thinking=False)
    episodes = AgentRollout(student, chat_format, ScriptedSampler(scripts), limits).run(records, policy)
    assert [len(e.turns) for e in episodes] == [2, 3, 1] and all(e.stop_reason == "answer" for e in episodes)
    assert all(t.observation_end is not None for e in episodes for t in e.turns[:-1])  # observations between turns
    for episode, seed, record in zip(episodes, seeds, records, strict=True):
        assert [episode.turn_ids(i) for i in range(len(episode.turns))] == scripts[record.source]
        lengths = [len(turn) for turn in scripts[record.source]]
        if settings.turn_share is not None:
            coins = coin_draws(seed, len(lengths))
            expected = [flag for coin, length in zip(coins, lengths, strict=True) for flag in [coin < 0.5] * length]
        else:
            expected = [coin < 0.4 for coin in coin_draws(seed, sum(lengths))]
        assert episode.teacher_written == expected
    written = [flag for e in episodes for flag in e.teacher_written]
    assert 0 < sum(written) < len(written)
    kept = torch.cat([e.teacher_logits for e in episodes])
    torch.testing.assert_close(kept, teacher_target_logits(teacher, episodes, chat_format.pad_token_id),
                               rtol=1e-4, atol=1e-4)


def test_turn_share_decays_linearly_over_the_schedule():
    settings = guidance(turn_share=0.8, turn_share_final=0.0)
    assert [turn_share_at(settings, step, 5) for step in (1, 2, 3, 5, 9)] == pytest.approx([0.8, 0.6, 0.4, 0.0, 0.0])
    assert turn_share_at(guidance(turn_share=0.3), 7, 10) == pytest.approx(0.3)  # turn_share_final defaults to it
    assert turn_share_at(guidance(token_mix=0.2), 3, 10) is None


def test_episode_seeds_depend_on_step_micro_batch_and_position_only():
    seeds = {episode_seed(0, step, micro, position) for step in (1, 2) for micro in (0, 1) for position in (0, 1)}
    assert len(seeds) == 8 and episode_seed(0, 1, 0, 0) == episode_seed(0, 1, 0, 0) != episode_seed(1, 1, 0, 0)


def test_a_run_s_guide_seeds_each_episode_by_its_place_and_schedules_the_turn_share(models):
    sampler = TokenSampler(SamplingConfig(), "cpu", 0)
    guide = Guide(models[1], guidance(turn_share=0.8, turn_share_final=0.0), sampler, seed=5, schedule_steps=5)
    policy = guide.policy(step=3, micro_batch=1, positions=[2, 0])
    expected = [torch.Generator().manual_seed(episode_seed(5, 3, 1, position)) for position in (2, 0)]
    assert [torch.rand((), generator=g).item() for g in policy.generators] == [
        torch.rand((), generator=g).item() for g in expected]
    assert policy.turn_share == guide.turn_share(3) == pytest.approx(0.4) and policy.sampler is sampler


@pytest.mark.parametrize("values,message", [
    ({"turn_share": 0.5, "token_mix": 0.2}, "set at most one of guidance.turn_share, guidance.token_mix and guidance.top_k "
                                            "(got guidance.turn_share=0.5, guidance.token_mix=0.2)"),
    ({"token_mix": 0.1, "top_k": 4}, "(got guidance.token_mix=0.1, guidance.top_k=4)"),
    ({"token_mix": 1.5}, "guidance.token_mix must be null or in [0, 1], got 1.5"),
    ({"top_k": 0}, "guidance.top_k must be an integer >= 1 or null, got 0"),
    ({"turn_share_final": 0.0}, "guidance.turn_share_final must be null unless guidance.turn_share is set, got 0.0"),
])
def test_bad_guidance_settings_are_refused_naming_the_keys(values, message):
    with pytest.raises(ConfigError) as refused:
        guidance(**values)
    assert message in str(refused.value)
