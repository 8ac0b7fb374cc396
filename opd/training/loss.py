"""The training losses on packed episodes: full-vocabulary distillation divergence, cross-entropy, a MoE router loss.

Logits only at the targets, always fp32. With ``p_T = softmax(logits / T)``, ``forward_kl`` is T²·KL(teacher_T ‖
student_T), ``reverse_kl`` T²·KL(student_T ‖ teacher_T), ``jsd`` GKD's generalized JSD (T²-scaled, β in (0, 1),
mixed in probability space)::

    JSD(β) = β·KL(teacher ‖ M) + (1 - β)·KL(student ‖ M),   M = β·teacher + (1 - β)·student

The teacher side is detached.
"""

from __future__ import annotations

import math

import torch

from common.minimind.model import cache_keyword, prefill_shared_prefix
from common.minimind.precision import Precision
from opd.config import LossConfig
from opd.episodes.episode import Episode, PackedBatch, TopLogprobs, shared_prefix_length
from opd.training.distributed import unwrap


def logits_at_targets(model: torch.nn.Module, batch: PackedBatch, prefix: int = 0, *, router_logits: bool = False):
    """fp32 logits at the batch's targets, ``[targets, vocab]``, and the model body's output. With ``prefix`` > 0 the
    first ``prefix`` ids (identical in every row, before any target) run once."""
    if prefix and batch.target_mask[:, :prefix].any():
        raise ValueError(f"a shared prefix of {prefix} ids reaches a target")
    # rows are right-padded: under the causal mask no real token sees a pad, so the padding mask changes nothing
    # and, left out, lets the attention run its plain causal kernel
    extra = {"output_router_logits": True} if router_logits else {}
    if not prefix:
        output = model.model(input_ids=batch.input_ids, use_cache=False, **extra)
    else:
        rows, length = batch.input_ids.shape
        cache = prefill_shared_prefix(model, batch.input_ids[0, :prefix].tolist(), rows)
        suffix_positions = torch.arange(prefix, length, device=batch.input_ids.device).expand(rows, -1)
        output = model.model(input_ids=batch.input_ids[:, prefix:], position_ids=suffix_positions, use_cache=True,
                             **{cache_keyword(model.model): cache}, **extra)
    # position t's hidden state predicts token t + 1 (the target mask is shifted so)
    suffix = output.last_hidden_state[:, :batch.target_mask.shape[1] - prefix]
    hidden = suffix[batch.target_mask[:, prefix:]]  # [targets, hidden], row by row: only the targets are projected
    with torch.autocast(hidden.device.type, enabled=False):
        return model.lm_head(hidden.float()), output


class TargetLogits(torch.nn.Module):
    """``logits_at_targets`` as one module, so DDP wraps the whole computation and syncs its one backward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                prefix: int = 0, router_logits: bool = False):
        return logits_at_targets(self.model, PackedBatch(input_ids, attention_mask, target_mask), prefix,
                                 router_logits=router_logits)


def token_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, settings: LossConfig) -> torch.Tensor:
    """Per-position T²-scaled divergence for ``[..., vocab]`` logits; ``[...]`` in fp32 (fp64 for fp64 logits)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape (vocabularies must match)")
    temperature, dtype = settings.temperature, torch.promote_types(student_logits.dtype, torch.float32)
    student = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    if settings.kl_direction == "forward_kl":
        divergence = (teacher.exp() * (teacher - student)).sum(dim=-1)
    elif settings.kl_direction == "reverse_kl":
        divergence = (student.exp() * (student - teacher)).sum(dim=-1)
    else:
        beta = settings.jsd_beta
        mixture = torch.logaddexp(teacher + math.log(beta), student + math.log1p(-beta))
        divergence = (beta * (teacher.exp() * (teacher - mixture)).sum(dim=-1)
                      + (1 - beta) * (student.exp() * (student - mixture)).sum(dim=-1))
    return divergence * temperature**2


def topk_forward_kl(student_logits: torch.Tensor, top: TopLogprobs) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target KL(teacher ‖ student) at temperature 1 on the teacher's top-k ids plus one tail bucket with the rest
    of each side's mass (equal to the full forward KL when the top-k holds every id); and the teacher's top-k mass."""
    student = torch.log_softmax(student_logits.float(), dim=-1)
    valid = top.ids >= 0
    ids = top.ids.clamp(min=0).to(student.device)
    valid = valid.to(student.device)
    teacher = top.logprobs.to(student.device, torch.float32).masked_fill(~valid, -math.inf)
    teacher_p = teacher.exp()
    head = torch.where(valid, teacher_p * (teacher - student.gather(-1, ids)), 0.0).sum(-1)
    mass = teacher_p.sum(-1)
    outside = torch.ones_like(student, dtype=torch.bool).scatter(-1, ids, ~valid)
    has_tail = outside.any(-1, keepdim=True)  # no tail when the top-k holds the whole vocabulary
    student_tail = torch.where(has_tail & outside, student, -math.inf).masked_fill(~has_tail, 0.0).logsumexp(-1)
    teacher_tail = (1 - mass).clamp(min=0)
    tail = torch.where(has_tail[:, 0] & (teacher_tail > 0),
                       teacher_tail * (teacher_tail.clamp(min=1e-30).log() - student_tail), 0.0)
    return head + tail, mass


def sampled_token_reverse_kl(student_logits: torch.Tensor, labels: torch.Tensor,
                             teacher_next: torch.Tensor) -> torch.Tensor:
    """Per-target estimate of KL(student ‖ teacher) from the sampled token: value log p_student(y) - log p_teacher(y),
    gradient that times ∇ log p_student(y). Unbiased only on the student's own samples at temperature 1."""
    student = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, labels[:, None])[:, 0]
    estimate = (student - teacher_next.to(student.device, torch.float32)).detach()
    return estimate + estimate * (student - student.detach())


def target_cross_entropy(logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Summed cross-entropy of the logits at the targets against the ids that follow them."""
    labels = batch.input_ids[:, 1:][batch.target_mask]
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")


def router_aux_coef(model: torch.nn.Module) -> float | None:
    """The router loss weight of a MoE model, None for a dense one."""
    config = model.config
    return getattr(config, "router_aux_loss_coef", None) if getattr(config, "num_experts", None) else None


def router_loss(model: torch.nn.Module, output, attention_mask: torch.Tensor) -> torch.Tensor:
    """MiniMind-3's router load-balancing loss of one MoE forward, ``num_experts · Σ_e load_e · score_e · coef`` per
    layer, summed; padding positions are left out, so a padded batch gives what its unpadded rows would."""
    config = model.config
    experts, top_k = config.num_experts, config.num_experts_per_tok
    real = attention_mask.reshape(-1).bool()
    total = torch.zeros((), device=attention_mask.device)
    for layer_logits in output.router_logits:
        scores = torch.softmax(layer_logits.float()[real], dim=-1)
        chosen = torch.topk(scores, top_k, dim=-1).indices
        load = torch.nn.functional.one_hot(chosen, experts).float().mean(0)  # [top_k, experts]
        total = total + (load * scores.mean(0)).sum() * experts
    return total * config.router_aux_loss_coef


def trained_logits(forward: torch.nn.Module, episodes: list[Episode], batch: PackedBatch, precision: Precision, *,
                   share_prefix: bool = True):
    """The trained model's fp32 logits at the targets and its weighted router loss (None for a dense model). A shared
    prompt prefix runs once unless ``share_prefix`` is off or the model is MoE (its router loss needs every token)."""
    model = unwrap(forward)
    moe = router_aux_coef(model) is not None
    prefix = shared_prefix_length(episodes) if share_prefix and not moe else 0
    with precision.autocast():
        logits, output = forward(batch.input_ids, batch.attention_mask, batch.target_mask, prefix, router_logits=moe)
    return logits, router_loss(model, output, batch.attention_mask) if moe else None


def distill_loss_step(student_forward: torch.nn.Module, teacher: torch.nn.Module | None, episodes: list[Episode],
                      batch: PackedBatch, settings: LossConfig, precision: Precision, *, share_prefix: bool = True):
    """One micro-batch of distillation: (the T²-scaled divergence summed over the targets, the router loss or None),
    against a served teacher's top-k, the logits guided rollouts kept, or the teacher's logits on the batch."""
    if all(episode.teacher_top is not None for episode in episodes):
        student_logits, router = trained_logits(student_forward, episodes, batch, precision, share_prefix=share_prefix)
        top = TopLogprobs.cat([episode.teacher_top for episode in episodes])
        if settings.kl_direction == "forward_kl":
            return topk_forward_kl(student_logits, top)[0].sum(), router
        labels = batch.input_ids[:, 1:][batch.target_mask]
        return sampled_token_reverse_kl(student_logits, labels, top.next_token).sum(), router
    if all(episode.teacher_logits is not None for episode in episodes):
        teacher_logits = torch.cat([episode.teacher_logits for episode in episodes]).to(batch.input_ids.device)
    else:
        with torch.no_grad(), precision.autocast():
            teacher_logits, _ = logits_at_targets(teacher, batch, shared_prefix_length(episodes))
    student_logits, router = trained_logits(student_forward, episodes, batch, precision, share_prefix=share_prefix)
    return token_divergence(student_logits, teacher_logits, settings).sum(), router


def sft_loss_step(forward: torch.nn.Module, episodes: list[Episode], batch: PackedBatch, precision: Precision, *,
                  share_prefix: bool = True):
    """One micro-batch of fine-tuning: (cross-entropy summed over the targets, router loss or None)."""
    logits, router = trained_logits(forward, episodes, batch, precision, share_prefix=share_prefix)
    return target_cross_entropy(logits, batch), router
