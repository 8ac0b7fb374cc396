"""The behaviour policy of a guided rollout: which model writes each token of an on-policy episode.

Plain on-policy distillation samples every token from the student. A guided rollout (``opd.rollouts.rollout.AgentRollout``
given a ``BehaviourPolicy``) runs the frozen teacher in the same batched decode loop, on its own KV cache and fed
exactly the ids the student is fed, and lets it steer by one of three rules (``configs/opd.yaml`` ``guidance``):

- ``turn_share`` (Guided-OPD): when an assistant turn starts, with probability ``turn_share`` the teacher writes
  the whole turn (sampled with the run's ``sampling``); the student writes the others and continues after the
  teacher's turns. ``turn_share_final`` moves the share linearly over the schedule (``turn_share_at``).
- ``token_mix`` α (MiniLLM): every token is sampled from ``α·p_teacher + (1 - α)·p_student``, both at the sampling
  temperature: a coin that picks the teacher with probability α chooses the writer, and the token is sampled from
  the writer's distribution, which is a draw from the mixture.
- ``top_k`` (Speculative KD): the student proposes each token; a proposal that is not among the teacher's
  ``top_k`` most likely tokens (ties at the k-th logit count as inside) is replaced by a sample of the teacher's
  distribution restricted to its top ``top_k``.

Randomness. A token drawn from the writer's distribution comes from the rollout's own sampler, in the order a plain
rollout draws: a setting that never lets the teacher write (``token_mix=0``, ``turn_share=0``, ``top_k`` = the
vocabulary) gives the plain rollout's episodes bit for bit, and one that always does (``token_mix=1``,
``turn_share=1``) gives the teacher's own rollout. The policy's own draws (coins, SKD's replacements) come from one
CPU generator per episode, seeded by the caller (``episode_seed``: the run seed, the step, the micro-batch and the
episode's place in the global micro-batch), so they depend neither on which rank rolls the episode out nor on which
episodes share its batch, and a resumed run redraws them without any saved state.
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
    """Chooses each generated token of one rollout call from the student's and the teacher's logits.

    ``seeds`` holds one seed per record of the call, in order; ``turn_share`` is this call's share (``turn_share_at``).
    """

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
        """The next token of each decoding row and whether the teacher wrote it.

        ``student_logits``/``teacher_logits`` are the rows' fp32 ``[rows, vocab]`` logits, ``episodes`` the rows'
        episodes (for the sampler), ``indices`` each row's record position in this call, ``teacher_turns`` whether
        the row's current turn is the teacher's (``teacher_writes_turn``).
        """
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
    """The behaviour policy of every guided rollout of a run: the teacher steers as ``settings`` say, its draws seeded
    per episode by (run seed, step, micro-batch, place in the global micro-batch)."""

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
