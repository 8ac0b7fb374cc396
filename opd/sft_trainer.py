"""Plain supervised fine-tuning on tool-use demonstrations: cross-entropy on the assistant turns' tokens.

The demonstrations become fixed token sequences exactly as the fixed-data distillation baseline builds
them (``opd.demonstrations``: assistant tokens, each turn's EOS included, are targets; prompt, observations
and role markers are context). Data order, the update loop, exact resume, checkpoints and logging are the
OPD trainer's (``opd.update_loop``); only the loss differs: mean cross-entropy over every target token of
an accumulation window (plus the router aux loss of a MoE model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import torch
from omegaconf import DictConfig

from opd.chat_format import ChatFormat
from opd.checkpoints import architecture_of, file_fingerprint, vocabulary_fingerprint
from opd.demonstrations import demonstration_episode, load_demonstrations
from opd.distill_step import accumulate_update
from opd.episodes import Episode, PackedBatch
from opd.minimind.model import MiniMindArch, build_model, check_tokenizer_fits, load_model
from opd.minimind.precision import Precision, resolve_precision
from opd.minimind.tokenizer import load_tokenizer
from opd.update_loop import OPTIMIZATION_KEYS, plan_steps, run_updates, validate_optimization

SIGNATURE_KEYS = ("from_scratch", "max_total_len", "open_thinking", *OPTIMIZATION_KEYS)


@dataclass(frozen=True)
class SFTStats:
    """Figures of one SFT update."""

    loss: float  # cross_entropy + aux_loss
    cross_entropy: float  # mean per target token
    aux_loss: float
    grad_norm: float
    target_tokens: int


def target_cross_entropy(logits: torch.Tensor, batch: PackedBatch, prefix: int) -> torch.Tensor:
    """Summed cross-entropy of the logits at the target positions against the ids that follow them (fp32)."""
    labels = batch.input_ids[:, 1:][batch.target_mask]
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")


def sft_update(micro_batches: list[list[Episode]], *, model: torch.nn.Module, optimizer, scheduler, scaler,
               grad_clip: float | None, precision: Precision, pad_token_id: int) -> SFTStats:
    """One supervised update over a window of demonstration episodes."""
    window = accumulate_update(micro_batches, model=model, token_loss=target_cross_entropy, optimizer=optimizer,
                               scheduler=scheduler, scaler=scaler, grad_clip=grad_clip, precision=precision,
                               pad_token_id=pad_token_id)
    return SFTStats(window.token_loss + window.aux_loss, window.token_loss, window.aux_loss, window.grad_norm,
                    window.target_tokens)


def initial_model(cfg: DictConfig):
    """The model to fine-tune and its tokenizer: ``cfg.model``'s checkpoint, or a seeded random init of its
    architecture when ``from_scratch``."""
    if not cfg.from_scratch:
        return load_model(cfg.model, role="model")
    torch.manual_seed(cfg.seed)
    model = build_model(MiniMindArch.from_config(cfg.model))
    tokenizer = load_tokenizer(cfg.model.tokenizer, role="model.tokenizer")
    check_tokenizer_fits(tokenizer, model, role="model", exact=True)
    return model, tokenizer


def run(cfg: DictConfig) -> dict:
    """Fine-tune ``cfg.model`` on the demonstrations in ``cfg.data``; returns the run summary."""
    validate_optimization(cfg)
    if not isinstance(cfg.max_total_len, int) or cfg.max_total_len < 1:
        raise ValueError(f"max_total_len must be an integer >= 1, got {cfg.max_total_len!r}")
    precision = resolve_precision(cfg.device, cfg.dtype)
    demonstrations, data_sha256 = load_demonstrations(cfg.data)
    model, tokenizer = initial_model(cfg)
    torch.manual_seed(cfg.seed)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.open_thinking)
    episodes = [demonstration_episode(d, chat_format, cfg.max_total_len) for d in demonstrations]
    model.to(precision.device)
    plan = plan_steps(cfg, len(episodes))
    signature = {"data.sha256": data_sha256, "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer),
                 "model.init": f"scratch:seed={cfg.seed}" if cfg.from_scratch else file_fingerprint(cfg.model.checkpoint),
                 "lr_schedule_steps": plan.schedule_steps, "dtype": precision.dtype_name,
                 **{f"model.{k}": v for k, v in architecture_of(model).items()},
                 **{key: cfg[key] for key in SIGNATURE_KEYS}}
    update = partial(sft_update, model=model, grad_clip=cfg.grad_clip, precision=precision,
                     pad_token_id=tokenizer.pad_token_id)
    summary = run_updates(cfg, model=model, plan=plan, signature=signature, fetch=lambda batch: [episodes[i] for i in batch],
                          update=update, precision=precision, label="sft", checkpoint_prefix=cfg.save_prefix,
                          fetch_key="data_s")
    return {**summary, "architecture": asdict(MiniMindArch.from_config(cfg.model))}
