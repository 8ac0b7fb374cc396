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

from common.config_schema import parse_config
from common.minimind.model import (
    build_model,
    check_tokenizer_fits,
    enable_activation_checkpointing,
    load_model,
)
from common.minimind.precision import Precision
from common.minimind.tokenizer import load_tokenizer
from common.package_files import CONFIG_DIR
from common.run_folders import checks_passed, discard_unless_checked
from common.user_errors import exit_on_user_error
from opd.chat_format import ChatFormat
from opd.checkpoints import (
    check_out_dir,
    checkpoint_stem,
    file_fingerprint,
    restore,
    rng_state,
    run_signature,
    save_checkpoint,
    vocabulary_fingerprint,
)
from opd.config import SFTConfig
from opd.data_order import DataCursor, DataOrder
from opd.demonstrations import demonstration_episode, load_demonstrations
from opd.distributed import check_batch_divides, data_parallel, gradient_sync, idle_loss, start, stop, unwrap
from opd.episodes import Episode, PackedBatch, pack_episodes, shared_prefix_length
from opd.loss import TargetLogits, router_aux_coef, router_loss, target_cross_entropy
from opd.optimization import Optimization
from opd.out_dir import hold_out_dir
from opd.reporting import TrainLog, episode_counts, episode_figures, run_dir_of, run_summary


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="sft")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error(), discard_unless_checked():  # stopped at its checks: no folder left behind
        settings = parse_config(SFTConfig, cfg)
        with hold_out_dir(settings.out_dir):  # one run per out_dir, checked writable before anything loads
            train(settings)


def train(cfg: SFTConfig) -> dict:
    """Fine-tune ``cfg.model`` on the demonstrations in ``cfg.data`` (continuing ``cfg.resume``); returns the summary.

    Under ``torchrun`` each process trains on its share of each global micro-batch and the model is
    ``DistributedDataParallel`` (as in ``opd/train.py``); only rank 0 logs and writes files.
    """
    entered = time.perf_counter()  # metrics' elapsed_s: data and model loading included
    precision = cfg.precision
    ranks = start(precision.device)
    device = ranks.device(precision.device)
    check_batch_divides(cfg.batch_size, ranks)
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
         "world_size": ranks.world_size, "dtype": precision.dtype_name, "lr_schedule_steps": schedule_steps,
         "optim": cfg.optim, "from_scratch": cfg.from_scratch, "max_total_len": cfg.max_total_len,
         "open_thinking": cfg.open_thinking},
        models={"model": model},
        fingerprints={"data.sha256": data_sha256, "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer),
                      "model.init": f"scratch:seed={cfg.seed}" if cfg.from_scratch
                      else file_fingerprint(cfg.model.checkpoint)})
    signature.pop("optim.lr_schedule_steps")
    stem = checkpoint_stem(model, cfg.save_prefix)
    check_out_dir(cfg.out_dir, stem, resume=cfg.resume, overwrite=cfg.overwrite)
    checks_passed()  # data, models and out_dir are checked: from here on a failure keeps the run's folders
    model.to(device)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model_forward = data_parallel(TargetLogits(model), ranks, device)
    optimization = Optimization(model, cfg.optim, schedule_steps, precision)
    step, cursor = 0, DataCursor()
    if cfg.resume:
        step, cursor = restore(cfg.resume, signature, model=model, optimization=optimization, sampler=None,
                               rank=ranks.rank)
    run_dir, start_step, paths, losses, tokens, seen = run_dir_of(cfg.out_dir), step, (None, None), [], 0, 0
    started = time.perf_counter()
    with TrainLog(run_dir, cfg.logger, total_steps=order.total_steps, start_step=step, label="sft",
                  enabled=ranks.is_main, config=asdict(cfg)) as log:
        for window in order.windows(cursor, step):
            # --- this rank's share of the window's demonstrations; cross-entropy over every target of the window
            began = time.perf_counter()
            micro_batches = [[episodes[i] for i in ranks.share(batch)] for batch in window.batches]
            packed = [pack_episodes(batch, tokenizer.pad_token_id) if batch else None for batch in micro_batches]
            (targets,) = ranks.sum([sum(batch.target_count for batch in packed if batch is not None)])
            cross_entropy, aux = 0.0, 0.0
            model.train()
            for index, (batch_episodes, batch) in enumerate(zip(micro_batches, packed, strict=True)):
                with gradient_sync(model_forward, last=index == len(packed) - 1):
                    if batch is None:  # this rank's share of a short micro-batch is empty: join the gradient sum
                        optimization.backward(idle_loss(model_forward, tokenizer.pad_token_id, device))
                        continue
                    ce_sum, router = sft_loss_step(model_forward, batch_episodes, batch.to(device), precision,
                                                   share_prefix=not cfg.gradient_checkpointing)
                    loss = ce_sum / targets * ranks.world_size  # DDP averages: scaled, the ranks add up to the mean
                    if router is not None:
                        router = router * (batch.target_count / targets * ranks.world_size)
                        loss, aux = loss + router, aux + router.item() / ranks.world_size
                    optimization.backward(loss)
                    cross_entropy += ce_sum.item() / targets
            # --- optimizer step, log, checkpoint
            lr, grad_norm = optimization.lr, optimization.step()
            step, cursor = window.step, window.next_cursor
            counts = episode_counts([episode for batch in micro_batches for episode in batch], chat_format)
            totals = dict(zip([*counts, "ce", "aux"], ranks.sum([*counts.values(), cross_entropy, aux]), strict=True))
            cross_entropy, aux, figures = totals.pop("ce"), totals.pop("aux"), episode_figures(totals)
            seen += counts["episodes"]
            elapsed = time.perf_counter() - began
            log.step({"step": step, "epoch": window.epoch, "loss": cross_entropy + aux, "cross_entropy": cross_entropy,
                      "aux_loss": aux, "grad_norm": grad_norm, "target_tokens": int(targets), **figures,
                      "tokens_per_s": figures["assistant_tokens"] / elapsed, "lr": lr, "update_s": elapsed,
                      "elapsed_s": time.perf_counter() - entered})
            losses.append(cross_entropy + aux)
            tokens += figures["assistant_tokens"]
            if step % cfg.save_interval == 0 or step == order.total_steps:
                rng_states = ranks.gather(rng_state(None))
                if ranks.is_main:
                    paths = save_checkpoint(cfg.out_dir, stem, model, optimization=optimization, step=step,
                                            cursor=cursor, rng_states=rng_states, signature=signature,
                                            keep_weights=cfg.keep_saved_weights)
    summary = run_summary(step=step, start_step=start_step, losses=losses, tokens=tokens,
                          wall=time.perf_counter() - started, precision=precision, paths=paths, run_dir=run_dir)
    summary.update(world_size=ranks.world_size, episodes_per_rank=ranks.gather(seen),
                   architecture=asdict(cfg.model.arch))
    if ranks.is_main:
        log.summary(summary, [run_dir / "summary.json", Path(cfg.out_dir) / f"{stem}_summary.json"])
    del model_forward  # DDP's reducer before the process group (see distributed.stop)
    stop(ranks)
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


def sft_loss_step(model_forward: torch.nn.Module, episodes: list[Episode], batch: PackedBatch,
                  precision: Precision, *, share_prefix: bool = True):
    """One micro-batch: fp32 logits at the targets (``model_forward``: the model's ``TargetLogits``, DDP-wrapped
    under torchrun); returns (cross-entropy summed over the targets, the weighted router loss of a MoE model or
    None). A shared prompt prefix runs once for a dense model (unless ``share_prefix`` is off)."""
    model = unwrap(model_forward)
    moe = router_aux_coef(model) is not None
    prefix = shared_prefix_length(episodes) if share_prefix and not moe else 0
    with precision.autocast():
        logits, output = model_forward(batch.input_ids, batch.attention_mask, batch.target_mask, prefix,
                                       router_logits=moe)
    return target_cross_entropy(logits, batch), router_loss(model, output, batch.attention_mask) if moe else None


if __name__ == "__main__":
    from opd.commands import run

    run("sft", main)
