"""The behaviour policy of a guided rollout: which model writes each token (``guidance``: ``turn_share``,
``token_mix``, ``top_k``; see ``opd/README.md``).

The teacher decodes beside the student on its own KV cache, fed the same ids. Tokens come from the rollout's own
sampler in a plain rollout's order, so a setting that never lets the teacher write gives the plain episodes bit for
bit; the policy's own draws use a per-episode generator (``episode_seed``), independent of rank and batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.generation.sampler import TokenSampler, draw
from opd.config import GuidanceConfig
from opd.rollouts.sampling import derived_seed


def episode_seed(seed: int, step: int, micro_batch: int, position: int) -> int:
    """A 63-bit seed for the guidance draws of one episode: step ``step``, micro-batch ``micro_batch`` of its window,
    ``position`` in the global micro-batch."""
    return derived_seed("guidance", seed, step, micro_batch, position)


def turn_share_at(settings: GuidanceConfig, step: int, schedule_steps: int) -> float | None:
    """The Guided-OPD turn share of optimizer step ``step`` (1-based): ``turn_share`` at step 1, ``turn_share_final``
    at ``schedule_steps`` and beyond, linear in between; None when ``turn_share`` is off."""
    start, final = settings.turn_share, settings.turn_share_final
    if start is None:
        return None
    progress = min(max(step - 1, 0) / max(schedule_steps - 1, 1), 1.0)
    return start + (final - start) * progress


class BehaviourPolicy:
    """Chooses each generated token of one rollout call from both models' logits; ``seeds``: one per record of the
    call, in order."""

    def __init__(self, teacher: torch.nn.Module, settings: GuidanceConfig, sampler, seeds: list[int], *,
                 turn_share: float | None = None) -> None:
        if not settings.active:
            raise ValueError("a BehaviourPolicy needs one of guidance.turn_share, token_mix or top_k")
        self.teacher, self.settings, self.sampler = teacher, settings, sampler
        self.turn_share = settings.turn_share if turn_share is None else turn_share
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def _uniform(self, episode: int) -> float:
        return torch.rand((), generator=self.generators[episode]).item()

    def teacher_writes_turn(self, episode: int) -> bool:
        """Drawn when a turn of episode ``episode`` starts: whether the teacher writes all of it (``turn_share``)."""
        return self.settings.turn_share is not None and self._uniform(episode) < self.turn_share

    def choose(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, episodes: list,
               indices: list[int], teacher_turns: list[bool]) -> tuple[torch.Tensor, list[bool]]:
        """The next token of each decoding row and whether the teacher wrote it, from both models' fp32
        ``[rows, vocab]`` logits; ``indices`` are the rows' record positions in this call."""
        settings = self.settings
        if settings.top_k is not None:
            return self._speculative(student_logits, teacher_logits, episodes, indices)
        if settings.token_mix is not None:
            by_teacher = [self._uniform(index) < settings.token_mix for index in indices]
        else:
            by_teacher = list(teacher_turns)
        pick = torch.tensor(by_teacher, device=student_logits.device)[:, None]
        return self.sampler(torch.where(pick, teacher_logits, student_logits), episodes), by_teacher

    def _speculative(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, episodes: list,
                     indices: list[int]) -> tuple[torch.Tensor, list[bool]]:
        proposals = self.sampler(student_logits, episodes)
        k = min(self.settings.top_k, teacher_logits.shape[-1])
        top_logits, top_ids = torch.topk(teacher_logits, k, dim=-1)
        proposed = teacher_logits.gather(1, proposals[:, None])[:, 0]
        rejected = (proposed < top_logits[:, -1]).tolist()
        if not any(rejected):
            return proposals, rejected
        rows = [row for row, out in enumerate(rejected) if out]
        if self.sampler.settings.temperature == 0:
            replacements = top_ids[rows, 0].tolist()
        else:  # the sampler's own distribution (temperature, top-p, min-p) over the teacher's top k, renormalized
            restricted = torch.full_like(teacher_logits[rows], float("-inf")).scatter(1, top_ids[rows], top_logits[rows])
            weights = self.sampler.probabilities(restricted).gather(1, top_ids[rows]).cpu()
            uniform = torch.tensor([[self._uniform(indices[row])] for row in rows], dtype=torch.float64)
            replacements = top_ids[rows].cpu().gather(1, draw(weights, uniform)[:, None])[:, 0].tolist()
        tokens = proposals.clone()
        tokens[rows] = torch.tensor(replacements, device=tokens.device)
        return tokens, rejected


@dataclass(frozen=True)
class Guide:
    """The behaviour policy of every guided rollout of a run (:meth:`policy` gives one call's)."""

    teacher: torch.nn.Module
    settings: GuidanceConfig
    sampler: TokenSampler
    seed: int
    schedule_steps: int

    def policy(self, step: int, micro_batch: int, positions: list[int]) -> BehaviourPolicy:
        """The policy of one rollout call: micro-batch ``micro_batch`` of step ``step``, the episodes at
        ``positions`` of the global micro-batch."""
        return BehaviourPolicy(self.teacher, self.settings, self.sampler,
                               [episode_seed(self.seed, step, micro_batch, position) for position in positions],
                               turn_share=self.turn_share(step))

    def turn_share(self, step: int) -> float | None:
        """The Guided-OPD turn share of step ``step`` (``turn_share_at``)."""
        return turn_share_at(self.settings, step, self.schedule_steps)
