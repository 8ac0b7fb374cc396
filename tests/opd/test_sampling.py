"""opd's sampling: the config's nulls, defaults and refusals, and samplers whose rows are episodes drawing from their
records' own generators."""

from __future__ import annotations

import pytest
import torch

from opd.config import SamplingConfig
from opd.episodes.episode import Episode
from opd.rollouts.sampling import record_sampler
from tests.helpers.opd_support import agent_record


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
    together = record_sampler(SamplingConfig(), "cpu", seeds)(logits, episodes).tolist()
    alone = [record_sampler(SamplingConfig(), "cpu", seeds)(logits[:1], [e]).item() for e in episodes]
    assert together == alone
    reseeded = {source: seed + 10 for source, seed in seeds.items()}
    assert record_sampler(SamplingConfig(), "cpu", reseeded)(logits, episodes).tolist() != together
