"""Choosing the next token of each rollout row: seeded temperature / top-k / top-p / min-p sampling, or a script.

The ``sampling`` config group carries more keys than a local rollout implements (it is shared with the
vLLM job). Null means "not set": temperature 1, top_p 1, top_k 0 (off) and min_p 0 then apply, i.e. the
model's own distribution. A non-null penalty key is refused by name rather than silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from opd.episodes import Episode

UNIMPLEMENTED_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True)
class SamplingSettings:
    """Rollout sampling parameters; temperature 0 means greedy (argmax)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    @classmethod
    def from_config(cls, block: Mapping) -> SamplingSettings:
        """Read a ``sampling`` group block; refuses keys the rollout does not implement and invalid values."""
        refused = [key for key in UNIMPLEMENTED_KEYS if block.get(key) is not None]
        if refused:
            raise ValueError(
                f"sampling.{', sampling.'.join(refused)} not implemented by the OPD rollout; set "
                f"{'them' if len(refused) > 1 else 'it'} to null (implemented: temperature, top_p, top_k, min_p, seed)")
        defaults = cls()
        settings = cls(**{key: defaults.__dict__[key] if block.get(key) is None else block[key]
                          for key in ("temperature", "top_p", "top_k", "min_p", "seed")})
        settings.validate()
        return settings

    def validate(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"sampling.top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling.min_p must be in [0, 1], got {self.min_p}")


class TokenSampler:
    """Samples one token per row from filtered softmax probabilities with its own seeded ``torch.Generator``."""

    def __init__(self, settings: SamplingSettings, device: torch.device | str, seed: int) -> None:
        self.settings = settings
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(settings.seed if settings.seed is not None else seed)

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
        return torch.multinomial(self.probabilities(logits), 1, generator=self.generator).squeeze(1)

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


class ScriptedSampler:
    """Emits fixed turns instead of sampling: ``scripts[record.source]`` lists each turn's generated ids.

    The model still runs its forward on every step, so tests can force exact episode shapes and the
    benchmark can time real compute with fixed turn lengths.
    """

    def __init__(self, scripts: Mapping[str, list[list[int]]]) -> None:
        self.scripts = scripts

    def __call__(self, logits: torch.Tensor, episodes: list[Episode]) -> torch.Tensor:
        tokens = []
        for episode in episodes:
            turn_index, turn = len(episode.turns) - 1, episode.turns[-1]
            position = turn.end - turn.start
            script = self.scripts[episode.record.source]
            if turn_index >= len(script) or position >= len(script[turn_index]):
                raise ValueError(f"{episode.record.source}: the script has no token for turn {turn_index} "
                                 f"position {position}")
            tokens.append(script[turn_index][position])
        return torch.tensor(tokens, dtype=torch.long, device=logits.device)
