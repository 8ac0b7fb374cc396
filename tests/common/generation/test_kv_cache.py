"""The in-place decode cache holds what transformers' concatenating cache holds, through growth, rows leaving,
leading columns cut and rows joining, and rollouts on it are unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import common.generation.decode_batch
from common.generation.kv_cache import MIN_CAPACITY, GrowingKVLayer, decode_cache
from common.generation.sampler import TokenSampler
from opd.config import RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.rollouts.rollout import AgentRollout
from tests.helpers.opd_support import agent_record, tiny_model


class ConcatenatingLayer(DynamicLayer):
    """transformers' concatenating layer, with the two operations ``GrowingKVLayer`` adds done the plain way."""

    def drop_leading_columns(self, columns: int) -> None:
        self.keys, self.values = self.keys[..., columns:, :], self.values[..., columns:, :]

    def extend_rows(self, other: DynamicLayer) -> None:
        width = max(self.keys.shape[-2], other.keys.shape[-2])

        def stacked(mine, theirs):
            return torch.cat([F.pad(t, (0, 0, width - t.shape[-2], 0)) for t in (mine, theirs)])

        self.keys, self.values = stacked(self.keys, other.keys), stacked(self.values, other.values)


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


@pytest.mark.parametrize("longer", ["mine", "theirs"])
def test_leading_columns_cut_and_rows_joining_equal_the_plain_operations(longer):
    generator = torch.Generator().manual_seed(1)
    growing, reference = GrowingKVLayer(), ConcatenatingLayer()
    joining, joining_reference = GrowingKVLayer(), ConcatenatingLayer()
    mine, theirs = (30, 12) if longer == "mine" else (12, 30)
    for layers, rows, columns in (((growing, reference), 3, mine), ((joining, joining_reference), 2, theirs)):
        states = _states(generator, rows, columns)
        for layer in layers:
            layer.update(*states)
    for layer in (growing, reference):
        layer.drop_leading_columns(5)
    growing.extend_rows(joining)
    reference.extend_rows(joining_reference)
    assert torch.equal(growing.keys, reference.keys) and torch.equal(growing.values, reference.values)
    assert growing.get_seq_length() == max(mine - 5, theirs)
    for columns in (1, 1, MIN_CAPACITY):  # appending after a join, past the joined buffer's capacity too
        new = _states(generator, 5, columns)
        keys, values = growing.update(*new)
        expected_keys, expected_values = reference.update(*new)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_decode_cache_replaces_every_layer_and_refuses_sliding_windows():
    model = tiny_model(seed=3)
    cache = decode_cache(model.config)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(type(layer) is GrowingKVLayer for layer in cache.layers)
    sliding = model.config.__class__(**{**model.config.to_dict(), "use_sliding_window": True, "sliding_window": 16,
                                        "max_window_layers": 0, "layer_types": None})
    with pytest.raises(ValueError, match="full-attention"):
        decode_cache(sliding)


def concatenating_cache(config) -> DynamicCache:
    cache = DynamicCache(config=config)
    cache.layers = [ConcatenatingLayer() for _ in cache.layers]
    return cache


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
    monkeypatch.setattr(common.generation.decode_batch, "decode_cache", concatenating_cache)
    concatenating = run()
    assert len({len(episode.ids) for episode in growing}) > 1  # rows leave the batch at different steps
    assert [e.ids for e in growing] == [e.ids for e in concatenating]
    assert [e.logprobs for e in growing] == [e.logprobs for e in concatenating]
    assert [e.stop_reason for e in growing] == [e.stop_reason for e in concatenating]
