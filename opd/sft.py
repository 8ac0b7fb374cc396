"""Supervised fine-tuning of a MiniMind model on tool-use demonstrations (e.g. to build a teacher).

    python opd/sft.py data=demonstrations.jsonl model=full_sft_768
    python opd/sft.py data=demonstrations.jsonl from_scratch=true model.hidden_size=256 model.num_hidden_layers=4

The demonstrations become fixed token sequences exactly as the fixed-data distillation baseline builds them
(``opd.demonstrations``: assistant tokens, each turn's EOS included, are targets; prompt, observations and
role markers are context). Each optimizer step (``train`` below) minimizes the mean cross-entropy over every
target token of its window (plus a MoE model's router loss), with the data order, schedule, exact resume,
checkpoints and logs of ``opd/train.py``. Settings: ``configs/sft.yaml`` (schema ``opd.config.SFTConfig``).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from opd.chat_format import ChatFormat
from opd.checkpoints import (
    check_out_dir,
    checkpoint_stem,
    file_fingerprint,
    restore,
    run_signature,
    save_checkpoint,
    vocabulary_fingerprint,
)
from opd.config import SFTConfig, parse_config
from opd.data_order import DataCursor, DataOrder
from opd.demonstrations import demonstration_episode, load_demonstrations
from opd.episodes import Episode, PackedBatch, pack_episodes, shared_prefix_length
from opd.loss import logits_at_targets, router_aux_coef, router_loss, target_cross_entropy
from opd.minimind.model import build_model, check_tokenizer_fits, load_model
from opd.minimind.precision import Precision
from opd.minimind.tokenizer import load_tokenizer
from opd.optimization import Optimization
from opd.reporting import TrainLog, episode_figures, run_dir_of, run_summary
from opd.user_errors import exit_on_user_error


@hydra.main(version_base="1.3", config_path="../configs", config_name="sft")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error():
        train(parse_config(SFTConfig, cfg))


def train(cfg: SFTConfig) -> dict:
    """Fine-tune ``cfg.model`` on the demonstrations in ``cfg.data`` (continuing ``cfg.resume``); returns the summary."""
    precision, device = cfg.precision, cfg.precision.device
    # --- data and model, checked before any compute
    demonstrations, data_sha256 = load_demonstrations(cfg.data)
    model, tokenizer = initial_model(cfg)
    torch.manual_seed(cfg.seed)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.open_thinking)
    episodes = [demonstration_episode(demonstration, chat_format, cfg.max_total_len) for demonstration in demonstrations]
    order = DataOrder(len(episodes), batch_size=cfg.batch_size, accumulation_steps=cfg.accumulation_steps,
                      epochs=cfg.epochs, seed=cfg.seed, max_steps=cfg.max_steps)
    schedule_steps = cfg.optim.lr_schedule_steps or order.total_steps
    signature = run_signature(
        {"seed": cfg.seed, "batch_size": cfg.batch_size, "accumulation_steps": cfg.accumulation_steps,
         "dtype": precision.dtype_name, "lr_schedule_steps": schedule_steps, "optim": cfg.optim,
         "from_scratch": cfg.from_scratch, "max_total_len": cfg.max_total_len, "open_thinking": cfg.open_thinking},
        models={"model": model},
        fingerprints={"data.sha256": data_sha256, "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer),
                      "model.init": f"scratch:seed={cfg.seed}" if cfg.from_scratch
                      else file_fingerprint(cfg.model.checkpoint)})
    signature.pop("optim.lr_schedule_steps")
    stem = checkpoint_stem(model, cfg.save_prefix)
    check_out_dir(cfg.out_dir, stem, resume=cfg.resume, overwrite=cfg.overwrite)
    model.to(device)
    optimization = Optimization(model, cfg.optim, schedule_steps, precision)
    step, cursor = 0, DataCursor()
    if cfg.resume:
        step, cursor = restore(cfg.resume, signature, model=model, optimization=optimization, sampler=None)
    run_dir, start_step, paths, losses, tokens = run_dir_of(cfg.out_dir), step, (None, None), [], 0
    started = time.perf_counter()
    with TrainLog(run_dir / "metrics.jsonl", total_steps=order.total_steps, start_step=step, label="sft") as log:
        for window in order.windows(cursor, step):
            # --- the window's demonstrations; cross-entropy over every target of the window
            began = time.perf_counter()
            micro_batches = [[episodes[i] for i in batch] for batch in window.batches]
            packed = [pack_episodes(batch, tokenizer.pad_token_id) for batch in micro_batches]
            targets = sum(batch.target_count for batch in packed)
            cross_entropy, aux = 0.0, 0.0
            model.train()
            for batch_episodes, batch in zip(micro_batches, packed, strict=True):
                ce_sum, router = sft_loss_step(model, batch_episodes, batch.to(device), precision)
                loss = ce_sum / targets
                if router is not None:
                    router = router * (batch.target_count / targets)
                    loss, aux = loss + router, aux + router.item()
                optimization.backward(loss)
                cross_entropy += ce_sum.item() / targets
            # --- optimizer step, log, checkpoint
            lr, grad_norm = optimization.lr, optimization.step()
            step, cursor = window.step, window.next_cursor
            figures = episode_figures([episode for batch in micro_batches for episode in batch], chat_format)
            elapsed = time.perf_counter() - began
            log.step({"step": step, "epoch": window.epoch, "loss": cross_entropy + aux, "cross_entropy": cross_entropy,
                      "aux_loss": aux, "grad_norm": grad_norm, "target_tokens": targets, **figures,
                      "tokens_per_s": figures["assistant_tokens"] / elapsed, "lr": lr, "update_s": elapsed})
            losses.append(cross_entropy + aux)
            tokens += figures["assistant_tokens"]
            if step % cfg.save_interval == 0 or step == order.total_steps:
                paths = save_checkpoint(cfg.out_dir, stem, model, optimization=optimization, step=step, cursor=cursor,
                                        sampler=None, signature=signature)
    summary = run_summary(step=step, start_step=start_step, losses=losses, tokens=tokens,
                          wall=time.perf_counter() - started, precision=precision, paths=paths, run_dir=run_dir)
    summary["architecture"] = asdict(cfg.model.arch)
    log.summary(summary, [run_dir / "summary.json", Path(cfg.out_dir) / f"{stem}_summary.json"])
    return summary


def initial_model(cfg: SFTConfig):
    """The model to fine-tune and its tokenizer: ``cfg.model``'s checkpoint, or a seeded random init of its
    architecture when ``from_scratch``."""
    if not cfg.from_scratch:
        return load_model(cfg.model, role="model")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.arch)
    tokenizer = load_tokenizer(cfg.model.tokenizer, role="model.tokenizer")
    check_tokenizer_fits(tokenizer, model, role="model", exact=True)
    return model, tokenizer


def sft_loss_step(model: torch.nn.Module, episodes: list[Episode], batch: PackedBatch, precision: Precision):
    """One micro-batch: fp32 logits at the targets; returns (cross-entropy summed over the targets, the
    weighted router loss of a MoE model or None). A shared prompt prefix runs once for a dense model."""
    moe = router_aux_coef(model) is not None
    with precision.autocast():
        logits, output = logits_at_targets(model, batch, 0 if moe else shared_prefix_length(episodes),
                                           router_logits=moe)
    return target_cross_entropy(logits, batch), router_loss(model, output, batch.attention_mask) if moe else None


if __name__ == "__main__":
    main()
