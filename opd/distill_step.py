"""One optimizer update of the student from finished episodes: frozen-teacher targets, KL loss, clipped step.

The loss of an update is the mean over every target token of the whole accumulation window (micro-batches
are weighted by their share of target tokens), so ``batch_size=2, accumulation_steps=1`` and
``batch_size=1, accumulation_steps=2`` give the same gradient. A MoE student adds its router load-balancing
loss times ``router_aux_loss_coef``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opd.device_setup import Precision
from opd.distill_loss import token_kl
from opd.episodes import Episode, PackedBatch, pack_episodes
from opd.shared_prefix import cache_argument, prefill_shared_prefix, shared_prefix_length


@dataclass(frozen=True)
class DistillSettings:
    """Loss and update settings."""

    temperature: float = 1.0
    direction: str = "forward_kl"
    grad_clip: float | None = 1.0


@dataclass(frozen=True)
class UpdateStats:
    """Figures of one optimizer update."""

    loss: float  # kl + aux_loss
    kl: float  # mean T²-scaled KL per target token
    aux_loss: float  # weighted router aux loss (0 for dense students)
    grad_norm: float  # before clipping
    target_tokens: int


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Put a teacher in eval mode with every parameter excluded from autograd."""
    return model.eval().requires_grad_(False)


def router_aux_coef(model: torch.nn.Module) -> float | None:
    """The router aux-loss weight of a MoE model, None for a dense one."""
    config = model.config
    return getattr(config, "router_aux_loss_coef", None) if getattr(config, "num_experts", None) else None


def target_positions(batch: PackedBatch) -> torch.Tensor:
    """Positions whose logits some row trains: only these go through the vocabulary projection."""
    return batch.target_mask.any(dim=0).nonzero().squeeze(1)


def forward_targets(model: torch.nn.Module, batch: PackedBatch, prefix: int = 0, **extra):
    """The model output with logits only where some row trains, and those logits at the targets ``[targets, vocab]``.

    With ``prefix`` > 0 the first ``prefix`` ids (identical in every row, before any target) run once.
    """
    positions = target_positions(batch)
    if not prefix:
        output = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions,
                       **extra)
    else:
        rows, length = batch.input_ids.shape
        cache = prefill_shared_prefix(model, batch.input_ids[0, :prefix].tolist(), rows)
        suffix_positions = torch.arange(prefix, length, device=batch.input_ids.device).expand(rows, -1)
        output = model(input_ids=batch.input_ids[:, prefix:], attention_mask=batch.attention_mask,
                       position_ids=suffix_positions, use_cache=True, logits_to_keep=positions - prefix,
                       **{cache_argument(model): cache}, **extra)
    return output.logits[batch.target_mask[:, positions]], output


def teacher_target_logits(teacher: torch.nn.Module, batch: PackedBatch, precision: Precision,
                          prefix: int = 0) -> torch.Tensor:
    """Teacher logits at the target positions, ``[targets, vocab]``, without autograd."""
    with torch.no_grad(), precision.autocast():
        return forward_targets(teacher, batch, prefix)[0]


def distill_update(micro_batches: list[list[Episode]], *, student: torch.nn.Module, teacher: torch.nn.Module,
                   optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler,
                   settings: DistillSettings, precision: Precision, pad_token_id: int) -> UpdateStats:
    """Accumulate the window's gradient over its micro-batches, clip, step optimizer and scheduler."""
    packed = [pack_episodes(episodes, pad_token_id) for episodes in micro_batches]
    total = sum(batch.target_count for batch in packed)
    if total == 0:
        raise ValueError("the update window holds no target tokens")
    aux_coef = router_aux_coef(student)
    parameters = [p for p in student.parameters() if p.requires_grad]
    student.train()
    kl_total, aux_total = 0.0, 0.0
    for episodes, batch in zip(micro_batches, packed, strict=True):
        batch = batch.to(precision.device)
        prefix = shared_prefix_length(episodes)
        teacher_logits = teacher_target_logits(teacher, batch, precision, prefix)
        with precision.autocast():
            if aux_coef is None:
                student_logits, output = forward_targets(student, batch, prefix)
            else:  # the router loss averages over every token of every row: no prefix sharing
                student_logits, output = forward_targets(student, batch, output_router_logits=True)
        kl_sum = token_kl(student_logits, teacher_logits,
                          temperature=settings.temperature, direction=settings.direction).sum()
        loss = kl_sum / total
        if aux_coef is not None:
            aux = aux_coef * output.aux_loss.float() * (batch.target_count / total)
            loss = loss + aux
            aux_total += aux.item()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite distillation loss ({loss.item()}); lower the learning rate "
                                     "or check the teacher/student checkpoints")
        scaler.scale(loss).backward()
        kl_total += kl_sum.item() / total
        del output, student_logits, teacher_logits, loss
    scaler.unscale_(optimizer)
    max_norm = settings.grad_clip if settings.grad_clip else math.inf
    # with a grad scaler an overflow is expected now and then: the scaler skips that step instead
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, error_if_nonfinite=not precision.uses_grad_scaler)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateStats(kl_total + aux_total, kl_total, aux_total, float(grad_norm), total)
