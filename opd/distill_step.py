"""One optimizer update from finished episodes: frozen-teacher targets, KL loss, clipped step.

``accumulate_update`` is the update itself for any per-token loss (the distillation KL here, cross-entropy
for SFT); ``distill_update`` plugs in the teacher and the KL.

The loss of an update is the mean over every target token of the whole accumulation window (micro-batches
are weighted by their share of target tokens), so ``batch_size=2, accumulation_steps=1`` and
``batch_size=1, accumulation_steps=2`` give the same gradient. A MoE student adds its router load-balancing
loss times ``router_aux_loss_coef``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from opd.distill_loss import token_kl
from opd.episodes import Episode, PackedBatch, pack_episodes
from opd.minimind.model import cache_keyword
from opd.minimind.precision import Precision
from opd.shared_prefix import prefill_shared_prefix, shared_prefix_length


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
                       **{cache_keyword(model): cache}, **extra)
    return output.logits[batch.target_mask[:, positions]], output


def teacher_target_logits(teacher: torch.nn.Module, batch: PackedBatch, precision: Precision,
                          prefix: int = 0) -> torch.Tensor:
    """Teacher logits at the target positions, ``[targets, vocab]``, without autograd."""
    with torch.no_grad(), precision.autocast():
        return forward_targets(teacher, batch, prefix)[0]


@dataclass(frozen=True)
class WindowLoss:
    """What one accumulated update computed: the token loss and router aux loss (per target token of the
    window), the gradient norm before clipping, and the window's target count."""

    token_loss: float
    aux_loss: float
    grad_norm: float
    target_tokens: int


# (student logits at the targets [targets, vocab], the micro-batch, its shared-prefix length) -> summed token loss
TokenLoss = Callable[[torch.Tensor, PackedBatch, int], torch.Tensor]


def accumulate_update(micro_batches: list[list[Episode]], *, model: torch.nn.Module, token_loss: TokenLoss,
                      optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler,
                      grad_clip: float | None, precision: Precision, pad_token_id: int) -> WindowLoss:
    """Accumulate the window's gradient of ``token_loss`` (summed over targets, divided by the window's target
    count) over its micro-batches, add a MoE model's router loss, clip, step optimizer and scheduler."""
    packed = [pack_episodes(episodes, pad_token_id) for episodes in micro_batches]
    total = sum(batch.target_count for batch in packed)
    if total == 0:
        raise ValueError("the update window holds no target tokens")
    aux_coef = router_aux_coef(model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    model.train()
    token_total, aux_total = 0.0, 0.0
    for episodes, batch in zip(micro_batches, packed, strict=True):
        batch = batch.to(precision.device)
        prefix = shared_prefix_length(episodes)
        with precision.autocast():
            if aux_coef is None:
                logits, output = forward_targets(model, batch, prefix)
            else:  # the router loss averages over every token of every row: no prefix sharing
                logits, output = forward_targets(model, batch, output_router_logits=True)
        token_sum = token_loss(logits, batch, prefix)
        loss = token_sum / total
        if aux_coef is not None:
            aux = aux_coef * output.aux_loss.float() * (batch.target_count / total)
            loss = loss + aux
            aux_total += aux.item()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss ({loss.item()}); lower the learning rate "
                                     "or check the checkpoints")
        scaler.scale(loss).backward()
        token_total += token_sum.item() / total
        del output, logits, loss
    scaler.unscale_(optimizer)
    max_norm = grad_clip if grad_clip else math.inf
    # with a grad scaler an overflow is expected now and then: the scaler skips that step instead
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, error_if_nonfinite=not precision.uses_grad_scaler)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return WindowLoss(token_total, aux_total, float(grad_norm), total)


def distill_update(micro_batches: list[list[Episode]], *, student: torch.nn.Module, teacher: torch.nn.Module,
                   optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler,
                   settings: DistillSettings, precision: Precision, pad_token_id: int) -> UpdateStats:
    """One distillation update: the frozen teacher's logits at exactly the student's targets, T²-scaled KL."""

    def kl_sum(student_logits: torch.Tensor, batch: PackedBatch, prefix: int) -> torch.Tensor:
        teacher_logits = teacher_target_logits(teacher, batch, precision, prefix)
        return token_kl(student_logits, teacher_logits, temperature=settings.temperature,
                        direction=settings.direction).sum()

    window = accumulate_update(micro_batches, model=student, token_loss=kl_sum, optimizer=optimizer,
                               scheduler=scheduler, scaler=scaler, grad_clip=settings.grad_clip, precision=precision,
                               pad_token_id=pad_token_id)
    return UpdateStats(window.token_loss + window.aux_loss, window.token_loss, window.aux_loss, window.grad_norm,
                       window.target_tokens)
