"""Choosing each row's next token: temperature / top-k / top-p / min-p sampling from seeded generators, one for the
batch (a resume file keeps its state) or one per row (``TokenSampler.per_row``: a row's tokens do not depend on its
batch-mates). A temperature below ``GREEDY_EPS`` is argmax; ``top_k`` 0 or -1, ``top_p`` 1 and ``min_p`` 0 are off.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

FLOAT32_MAX = torch.finfo(torch.float32).max
GREEDY_EPS = 1e-5  # vLLM's threshold: a smaller temperature means greedy decoding
DRAW_BLOCK = 64  # tokens per block of ``draw``'s two-level cumulative sum


def draw(probabilities: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Each row's token of ``probabilities`` (``[rows, vocab]``, non-negative, unnormalized) for its ``uniform``
    draw in [0, 1) (``[rows, 1]`` fp64): the first token whose cumulative mass exceeds ``uniform`` times the row's
    total, so a token of probability 0 is never drawn. Cumulative sums are fp64, blockwise in two levels."""
    rows, vocab = probabilities.shape
    blocks = -(-vocab // DRAW_BLOCK)
    padded = torch.nn.functional.pad(probabilities, (0, blocks * DRAW_BLOCK - vocab)).view(rows, blocks, DRAW_BLOCK)
    cumulative = padded.sum(-1, dtype=torch.float64).cumsum(-1)
    total = cumulative[:, -1:]
    if not bool(torch.isfinite(total).all()) or bool((total <= 0).any()):
        raise ValueError("sampling: a row's probabilities are not finite or sum to 0 (NaN or infinite logits?)")
    threshold = uniform * total  # uniform < 1 makes it < total in fp64 rounding: some block's cumulative mass exceeds it
    block = torch.searchsorted(cumulative, threshold, right=True)  # cumulative[block - 1] <= threshold < cumulative[block]
    before = torch.where(block > 0, cumulative.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(threshold))
    inside = padded.gather(1, block[:, :, None].expand(rows, 1, DRAW_BLOCK))[:, 0]
    token = torch.searchsorted(inside.cumsum(-1, dtype=torch.float64), threshold - before, right=True)
    # the block's mass is above 0; if rounding puts the rest past its own sum, its last token of mass above 0
    last = DRAW_BLOCK - 1 - (inside.flip(-1) > 0).to(torch.int8).argmax(-1, keepdim=True)
    return (block * DRAW_BLOCK + torch.minimum(token, last)).squeeze(1)


class SamplingSettings(Protocol):
    """What a ``TokenSampler`` reads from its settings (opd's ``SamplingConfig``, the server's ``SamplingParams``)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float


class TokenSampler:
    """Samples one token per row from filtered softmax probabilities, the batch from one generator seeded with
    ``seed`` (``per_row``: one each)."""

    def __init__(self, settings: SamplingSettings, device: torch.device | str, seed: int) -> None:
        self.settings = settings
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.row_generators: Mapping[Hashable, torch.Generator] | None = None
        self.row_key: Callable[[object], Hashable] = lambda row: row

    @classmethod
    def per_row(cls, settings: SamplingSettings, device: torch.device | str, seeds: Mapping[Hashable, int],
                key: Callable[[object], Hashable] = lambda row: row) -> TokenSampler:
        """A sampler whose row ``row`` draws from a generator seeded with ``seeds[key(row)]``."""
        sampler = cls(settings, device, 0)
        sampler.row_generators = {name: torch.Generator(device=device).manual_seed(seed) for name, seed in seeds.items()}
        sampler.row_key = key
        return sampler

    @property
    def greedy(self) -> bool:
        return self.settings.temperature < GREEDY_EPS

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution sampled from, ``[rows, vocab]`` fp32 (unnormalized after top-p / min-p cuts)."""
        s = self.settings
        # finite whatever the settings do to the logits (a penalty of 1e-40 divides them into infinity): the largest
        # logits stay the largest and tie, and softmax stays a distribution
        scaled = (logits.float() / s.temperature).clamp(-FLOAT32_MAX, FLOAT32_MAX)
        if 0 < s.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, s.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if s.top_p < 1:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            cut = mass_before >= s.top_p
            cut[:, 0] = False  # the most likely token always stays (a top_p that fp32 reads as 0, such as 1e-300)
            sorted_probs = sorted_probs.masked_fill(cut, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        if s.min_p > 0:
            probs = probs.masked_fill(probs < s.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        return probs

    def __call__(self, logits: torch.Tensor, rows: Sequence = ()) -> torch.Tensor:
        """The next token of each row of ``logits`` (``[rows, vocab]``); ``rows`` names the rows for ``per_row``."""
        if self.greedy:
            return logits.argmax(dim=-1)
        probabilities = self.probabilities(logits)
        device = probabilities.device
        if self.row_generators is None:
            uniform = torch.rand(len(probabilities), 1, generator=self.generator, dtype=torch.float64, device=device)
        else:
            uniform = torch.cat([torch.rand(1, 1, generator=self.row_generators[self.row_key(row)],
                                            dtype=torch.float64, device=device) for row in rows])
        return draw(probabilities, uniform)

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


@dataclass(frozen=True)
class Penalties:
    """vLLM's penalties: ``repetition`` scales the logits of every id seen (positive divided, negative multiplied),
    ``presence`` and ``frequency`` subtract for output ids (once; per occurrence)."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

    def apply(self, logits: torch.Tensor, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
        """One row's fp32 ``[1, vocab]`` logits with the penalties applied (a new tensor)."""
        vocab = logits.shape[-1]
        if (self.presence or self.frequency) and output_ids:
            counts = torch.bincount(torch.tensor(output_ids), minlength=vocab)[:vocab].to(logits.device)
            logits = logits - self.frequency * counts - self.presence * (counts > 0)
        if self.repetition != 1.0:
            seen = torch.tensor([prompt_ids + output_ids], dtype=torch.long, device=logits.device)
            scores = logits.gather(1, seen)
            scores = torch.where(scores < 0, scores * self.repetition, scores / self.repetition)
            logits = logits.scatter(1, seen, scores)
        return logits
