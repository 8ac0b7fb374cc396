"""The optimizer-step loop every trainer here shares: data windows, AdamW + schedule, exact resume, checkpoints, logs.

A trainer (OPD on the student's rollouts, its fixed-data baseline, plain SFT) supplies how a micro-batch of
record indices becomes finished episodes and how a window of episodes becomes one optimizer update; this
module owns the rest. Each optimizer step takes the next accumulation window of ``EpochBatches``;
``max_steps`` counts all optimizer steps of the run, resumed ones included. Checkpoints (inference weights
and a full resume file) are written atomically after complete updates, every ``save_interval`` steps and
at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import get_scheduler

from opd.atomic_write import atomic_write_json
from opd.checkpoints import check_signature, checkpoint_stem, load_resume, save_checkpoint
from opd.data_order import DataCursor, EpochBatches
from opd.episodes import Episode
from opd.minimind.precision import Precision
from opd.sampling import TokenSampler
from opd.train_log import TrainLog, print_summary

SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
# optimization settings copied verbatim into a resume signature (a continuation must share them)
OPTIMIZATION_KEYS = ("seed", "batch_size", "accumulation_steps", "learning_rate", "weight_decay", "lr_scheduler",
                     "warmup_steps", "grad_clip")

FetchEpisodes = Callable[[list[int]], list[Episode]]
# called as update(micro_batches, optimizer=, scheduler=, scaler=) -> a dataclass of the update's figures
# with at least ``loss``
UpdateFn = Callable[..., object]


def validate_optimization(cfg: DictConfig) -> None:
    """Refuse out-of-range optimization settings before any model is loaded, naming the key."""
    for key in ("batch_size", "accumulation_steps", "epochs", "save_interval"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {cfg[key]!r}")
    for key in ("max_steps", "lr_schedule_steps"):
        if cfg[key] is not None and (not isinstance(cfg[key], int) or cfg[key] < 1):
            raise ValueError(f"{key} must be null or an integer >= 1, got {cfg[key]!r}")
    if not isinstance(cfg.warmup_steps, int) or cfg.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an integer >= 0, got {cfg.warmup_steps!r}")
    for key, allow_zero in (("learning_rate", False), ("weight_decay", True)):
        value = cfg[key]
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"{key} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
    if cfg.grad_clip is not None and not cfg.grad_clip > 0:
        raise ValueError(f"grad_clip must be null or > 0, got {cfg.grad_clip!r}")
    if cfg.lr_scheduler not in SCHEDULERS:
        raise ValueError(f"lr_scheduler must be one of {tuple(SCHEDULERS)}, got {cfg.lr_scheduler!r}")


@dataclass(frozen=True)
class StepPlan:
    """Which records each update uses, how many updates the run makes, and the steps the schedule spans."""

    batches: EpochBatches
    total_steps: int
    schedule_steps: int

    def record_indices(self, cursor: DataCursor, steps: int) -> list[int]:
        """Every record index the next ``steps`` updates from ``cursor`` use, in order of use."""
        indices: list[int] = []
        for _ in range(steps):
            window = self.batches.window(cursor)
            if window is None:
                break
            batches, cursor = window
            indices += [index for batch in batches for index in batch]
        return indices


def plan_steps(cfg: DictConfig, num_records: int) -> StepPlan:
    """The run's data order and step counts from its batch, epoch and step settings."""
    batches = EpochBatches(num_records, batch_size=cfg.batch_size, accumulation_steps=cfg.accumulation_steps,
                           epochs=cfg.epochs, seed=cfg.seed)
    total_steps = min(cfg.max_steps, batches.total_windows) if cfg.max_steps else batches.total_windows
    return StepPlan(batches, total_steps, cfg.lr_schedule_steps or total_steps)


def rng_state(sampler: TokenSampler | None) -> dict:
    """Every RNG the loop consumes: rollout sampling (if any), plus torch's global CPU/CUDA generators."""
    return {"sampler": sampler.get_state() if sampler is not None else None, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore(path: str, signature: dict, *, model, optimizer, scheduler, scaler,
            sampler: TokenSampler | None) -> tuple[int, DataCursor]:
    """Load a resume file into the run's objects after checking its signature; returns (step, next cursor)."""
    state = load_resume(path)
    check_signature(state["signature"], signature, path)
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    rng = state["rng"]
    if sampler is not None:
        sampler.set_state(rng["sampler"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state["step"], DataCursor(**state["cursor"])


def step_metrics(step: int, epoch: int, stats, episodes: list[Episode], lr: float, fetch_s: float,
                 update_s: float, fetch_key: str) -> dict:
    """The per-step record written to the console and the metrics JSONL (``stats``: the update's dataclass)."""
    tokens = sum(episode.assistant_tokens for episode in episodes)
    return {
        "step": step, "epoch": epoch, **asdict(stats),
        "mean_turns": sum(len(e.turns) for e in episodes) / len(episodes),
        "tool_calls": sum(e.tool_calls for e in episodes), "tool_errors": sum(e.tool_errors for e in episodes),
        "assistant_tokens": tokens, "episodes": len(episodes),
        "truncated_fraction": sum(e.truncated for e in episodes) / len(episodes),
        "tokens_per_s": tokens / (fetch_s + update_s), "lr": lr, fetch_key: fetch_s, "update_s": update_s,
    }


def run_dir_of(out_dir: str) -> Path:
    """Hydra's run directory under a Hydra entrypoint; ``out_dir`` when called without Hydra (tests)."""
    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(out_dir)


def run_updates(cfg: DictConfig, *, model: torch.nn.Module, plan: StepPlan, signature: dict, fetch: FetchEpisodes,
                update: UpdateFn, precision: Precision, sampler: TokenSampler | None = None, label: str = "opd",
                checkpoint_prefix: str = "agent_opd", fetch_key: str = "rollout_s") -> dict:
    """Train ``model`` for the planned steps (continuing ``cfg.resume`` if set); returns the run summary.

    ``fetch`` turns a micro-batch of record indices into finished episodes (rollouts or fixed sequences;
    its time is logged under ``fetch_key``), ``update`` makes one optimizer update from a window of them.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_scheduler(SCHEDULERS[cfg.lr_scheduler], optimizer, num_warmup_steps=cfg.warmup_steps,
                              num_training_steps=plan.schedule_steps)
    scaler = precision.grad_scaler()
    step, cursor = 0, DataCursor()
    if cfg.resume:
        step, cursor = restore(cfg.resume, signature, model=model, optimizer=optimizer, scheduler=scheduler,
                               scaler=scaler, sampler=sampler)
    run_dir, start_step, saved_step = run_dir_of(cfg.out_dir), step, step
    paths: tuple[Path, Path] | tuple[None, None] = (None, None)

    def checkpoint() -> tuple[Path, Path]:
        return save_checkpoint(cfg.out_dir, model, {
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "step": step, "cursor": asdict(cursor), "rng": rng_state(sampler), "signature": signature},
            prefix=checkpoint_prefix)

    losses, tokens, started = [], 0, time.perf_counter()
    with TrainLog(run_dir / "metrics.jsonl", total_steps=plan.total_steps, start_step=step, label=label) as log:
        while step < plan.total_steps and (window := plan.batches.window(cursor)) is not None:
            indices, next_cursor = window
            lr = optimizer.param_groups[0]["lr"]
            began = time.perf_counter()
            micro_batches = [fetch(batch) for batch in indices]
            fetched = time.perf_counter()
            stats = update(micro_batches, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
            epoch, step, cursor = cursor.epoch, step + 1, next_cursor
            metrics = step_metrics(step, epoch, stats, [e for batch in micro_batches for e in batch], lr,
                                   fetched - began, time.perf_counter() - fetched, fetch_key)
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
    print_summary(summary, title=f"{label} summary")
    atomic_write_json(run_dir / "summary.json", summary)
    atomic_write_json(Path(cfg.out_dir) / f"{checkpoint_stem(model, checkpoint_prefix)}_summary.json", summary)
    return summary
