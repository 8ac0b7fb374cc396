"""Per-request sampling for the embedded server, with vLLM's parameter meanings.

Temperature 0 is greedy; ``top_k`` 0 or -1, ``top_p`` 1 and ``min_p`` 0 are off; ``repetition_penalty``
looks at prompt and output, ``presence_penalty``/``frequency_penalty`` at the output only. Every request
draws from its own ``torch.Generator`` (seeded by ``seed`` when given), so a seeded request gives the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

GREEDY_EPS = 1e-5  # vLLM's threshold: a smaller temperature means greedy decoding


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of generation (already validated)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


class TokenSampler:
    """Chooses one sequence's next token from its logits."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int]):
        self.params = params
        seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(63)
        self.generator = torch.Generator().manual_seed(seed)
        self.prompt_ids = prompt_ids
        warpers = []
        if params.repetition_penalty != 1.0:
            warpers.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if not params.greedy:
            if params.temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                warpers.append(TopPLogitsWarper(params.top_p))
            if params.min_p > 0.0:
                warpers.append(MinPLogitsWarper(params.min_p))
        self.warpers = LogitsProcessorList(warpers)

    @property
    def plain_greedy(self) -> bool:
        """True when the next token is just the argmax (the engine then picks it for the whole batch at once)."""
        return self.params.greedy and not self.params.penalized

    def choose(self, logits: torch.Tensor, output_ids: list[int]) -> int:
        """The next token for this sequence given its last-position ``logits`` (shape ``[vocab]``)."""
        scores = logits.float().unsqueeze(0)
        params = self.params
        if (params.presence_penalty or params.frequency_penalty) and output_ids:
            counts = torch.bincount(torch.tensor(output_ids), minlength=scores.shape[-1])[: scores.shape[-1]]
            scores = scores - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
        if self.warpers:
            seen = torch.tensor([self.prompt_ids + output_ids], dtype=torch.long)
            scores = self.warpers(seen, scores)
        if params.greedy:
            return int(scores.argmax(-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))
