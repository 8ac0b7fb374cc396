"""The OPD training run: ``run(cfg)`` wires models, data, rollouts, updates, checkpoints and logging.

Each optimizer step takes the next accumulation window of records, rolls every micro-batch out with the
current student, and distils the frozen teacher's next-token distributions into the student on exactly
those token sequences. ``max_steps`` counts all optimizer steps of the run, resumed ones included.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import get_scheduler

from opd.agent_records import load_agent_records
from opd.chat_format import ChatFormat
from opd.checkpoints import (
    architecture_of,
    check_signature,
    checkpoint_stem,
    file_fingerprint,
    load_resume,
    save_checkpoint,
)
from opd.data_order import DataCursor, EpochBatches
from opd.device_setup import Precision, resolve_precision
from opd.distill_loss import KL_DIRECTIONS
from opd.distill_step import DistillSettings, distill_update, freeze
from opd.episodes import Episode
from opd.minimind import load_model
from opd.rollout import AgentRollout, RolloutLimits
from opd.sampling import SamplingSettings, TokenSampler
from opd.tokenizer import check_same_tokenizer
from opd.train_log import TrainLog, print_summary, write_json

SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
# settings copied verbatim into the resume signature (a continuation must share them)
SIGNATURE_KEYS = ("seed", "max_turns", "max_gen_len", "max_total_len", "open_thinking", "kl_direction",
                  "distill_temperature", "batch_size", "accumulation_steps", "learning_rate", "weight_decay",
                  "lr_scheduler", "warmup_steps", "grad_clip")


def validate_settings(cfg: DictConfig) -> None:
    """Refuse out-of-range training settings before any model is loaded, naming the key."""
    for key in ("batch_size", "accumulation_steps", "epochs", "save_interval", "max_turns", "max_gen_len",
                "max_total_len"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {cfg[key]!r}")
    for key in ("max_steps", "lr_schedule_steps"):
        if cfg[key] is not None and (not isinstance(cfg[key], int) or cfg[key] < 1):
            raise ValueError(f"{key} must be null or an integer >= 1, got {cfg[key]!r}")
    if not isinstance(cfg.warmup_steps, int) or cfg.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an integer >= 0, got {cfg.warmup_steps!r}")
    for key, allow_zero in (("learning_rate", False), ("weight_decay", True), ("distill_temperature", False)):
        value = cfg[key]
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"{key} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
    if cfg.grad_clip is not None and not cfg.grad_clip > 0:
        raise ValueError(f"grad_clip must be null or > 0, got {cfg.grad_clip!r}")
    if cfg.kl_direction not in KL_DIRECTIONS:
        raise ValueError(f"kl_direction must be one of {KL_DIRECTIONS}, got {cfg.kl_direction!r}")
    if cfg.lr_scheduler not in SCHEDULERS:
        raise ValueError(f"lr_scheduler must be one of {tuple(SCHEDULERS)}, got {cfg.lr_scheduler!r}")


def check_pair(teacher: torch.nn.Module, student: torch.nn.Module, max_total_len: int) -> None:
    """The teacher and student must share the vocabulary size and fit ``max_total_len`` positions."""
    sizes = {role: model.get_output_embeddings().weight.shape[0] for role, model in
             (("teacher", teacher), ("student", student))}
    if sizes["teacher"] != sizes["student"]:
        raise ValueError(f"teacher and student vocabulary sizes differ: {sizes['teacher']} vs {sizes['student']}")
    for role, model in (("teacher", teacher), ("student", student)):
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and max_total_len > limit:
            raise ValueError(f"max_total_len={max_total_len} exceeds the {role}'s {limit} positions")


def run_signature(cfg: DictConfig, *, teacher, student, tokenizer, data_sha256: str, sampling: SamplingSettings,
                  schedule_steps: int, precision: Precision) -> dict:
    """Everything a continuation must share with the run that wrote the resume file, as flat dotted keys."""
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    signature = {"data.sha256": data_sha256, "teacher.checkpoint_sha256": file_fingerprint(cfg.teacher.checkpoint),
                 "tokenizer.vocab_sha256": hashlib.sha256(vocabulary).hexdigest(),
                 "lr_schedule_steps": schedule_steps, "dtype": precision.dtype_name}
    signature.update({f"teacher.{k}": v for k, v in architecture_of(teacher).items()})
    signature.update({f"student.{k}": v for k, v in architecture_of(student).items()})
    signature.update({f"sampling.{k}": v for k, v in asdict(sampling).items()})
    signature.update({key: cfg[key] for key in SIGNATURE_KEYS})
    return signature


def rng_state(sampler: TokenSampler) -> dict:
    """Every RNG the loop consumes: rollout sampling, plus torch's global CPU/CUDA generators."""
    return {"sampler": sampler.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore(path: str, signature: dict, *, student, optimizer, scheduler, scaler,
            sampler: TokenSampler) -> tuple[int, DataCursor]:
    """Load a resume file into the run's objects after checking its signature; returns (step, next cursor)."""
    state = load_resume(path)
    check_signature(state["signature"], signature, path)
    student.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    rng = state["rng"]
    sampler.set_state(rng["sampler"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state["step"], DataCursor(**state["cursor"])


def step_metrics(step: int, epoch: int, stats, episodes: list[Episode], lr: float, rollout_s: float,
                 update_s: float) -> dict:
    """The per-step record written to the console and the metrics JSONL."""
    tokens = sum(episode.assistant_tokens for episode in episodes)
    return {
        "step": step, "epoch": epoch, "loss": stats.loss, "kl": stats.kl, "aux_loss": stats.aux_loss,
        "mean_turns": sum(len(e.turns) for e in episodes) / len(episodes),
        "tool_calls": sum(e.tool_calls for e in episodes), "tool_errors": sum(e.tool_errors for e in episodes),
        "assistant_tokens": tokens, "episodes": len(episodes),
        "truncated_fraction": sum(e.truncated for e in episodes) / len(episodes),
        "tokens_per_s": tokens / (rollout_s + update_s), "lr": lr, "grad_norm": stats.grad_norm,
        "rollout_s": rollout_s, "update_s": update_s,
    }


def _run_dir(out_dir: str) -> Path:
    """Hydra's run directory under ``python opd/train.py``; ``out_dir`` when called without Hydra (tests)."""
    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(out_dir)


def run(cfg: DictConfig) -> dict:
    """Train the student by on-policy distillation as configured; returns the run summary."""
    validate_settings(cfg)
    sampling = SamplingSettings.from_config(cfg.sampling)
    precision = resolve_precision(cfg.device, cfg.dtype)
    torch.manual_seed(cfg.seed)
    records, data_sha256 = load_agent_records(cfg.data)
    student, tokenizer = load_model(cfg.student, role="student")
    teacher, teacher_tokenizer = load_model(cfg.teacher, role="teacher")
    check_same_tokenizer(teacher_tokenizer, tokenizer)
    check_pair(teacher, student, cfg.max_total_len)
    limits = RolloutLimits(cfg.max_turns, cfg.max_gen_len, cfg.max_total_len)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.open_thinking)
    for record in records:  # fail before any compute if one prompt cannot fit
        chat_format.prompt_ids(record, limits.max_total_len)
    student.to(precision.device)
    freeze(teacher).to(precision.device)
    sampler = TokenSampler(sampling, precision.device, cfg.seed)
    rollout = AgentRollout(student, chat_format, sampler, limits, autocast=precision.autocast)
    batches = EpochBatches(len(records), batch_size=cfg.batch_size, accumulation_steps=cfg.accumulation_steps,
                           epochs=cfg.epochs, seed=cfg.seed)
    total_steps = min(cfg.max_steps, batches.total_windows) if cfg.max_steps else batches.total_windows
    schedule_steps = cfg.lr_schedule_steps or total_steps
    optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_scheduler(SCHEDULERS[cfg.lr_scheduler], optimizer, num_warmup_steps=cfg.warmup_steps,
                              num_training_steps=schedule_steps)
    scaler = precision.grad_scaler()
    signature = run_signature(cfg, teacher=teacher, student=student, tokenizer=tokenizer, data_sha256=data_sha256,
                              sampling=sampling, schedule_steps=schedule_steps, precision=precision)
    step, cursor = 0, DataCursor()
    if cfg.resume:
        step, cursor = restore(cfg.resume, signature, student=student, optimizer=optimizer, scheduler=scheduler,
                               scaler=scaler, sampler=sampler)
    settings = DistillSettings(cfg.distill_temperature, cfg.kl_direction, cfg.grad_clip)
    run_dir, start_step, saved_step = _run_dir(cfg.out_dir), step, step
    paths: tuple[Path, Path] | tuple[None, None] = (None, None)

    def checkpoint() -> tuple[Path, Path]:
        return save_checkpoint(cfg.out_dir, student, {
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "step": step, "cursor": asdict(cursor), "rng": rng_state(sampler), "signature": signature})

    losses, tokens, started = [], 0, time.perf_counter()
    with TrainLog(run_dir / "metrics.jsonl", total_steps=total_steps, start_step=step) as log:
        while step < total_steps and (window := batches.window(cursor)) is not None:
            indices, next_cursor = window
            lr = optimizer.param_groups[0]["lr"]
            began = time.perf_counter()
            micro_batches = [rollout.run([records[i] for i in batch]) for batch in indices]
            rolled = time.perf_counter()
            stats = distill_update(micro_batches, student=student, teacher=teacher, optimizer=optimizer,
                                   scheduler=scheduler, scaler=scaler, settings=settings, precision=precision,
                                   pad_token_id=tokenizer.pad_token_id)
            epoch, step, cursor = cursor.epoch, step + 1, next_cursor
            metrics = step_metrics(step, epoch, stats, [e for batch in micro_batches for e in batch], lr,
                                   rolled - began, time.perf_counter() - rolled)
            log.step(metrics)
            losses.append(stats.loss)
            tokens += metrics["assistant_tokens"]
            if step % cfg.save_interval == 0:
                paths, saved_step = checkpoint(), step
        if step > saved_step:
            paths = checkpoint()
    wall = time.perf_counter() - started
    summary = {
        "steps": step, "steps_this_run": step - start_step, "final_loss": losses[-1] if losses else None,
        "mean_loss": sum(losses) / len(losses) if losses else None, "assistant_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0, "wall_s": wall, "device": str(precision.device),
        "dtype": precision.dtype_name, "weights": str(paths[0]) if paths[0] else None,
        "resume_file": str(paths[1]) if paths[1] else None, "metrics": str(run_dir / "metrics.jsonl"),
    }
    print_summary(summary)
    write_json(run_dir / "summary.json", summary)
    write_json(Path(cfg.out_dir) / f"{checkpoint_stem(student)}_summary.json", summary)
    return summary
