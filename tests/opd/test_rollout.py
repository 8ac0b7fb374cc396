"""Batched multi-turn rollouts: scripted episodes against hand-built ids and target masks, limits, real sampling."""

from __future__ import annotations

import copy

import pytest
import torch

from common.generation.sampler import TokenSampler
from opd.config import RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat, PromptTooLongError
from opd.episodes.episode import (
    ANSWER,
    MAX_GEN_LEN,
    MAX_TOTAL_LEN,
    MAX_TURNS,
    MIN_SHARED_PREFIX,
    STOP_REASONS,
    pack_episodes,
    shared_prefix_length,
)
from opd.rollouts.rollout import AgentRollout
from standins.scripted_sampler import ScriptedSampler
from tests.helpers.opd_support import agent_record, call_text, encode, observation_text, tiny_model

LIMITS = RolloutConfig(max_turns=3, max_gen_len=200, max_total_len=4096, open_thinking=False)


@pytest.fixture(scope="module")
def student():
    return tiny_model(seed=1)


@pytest.fixture(scope="module")
def chat_format(tokenizer):
    return ChatFormat(tokenizer)


def prompt_ids(tokenizer, record) -> list[int]:
    text = tokenizer.apply_chat_template(record.messages, tools=record.tools, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text)


class Expected:
    """Hand-built ids and target mask: prompt, then generated turns (targets) and observations (context)."""

    def __init__(self, tokenizer, record):
        self.tokenizer = tokenizer
        self.ids = prompt_ids(tokenizer, record)
        self.mask = [False] * len(self.ids)

    def turn(self, ids: list[int]) -> Expected:
        self.ids += ids
        self.mask += [True] * len(ids)
        return self

    def observation(self, *contents: str) -> Expected:
        ids = encode(self.tokenizer, observation_text(*contents))
        self.ids += ids
        self.mask += [False] * len(ids)
        return self


def scripted(student, chat_format, scripts, limits=LIMITS):
    return AgentRollout(student, chat_format, ScriptedSampler(scripts), limits)


def test_scripted_episodes_match_hand_built_ids_and_masks(tokenizer, chat_format, student):
    eos = [tokenizer.eos_token_id]

    def t(text: str) -> list[int]:
        return encode(tokenizer, text)

    records = [agent_record("data.jsonl:1", "What is 2+3?"),
               agent_record("data.jsonl:2", "Time in Tokyo, and 1/0?", tools=["calculate_math", "get_current_time"]),
               agent_record("data.jsonl:3", "Keep calculating."),
               agent_record("data.jsonl:4", "Say nothing."),
               agent_record("data.jsonl:5", "Ramble.")]
    calc = t(call_text("calculate_math", expression="2+3"))
    two_calls = t(call_text("get_current_time", timezone="Asia/Tokyo") + "\n" + call_text("calculate_math", expression="1/0"))
    bad_calls = t("<tool_call>{bad json}</tool_call>" + call_text("get_current_weather", location="Oslo"))
    again = t(call_text("calculate_math", expression="1+1"))
    ramble = t(" and so on" * 80)[:250]
    scripts = {
        "data.jsonl:1": [t("Let me compute.") + calc + eos, t("It is 5.") + eos],
        "data.jsonl:2": [two_calls + eos, bad_calls + eos, t("Done.") + eos],
        "data.jsonl:3": [again + eos, again + eos, again + eos],
        "data.jsonl:4": [eos],
        "data.jsonl:5": [ramble],
    }
    episodes = scripted(student, chat_format, scripts).run(records)
    assert shared_prefix_length(episodes) >= MIN_SHARED_PREFIX  # the batch prefilled its common prompt prefix once

    a = Expected(tokenizer, records[0]).turn(scripts["data.jsonl:1"][0]).observation('{"result": "5"}').turn(
        scripts["data.jsonl:1"][1])
    b = (Expected(tokenizer, records[1]).turn(two_calls + eos)
         .observation('{"datetime": "2025-03-07 15:30:00", "timezone": "Asia/Tokyo"}',
                      '{"error": "unknown tool or invalid arguments"}')
         .turn(bad_calls + eos)
         .observation('{"error": "unknown tool or invalid arguments"}')  # "{bad json}" is not a call: no message
         .turn(t("Done.") + eos))
    c = (Expected(tokenizer, records[2]).turn(again + eos).observation('{"result": "2"}').turn(again + eos)
         .observation('{"result": "2"}').turn(again + eos))
    d = Expected(tokenizer, records[3]).turn(eos)
    e = Expected(tokenizer, records[4]).turn(ramble[:LIMITS.max_gen_len])
    for episode, expected in zip(episodes, (a, b, c, d, e), strict=True):
        assert episode.ids == expected.ids, episode.record.source
        assert episode.target_mask() == expected.mask, episode.record.source
        assert len(episode.logprobs) == sum(expected.mask) == episode.assistant_tokens
    assert [ep.stop_reason for ep in episodes] == [ANSWER, ANSWER, MAX_TURNS, ANSWER, MAX_GEN_LEN]
    assert [len(ep.turns) for ep in episodes] == [2, 3, 3, 1, 1]
    assert [ep.tool_calls for ep in episodes] == [1, 4, 3, 0, 0]
    assert [ep.tool_errors for ep in episodes] == [0, 3, 0, 0, 0]
    assert [[c.status for c in turn.calls] for turn in episodes[1].turns] == [
        ["ok", "tool_error"], ["not_a_call", "undeclared"], []]
    assert [c.executed for turn in episodes[2].turns for c in turn.calls] == [True, True, False]
    assert episodes[0].turn_ids(1) == t("It is 5.") + eos

    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    width = packed.input_ids.shape[1]
    for row, expected in enumerate((a, b, c, d, e)):
        padding = width - len(expected.ids)
        assert packed.target_mask[row].tolist() == expected.mask[1:] + [False] * padding
        assert packed.attention_mask[row].tolist() == [1] * len(expected.ids) + [0] * padding
        assert packed.input_ids[row].tolist() == expected.ids + [tokenizer.pad_token_id] * padding

    # the carried cache computes what a fresh forward over the packed sequence computes
    with torch.no_grad():
        logprobs = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1].log_softmax(-1)
    for row, episode in enumerate(episodes):
        targets = packed.input_ids[row, 1:][packed.target_mask[row]]
        expected_logprobs = logprobs[row][packed.target_mask[row]].gather(1, targets[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(episode.logprobs), expected_logprobs, atol=1e-4, rtol=0)

    # rolled out one at a time, each episode is the same
    for record, episode in zip(records, episodes, strict=True):
        assert scripted(student, chat_format, scripts).run([record])[0].ids == episode.ids


def test_context_limits_keep_targets_and_never_truncate_the_prompt(tokenizer, chat_format, student):
    record = agent_record("limits.jsonl:7", "What is 2+3?")
    prompt = len(prompt_ids(tokenizer, record))
    eos = [tokenizer.eos_token_id]
    turn = encode(tokenizer, call_text("calculate_math", expression="2+3")) + eos
    observation = encode(tokenizer, observation_text('{"result": "5"}'))
    scripts = {record.source: [turn, encode(tokenizer, "It is five.") + eos]}

    def run(max_total_len):
        return scripted(student, chat_format, scripts, RolloutConfig(3, 120, max_total_len, open_thinking=False)).run([record])[0]

    full = run(prompt + 10)  # the context fills up mid-turn
    assert full.stop_reason == MAX_TOTAL_LEN and len(full.ids) == prompt + 10
    assert full.ids[:prompt] == prompt_ids(tokenizer, record) and full.target_mask() == [False] * prompt + [True] * 10

    no_room = run(prompt + len(turn) + len(observation))  # the observation would leave no room to generate
    assert no_room.stop_reason == MAX_TOTAL_LEN and len(no_room.ids) == prompt + len(turn)
    assert [c.status for c in no_room.turns[0].calls] == ["ok"] and no_room.turns[0].observation_end is None

    one_more = run(prompt + len(turn) + len(observation) + 1)  # room for exactly one token of turn 2
    assert one_more.stop_reason == MAX_TOTAL_LEN and len(one_more.turns) == 2
    assert one_more.turn_ids(1) == scripts[record.source][1][:1]
    assert one_more.target_mask() == [False] * prompt + [True] * len(turn) + [False] * len(observation) + [True]

    for limit in (prompt, prompt - 1):
        with pytest.raises(PromptTooLongError, match=f"limits.jsonl:7: prompt is {prompt} tokens"):
            run(limit)


def test_observation_context_follows_the_template_not_hard_coded_strings(tokenizer):
    variant = copy.deepcopy(tokenizer)
    variant.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    record = agent_record("v.jsonl:1", "q")
    ids = ChatFormat(variant).observation_ids(record, ['{"result": 5}', '{"x": 1}'])
    assert ids == encode(tokenizer, '\n<|im_start|>tool\n{"result": 5}<|im_end|>\n<|im_start|>tool\n{"x": 1}<|im_end|>\n'
                                    '<|im_start|>assistant\n')
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{%- for m in messages -%}{{ m.role }}: {{ m.content }}\n{%- endfor -%}"
    with pytest.raises(ValueError, match="does not end an assistant turn with the EOS token"):
        ChatFormat(broken)


def test_greedy_batched_rollout_equals_one_episode_at_a_time(chat_format, student):
    records = [agent_record(f"g.jsonl:{i}", question) for i, question in
               enumerate(["Hi", "What is the exchange rate of the euro today, please?", "2+2"])]
    greedy = TokenSampler(SamplingConfig(temperature=0.0), "cpu", seed=0)
    rollout = AgentRollout(student, chat_format, greedy, RolloutConfig(2, 12, 4096, open_thinking=False))
    batched = rollout.run(records)
    assert [episode.ids for episode in batched] == [rollout.run([record])[0].ids for record in records]


def test_sampled_rollout_end_to_end(tokenizer, chat_format, student):
    records = [agent_record(f"s.jsonl:{i}", f"Question {i}?") for i in range(4)]

    def sample(seed):
        sampler = TokenSampler(SamplingConfig(temperature=1.0, top_p=0.95, top_k=50), "cpu", seed=seed)
        return AgentRollout(student, chat_format, sampler, RolloutConfig(2, 16, 4096, open_thinking=False)).run(records)

    first, again, other = sample(7), sample(7), sample(8)
    assert [e.ids for e in first] == [e.ids for e in again]
    assert [e.ids for e in first] != [e.ids for e in other]
    packed = pack_episodes(first, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1].log_softmax(-1)
    for row, episode in enumerate(first):
        assert episode.ids[:episode.prompt_length] == prompt_ids(tokenizer, episode.record)
        assert 1 <= episode.assistant_tokens == sum(episode.target_mask()) <= 2 * 16
        assert episode.stop_reason in STOP_REASONS
        generated = [i for turn in episode.turns for i in range(turn.start, turn.end)]
        assert generated == [i for i, flag in enumerate(episode.target_mask()) if flag]
        targets = packed.input_ids[row, 1:][packed.target_mask[row]]
        expected = logprobs[row][packed.target_mask[row]].gather(1, targets[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(episode.logprobs), expected, atol=1e-4, rtol=0)


def test_sampled_logits_are_fp32_under_bfloat16_autocast(chat_format, student):
    """The body may run in bf16, but the output projection the sampler sees (and the kept log-probs) is fp32."""
    sampled, dtypes = [], {"lm_head": set(), "body": set()}

    def greedy(logits, episodes):
        sampled.append(logits)
        return logits.argmax(dim=-1)

    hooks = [student.lm_head.register_forward_hook(lambda m, i, output: dtypes["lm_head"].add(output.dtype)),
             student.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, output: dtypes["body"].add(output.dtype))]
    try:
        episode = AgentRollout(student, chat_format, greedy, RolloutConfig(1, 6, 4096, open_thinking=False),
                               autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)).run(
            [agent_record("bf16.jsonl:1", "What is 2+3?")])[0]
    finally:
        for hook in hooks:
            hook.remove()
    assert dtypes == {"lm_head": {torch.float32}, "body": {torch.bfloat16}}
    assert len(sampled) == episode.assistant_tokens and all(logits.dtype == torch.float32 for logits in sampled)
    expected = [torch.log_softmax(logits[0], -1)[token].item()
                for logits, token in zip(sampled, episode.ids[episode.prompt_length:], strict=True)]
    assert episode.logprobs == pytest.approx(expected, abs=1e-6)
