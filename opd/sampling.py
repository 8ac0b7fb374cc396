"""Choosing the next token of each rollout row: seeded temperature / top-k / top-p / min-p sampling.

``TokenSampler`` samples the batch from one seeded ``torch.Generator`` (the training rollout), or each row
from its own record's generator (``TokenSampler.per_record``: cached teacher rollouts, whose episodes must
not depend on which records shared a batch; evaluation's k samples of a prompt, each seeded by ``sample_seed``). The
embedded server has its own per-request sampler
(``launch/sampling.py``): it follows vLLM's request semantics row by row (penalties, per-request seeds),
which a training rollout does not need.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import torch

from common.chat_records import AgentRecord
from opd.config import SamplingConfig
from opd.episodes import Episode


def derived_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (their ``str``, joined by ``:``, hashed with sha256): the same parts, the same seed."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def prompt_key(record: AgentRecord) -> str:
    """A sha256 of what the model is prompted with (the record's messages and tools, as canonical JSON): the same
    prompt has the same key in any file, at any line, beside any other records."""
    prompt = json.dumps([record.messages, record.tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(prompt.encode()).hexdigest()


def sample_seed(seed: int, record: AgentRecord, sample: int) -> int:
    """The seed of sample ``sample`` (0-based) of ``record`` in an evaluation sampling with ``seed``."""
    return derived_seed(seed, prompt_key(record), sample)


class TokenSampler:
    """Samples one token per row from filtered softmax probabilities (temperature 0: argmax)."""

    def __init__(self, settings: SamplingConfig, device: torch.device | str, seed: int) -> None:
        """``seed`` seeds the generator (callers resolve it: ``settings.seed_or(run_seed)``)."""
        self.settings = settings
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.record_generators: dict[str, torch.Generator] | None = None

    @classmethod
    def per_record(cls, settings: SamplingConfig, device: torch.device | str, seeds: Mapping[str, int]) -> TokenSampler:
        """A sampler whose row for record ``source`` draws from a generator seeded with ``seeds[source]``."""
        sampler = cls(settings, device, 0)
        sampler.record_generators = {source: torch.Generator(device=device).manual_seed(seed)
                                     for source, seed in seeds.items()}
        return sampler

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution sampled from, ``[rows, vocab]`` fp32 (unnormalized after top-p / min-p cuts)."""
        s = self.settings
        scaled = logits.float() / s.temperature
        if 0 < s.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, s.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if s.top_p < 1:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= s.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        if s.min_p > 0:
            probs = probs.masked_fill(probs < s.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        return probs

    def __call__(self, logits: torch.Tensor, episodes: list[Episode]) -> torch.Tensor:
        if self.settings.temperature == 0:
            return logits.argmax(dim=-1)
        probabilities = self.probabilities(logits)
        if self.record_generators is None:
            return torch.multinomial(probabilities, 1, generator=self.generator).squeeze(1)
        return torch.cat([torch.multinomial(probabilities[row:row + 1], 1,
                                            generator=self.record_generators[episode.record.source])[0]
                          for row, episode in enumerate(episodes)])

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
