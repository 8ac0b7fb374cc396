"""The in-place decode cache holds what transformers' concatenating cache holds, and rollouts on it are unchanged."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import opd.rollout
from opd.chat_format import ChatFormat
from opd.config import RolloutConfig, SamplingConfig
from opd.decode_cache import MIN_CAPACITY, GrowingKVLayer, decode_cache
from opd.rollout import AgentRollout
from opd.sampling import TokenSampler
from tests.helpers.opd_support import agent_record, tiny_model


def _states(generator, rows, columns):
    return (torch.randn(rows, 2, columns, 8, generator=generator), torch.randn(rows, 2, columns, 8, generator=generator))


def test_growing_layer_equals_concatenation_through_growth_repeat_and_select():
    generator = torch.Generator().manual_seed(0)
    growing, reference = GrowingKVLayer(), DynamicLayer()
    prefix = _states(generator, 1, 40)
    for layer in (growing, reference):
        layer.update(*prefix)
        layer.batch_repeat_interleave(4)
    steps = [7, 1, 1, 3, MIN_CAPACITY, 1, 200, 1]  # crosses the first and the second reallocation
    for index, columns in enumerate(steps):
        new = _states(generator, growing.keys.shape[0], columns)
        keys, values = growing.update(*new)
        expected_keys, expected_values = reference.update(*new)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        assert growing.get_seq_length() == reference.get_seq_length() == 40 + sum(steps[:index + 1])
        if index == 3:  # a row finishes: both caches keep rows 0, 2, 3
            kept = torch.tensor([0, 2, 3])
            growing.batch_select_indices(kept)
            reference.batch_select_indices(kept)
    # the 256-column block grew the buffer to exactly 308 columns; the next column doubled it, and 200 more fit
    assert growing._key_buffer.shape[-2] == 2 * (40 + sum(steps[:5])) == 616


def test_decode_cache_replaces_every_layer_and_refuses_sliding_windows():
    model = tiny_model(seed=3)
    cache = decode_cache(model.config)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(type(layer) is GrowingKVLayer for layer in cache.layers)
    sliding = model.config.__class__(**{**model.config.to_dict(), "use_sliding_window": True, "sliding_window": 16,
                                        "max_window_layers": 0, "layer_types": None})
    with pytest.raises(ValueError, match="full-attention"):
        decode_cache(sliding)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollouts_on_the_decode_cache_equal_rollouts_on_dynamic_cache(tokenizer, monkeypatch, temperature):
    """Same ids and bit-identical log-probs over multi-turn episodes with a shared prefix and early finishers."""
    student = tiny_model(seed=1)
    records = [agent_record(f"c.jsonl:{i}", question) for i, question in
               enumerate(["Hi", "What is the exchange rate of the euro today, please?", "2+2", "Weather in Paris?"])]

    def run():
        sampler = TokenSampler(SamplingConfig(temperature=temperature), "cpu", seed=5)
        return AgentRollout(student, ChatFormat(tokenizer), sampler, RolloutConfig(3, 40, 4096, open_thinking=False)
                            ).run(records)

    growing = run()
    monkeypatch.setattr(opd.rollout, "decode_cache", lambda config: DynamicCache(config=config))
    concatenating = run()
    assert len({len(episode.ids) for episode in growing}) > 1  # rows leave the batch at different steps
    assert [e.ids for e in growing] == [e.ids for e in concatenating]
    assert [e.logprobs for e in growing] == [e.logprobs for e in concatenating]
    assert [e.stop_reason for e in growing] == [e.stop_reason for e in concatenating]
