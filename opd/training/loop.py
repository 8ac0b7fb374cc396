"""The training loop of every trainer: ``opd/train.py`` and ``opd/sft.py`` are recipes that supply only their step.

A ``Recipe`` gives each window's episodes (``collect``) and one packed micro-batch's loss (summed over its targets).
Per window ``fit`` collects, averages the loss over every target of the global window (gradients synced on the last
micro-batch only), takes one clipped step, logs, and saves every ``save_interval`` steps and at the end. Only rank 0
logs and writes files.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.minimind.model import enable_activation_checkpointing
from common.run_folders import checks_passed
from common.user_errors import UserError
from opd.config import TrainingRunConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import Episode, PackedBatch, pack_episodes
from opd.training.checkpoints import (
    check_out_dir,
    checkpoint_stem,
    restore,
    rng_state,
    run_signature,
    save_checkpoint,
)
from opd.training.data_order import DataCursor, DataOrder, Window
from opd.training.distributed import (
    Ranks,
    check_batch_divides,
    data_parallel,
    gradient_sync,
    idle_loss,
    start,
    stop,
    unwrap,
)
from opd.training.loss import TargetLogits
from opd.training.optimization import Optimization
from opd.training.stop_and_save import StepAbandoned, stopping
from opd.training.train_log import TrainLog, episode_counts, episode_figures, run_dir_of, run_summary

LossStep = Callable[[torch.nn.Module, list[Episode], PackedBatch], tuple[torch.Tensor, torch.Tensor | None]]


class Recipe(ABC):
    """One trainer's step: the episodes of each window and the loss of each micro-batch."""

    name: str  # the progress bar's label and the summary's title ("opd", "sft")
    loss_name: str  # the metric of the loss averaged over the window's targets ("kl", "cross_entropy")
    collect_time: str | None = None  # the metric of the time ``collect`` took ("rollout_s", "data_s"), if any
    sampler = None  # the rollouts' token sampler, whose state each resume file keeps (None: this step samples nothing)
    chat_format: ChatFormat  # the episodes' chat template (scoring, the pad token)

    @abstractmethod
    def collect(self, window: Window, stop: Callable[[], bool]) -> list[list[Episode]]:
        """This rank's episodes of each micro-batch of ``window`` (its ``Ranks.share`` of the global micro-batch);
        a wait on a server raises ``StepAbandoned`` once ``stop()`` is true."""

    @abstractmethod
    def loss(self, forward: torch.nn.Module, episodes: list[Episode], batch: PackedBatch):
        """One micro-batch on the device: (loss summed over its targets, weighted router loss or None)."""

    def metrics(self, step: int) -> dict:
        """The recipe's own figures of step ``step`` for its metrics line."""
        return {}

    def warning(self, metrics: dict) -> str | None:
        """A warning line about the step whose metrics line is ``metrics`` (shown by rank 0), or None."""
        return None


@dataclass(frozen=True)
class Update:
    """What one optimizer step did: this rank's part of the window's mean loss and router loss (the parts add up),
    the window's targets over every rank, the learning rate, the gradient norm."""

    loss: float
    aux: float
    targets: float
    lr: float
    grad_norm: float


@dataclass(frozen=True)
class Learner:
    """The trained model as this rank updates it: its forward (DDP-wrapped under torchrun) and its optimization."""

    forward: torch.nn.Module
    optimization: Optimization
    ranks: Ranks
    device: torch.device

    def update(self, micro_batches: list[list[Episode]], loss_step: LossStep, pad_token_id: int) -> Update:
        """Accumulate the gradient of ``loss_step``'s loss averaged over every target of the global window, one
        micro-batch at a time, then take one clipped optimizer step."""
        ranks = self.ranks
        packed = [pack_episodes(episodes, pad_token_id) if episodes else None for episodes in micro_batches]
        (targets,) = ranks.sum([sum(batch.target_count for batch in packed if batch is not None)])
        if not targets:  # every target of the window was left out as broken (on every rank alike)
            lr = self.optimization.lr
            return Update(0.0, 0.0, 0, lr, self.optimization.skip())
        total, aux = 0.0, 0.0
        unwrap(self.forward).train()
        for index, (episodes, batch) in enumerate(zip(micro_batches, packed, strict=True)):
            with gradient_sync(self.forward, last=index == len(packed) - 1):
                if batch is None:  # this rank's share of a short micro-batch is empty: join the gradient sum
                    self.optimization.backward(idle_loss(self.forward, pad_token_id, self.device))
                    continue
                summed, router = loss_step(self.forward, episodes, batch.to(self.device))
                # DDP averages the ranks' gradients: scaled by the world size they add up to the window's mean
                loss = summed / targets * ranks.world_size
                if router is not None:
                    router = router * (batch.target_count / targets * ranks.world_size)
                    loss, aux = loss + router, aux + router.item() / ranks.world_size
                self.optimization.backward(loss)
                total += summed.item() / targets
        lr = self.optimization.lr
        return Update(total, aux, targets, lr, self.optimization.step())


class TrainingRun:
    """One run of a recipe under ``cfg`` (the settings every training entry shares); see the module doc."""

    def __init__(self, cfg: TrainingRunConfig) -> None:
        self.entered = time.perf_counter()  # metrics' elapsed_s: loading included
        self.cfg = cfg
        self.ranks = start(cfg.precision.device)
        self.device = self.ranks.device(cfg.precision.device)
        check_batch_divides(cfg.batch_size, self.ranks)
        self.stem: str | None = None  # the checkpoints' name and the resume signature, once ``claim`` has checked them
        self.resume_signature: dict = {}

    def data_order(self, records: int) -> DataOrder:
        """The windows of ``records`` records under the run's batch size, accumulation, epochs, seed and step cap."""
        cfg = self.cfg
        return DataOrder(records, batch_size=cfg.batch_size, accumulation_steps=cfg.accumulation_steps,
                         epochs=cfg.epochs, seed=cfg.seed, max_steps=cfg.max_steps)

    def schedule_steps(self, order: DataOrder) -> int:
        """The learning-rate schedule's span: ``optim.lr_schedule_steps``, else the run's steps."""
        return self.cfg.optim.lr_schedule_steps or order.total_steps

    def signature(self, order: DataOrder, settings: dict, *, models: dict, fingerprints: dict) -> dict:
        """What a resumed run must share: the loop's settings (seed, batch, accumulation, world size, dtype, optimizer,
        resolved schedule span) and the recipe's ``settings``, ``models`` and ``fingerprints``; the rest may change."""
        cfg = self.cfg
        return run_signature(
            {"seed": cfg.seed, "batch_size": cfg.batch_size, "accumulation_steps": cfg.accumulation_steps,
             "world_size": self.ranks.world_size, "dtype": cfg.precision.dtype_name,
             "lr_schedule_steps": self.schedule_steps(order), "optim": cfg.optim, **settings},
            models=models, fingerprints=fingerprints)

    def claim(self, model: torch.nn.Module, prefix: str, signature: dict) -> None:
        """Name the run's checkpoints, refuse another run's in ``out_dir``, keep ``signature``; checks have passed."""
        cfg = self.cfg
        self.stem, self.resume_signature = checkpoint_stem(model, prefix), signature
        check_out_dir(cfg.out_dir, self.stem, resume=cfg.resume, overwrite=cfg.overwrite)
        checks_passed()  # data, models and out_dir are checked: from here on a failure keeps the run's folders

    def fit(self, model: torch.nn.Module, order: DataOrder, recipe: Recipe, *, summary: dict | None = None) -> dict:
        """Train ``model`` over ``order``'s windows, continuing ``cfg.resume``; returns the run summary. Leaves the
        process group."""
        cfg, ranks = self.cfg, self.ranks
        if self.stem is None:
            raise RuntimeError("TrainingRun.claim checks out_dir before fit")
        model.to(self.device)
        if cfg.gradient_checkpointing:
            enable_activation_checkpointing(model)
        learner = Learner(data_parallel(TargetLogits(model), ranks, self.device),
                          Optimization(model, cfg.optim, self.schedule_steps(order), cfg.precision), ranks, self.device)
        step, cursor = 0, DataCursor()
        if cfg.resume:
            step, cursor = restore(cfg.resume, self.resume_signature, model=model, optimization=learner.optimization,
                                   sampler=recipe.sampler, rank=ranks.rank)
        run_dir, start_step, paths, losses, tokens, seen = run_dir_of(cfg.out_dir), step, (None, None), [], 0, 0
        started, saved = time.perf_counter(), step
        alone = not ranks.distributed  # one process: a step may stop waiting, and a failed one saves the one before
        with TrainLog(run_dir, cfg.logger, total_steps=order.total_steps, start_step=step, label=recipe.name,
                      enabled=ranks.is_main, config=asdict(cfg)) as log, stopping(ranks) as signals:
            for window in order.windows(cursor, step):
                began = time.perf_counter()
                before = rng_state(recipe.sampler) if alone else None  # what a resume after the last step reads
                try:
                    micro_batches = recipe.collect(window, signals.requested if alone else lambda: False)
                except (StepAbandoned, UserError) as error:
                    if not alone:
                        raise
                    if saved < step:  # the last finished step, with the RNG states it ended with
                        paths = save_checkpoint(cfg.out_dir, self.stem, model, optimization=learner.optimization,
                                                step=step, cursor=cursor, rng_states=[before],
                                                signature=self.resume_signature, keep_weights=cfg.keep_saved_weights)
                    resume = paths[1] or cfg.resume
                    if isinstance(error, StepAbandoned):
                        raise signals.interrupted(signals.caught, step, order.total_steps, resume) from None
                    kept = f"step {step} is saved: continue with resume={resume}" if resume else None
                    raise UserError(error.message, "; ".join(filter(None, (kept, error.hint))), error.details) from None
                collected = time.perf_counter()
                update = learner.update(micro_batches, recipe.loss, recipe.chat_format.pad_token_id)
                step, cursor = window.step, window.next_cursor
                metrics = self.step_metrics(window, update, micro_batches, recipe, times=(began, collected))
                log.step(metrics)
                if warning := recipe.warning(metrics):
                    log.warn(warning)
                losses.append(metrics["loss"])
                tokens += metrics["assistant_tokens"]
                seen += sum(len(episodes) for episodes in micro_batches)
                signum = signals.agreed()  # Ctrl-C or SIGTERM on any rank: this step is saved, then the run stops
                if signum or step % cfg.save_interval == 0 or step == order.total_steps:
                    rng_states = ranks.gather(rng_state(recipe.sampler))
                    if ranks.is_main:
                        paths = save_checkpoint(cfg.out_dir, self.stem, model, optimization=learner.optimization,
                                                step=step, cursor=cursor, rng_states=rng_states,
                                                signature=self.resume_signature, keep_weights=cfg.keep_saved_weights)
                    saved = step
                if signum and step < order.total_steps:
                    raise signals.interrupted(signum, step, order.total_steps, paths[1])
        result = run_summary(step=step, start_step=start_step, losses=losses, tokens=tokens,
                             wall=time.perf_counter() - started, precision=cfg.precision, paths=paths, run_dir=run_dir)
        result.update(world_size=ranks.world_size, episodes_per_rank=ranks.gather(seen), **(summary or {}))
        if ranks.is_main:
            log.summary(result, [run_dir / "summary.json", Path(cfg.out_dir) / f"{self.stem}_summary.json"])
        del learner  # DDP's reducer before the process group (see distributed.stop)
        stop(ranks)
        return result

    def step_metrics(self, window: Window, update: Update, micro_batches: list[list[Episode]], recipe: Recipe, *,
                     times: tuple[float, float]) -> dict:
        """The step's line of ``metrics.jsonl``, summed over every rank (``times``: ``perf_counter`` readings)."""
        began, collected = times
        counts = episode_counts([episode for episodes in micro_batches for episode in episodes], recipe.chat_format)
        totals = dict(zip([*counts, "loss", "aux"], self.ranks.sum([*counts.values(), update.loss, update.aux]),
                          strict=True))
        loss, aux, figures = totals.pop("loss"), totals.pop("aux"), episode_figures(totals)
        now = time.perf_counter()
        return {"step": window.step, "epoch": window.epoch, "loss": loss + aux, recipe.loss_name: loss, "aux_loss": aux,
                "grad_norm": update.grad_norm, "target_tokens": int(update.targets), **figures,
                "tokens_per_s": figures["assistant_tokens"] / (now - began), "lr": update.lr,
                **({recipe.collect_time: collected - began} if recipe.collect_time else {}),
                "update_s": now - collected, "elapsed_s": now - self.entered, **recipe.metrics(window.step)}
