"""Token sampling for rollouts: filtered distributions against hand calculation, per-record seeds, config nulls."""

from __future__ import annotations

import pytest
import torch

from opd.config import SamplingConfig
from opd.episodes import Episode
from opd.sampling import TokenSampler
from tests.helpers.opd_support import agent_record


def test_sampling_distribution_against_hand_calculation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    base = torch.softmax(logits / 2, dim=-1)[0].tolist()  # temperature 2

    def probs(**options):
        return TokenSampler(SamplingConfig(**options), "cpu", seed=0).probabilities(logits)[0]

    torch.testing.assert_close(probs(temperature=2.0), torch.tensor(base))
    top2 = torch.tensor([base[0], base[1], 0, 0]) / (base[0] + base[1])
    torch.testing.assert_close(probs(temperature=2.0, top_k=2), top2)
    # top_p keeps the smallest prefix whose mass reaches top_p: base[0] < 0.5 <= base[0] + base[1]
    assert base[0] < 0.5 <= base[0] + base[1]
    torch.testing.assert_close(probs(temperature=2.0, top_p=0.5), torch.tensor([base[0], base[1], 0, 0]))
    torch.testing.assert_close(probs(temperature=2.0, min_p=base[2] / base[0] + 1e-6),
                               torch.tensor([base[0], base[1], 0, 0]))
    sampler = TokenSampler(SamplingConfig(temperature=2.0, top_k=2), "cpu", seed=0)
    drawn = torch.cat([sampler(logits.expand(500, 4), []) for _ in range(4)])
    assert set(drawn.tolist()) == {0, 1} and 0.55 < (drawn == 0).float().mean() < 0.70  # p0 = 0.6225
    assert TokenSampler(SamplingConfig(temperature=0.0), "cpu", 0)(torch.tensor([[0.1, 3.0, 2.0]]), []).tolist() == [1]


def test_sampling_config_nulls_defaults_and_refusals():
    assert SamplingConfig() == SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None)
    assert SamplingConfig(temperature=0.6, top_k=20, seed=3) == SamplingConfig(0.6, 1.0, 20, 0.0, seed=3)
    with pytest.raises(ValueError, match=r"sampling\.repetition_penalty, sampling\.frequency_penalty: not implemented"):
        SamplingConfig(repetition_penalty=1.1, frequency_penalty=0.0)
    for bad, message in (({"top_p": 0.0}, "sampling.top_p must be in"), ({"top_k": -1}, "sampling.top_k must be"),
                         ({"temperature": -1.0}, "sampling.temperature must be"), ({"min_p": 2.0}, "sampling.min_p")):
        with pytest.raises(ValueError, match=message):
            SamplingConfig(**bad)


def test_per_record_generators_make_a_row_independent_of_its_batch():
    logits = torch.zeros(3, 50)
    records = [agent_record(f"r.jsonl:{i}", "q") for i in range(3)]
    episodes = [Episode(record, 1, [0]) for record in records]
    seeds = {"r.jsonl:0": 11, "r.jsonl:1": 12, "r.jsonl:2": 13}
    together = TokenSampler.per_record(SamplingConfig(), "cpu", seeds)(logits, episodes).tolist()
    alone = [TokenSampler.per_record(SamplingConfig(), "cpu", seeds)(logits[:1], [e]).item() for e in episodes]
    assert together == alone
    reseeded = {source: seed + 10 for source, seed in seeds.items()}
    assert TokenSampler.per_record(SamplingConfig(), "cpu", reseeded)(logits, episodes).tolist() != together
