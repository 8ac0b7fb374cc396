"""What a training run logs and reports: each step's figures from its episodes, the step lines, loggers and progress
bar (``TrainLog``), the broken-turn warning (``BrokenTurnWatch``), and the run summary."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from rich.table import Table

from common.atomic_write import atomic_write_json
from common.run_log import RUN_LOG, progress_bar, show
from opd.config import LoggerConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import Episode
from opd.episodes.scoring import score_episode
from opd.reports.charts import write_training_curves
from opd.training.metric_loggers import MetricLoggers


def run_dir_of(out_dir: str) -> Path:
    """Hydra's run directory under a Hydra entrypoint; ``out_dir`` when called without Hydra (tests)."""
    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(out_dir)


def episode_counts(episodes: list[Episode], chat_format: ChatFormat) -> dict[str, int]:
    """Sums over a step's episodes on one rank: episodes, turns, tool calls and errors, generated and teacher tokens,
    truncated, graded and correct, and the targets of trained, broken and masked turns."""
    graded = [score_episode(e, chat_format).correct for e in episodes if e.record.gt]
    targets = [e.target_counts() for e in episodes]  # (of trained turns, broken, left out) per episode
    return {"episodes": len(episodes), "turns": sum(len(e.turns) for e in episodes),
            "tool_calls": sum(e.tool_calls for e in episodes), "tool_errors": sum(e.tool_errors for e in episodes),
            "assistant_tokens": sum(e.assistant_tokens for e in episodes),
            "teacher_tokens": sum(e.teacher_tokens for e in episodes), "truncated": sum(e.truncated for e in episodes),
            "graded": len(graded), "correct": sum(graded), "turn_targets": sum(t[0] for t in targets),
            "broken_targets": sum(t[1] for t in targets), "masked_targets": sum(t[2] for t in targets)}


def episode_figures(counts: dict) -> dict:
    """What a step's episodes looked like, from their counts summed over ranks (``episode_counts``)."""
    episodes = counts["episodes"]
    return {"mean_turns": counts["turns"] / episodes, "tool_calls": int(counts["tool_calls"]),
            "tool_errors": int(counts["tool_errors"]), "assistant_tokens": int(counts["assistant_tokens"]),
            "teacher_token_share": counts["teacher_tokens"] / counts["assistant_tokens"] if counts["assistant_tokens"] else 0.0,
            "episodes": int(episodes), "truncated_fraction": counts["truncated"] / episodes,
            "answer_accuracy": counts["correct"] / counts["graded"] if counts["graded"] else None,
            "broken_target_share": counts["broken_targets"] / counts["turn_targets"] if counts["turn_targets"] else 0.0,
            "masked_targets": int(counts["masked_targets"])}


def run_summary(*, step: int, start_step: int, losses: list[float], tokens: int, wall: float, precision,
                paths: tuple, run_dir: Path) -> dict:
    """What a training run reports at its end (also written as JSON beside its run directory and checkpoints)."""
    return {"steps": step, "steps_this_run": step - start_step, "final_loss": losses[-1] if losses else None,
            "mean_loss": sum(losses) / len(losses) if losses else None, "assistant_tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0, "wall_s": wall, "device": str(precision.device),
            "dtype": precision.dtype_name, "weights": str(paths[0]) if paths[0] else None,
            "resume_file": str(paths[1]) if paths[1] else None, "metrics": str(run_dir / "metrics.jsonl")}


class TrainLog:
    """Context manager around the step loop: metrics to the loggers and lines to the run log, under a progress bar."""

    def __init__(self, run_dir: Path, logger: LoggerConfig, *, total_steps: int, start_step: int, label: str = "opd",
                 enabled: bool = True, config: dict | None = None):
        self.enabled = enabled  # False on every training process but rank 0: nothing shown, nothing written
        self.run_dir = Path(run_dir)
        self.loggers = MetricLoggers(logger, self.run_dir, config=config)
        self.label = label
        self.rows: list[dict] = []  # this run's steps, for the curves
        self.progress = progress_bar(label, "loss {task.fields[loss]}  {task.fields[tokens_per_s]} tok/s  "
                                     "turns {task.fields[turns]}  trunc {task.fields[truncated]}")
        self.task = self.progress.add_task("steps", total=total_steps, completed=start_step,
                                           loss="-", tokens_per_s="-", turns="-", truncated="-")

    def __enter__(self) -> TrainLog:
        if self.enabled:
            self.loggers.__enter__()
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.progress.stop()
            self.loggers.__exit__(*exc)

    def step(self, metrics: dict) -> None:
        """Record one optimizer step's metrics (a flat dict with at least the figures the bar shows)."""
        if not self.enabled:
            return
        self.loggers.log(metrics, step=metrics["step"], prefix="train")
        self.rows.append(metrics)
        self.progress.update(self.task, completed=metrics["step"], loss=f"{metrics['loss']:.4f}",
                             tokens_per_s=f"{metrics['tokens_per_s']:.1f}", turns=f"{metrics['mean_turns']:.2f}",
                             truncated=f"{metrics['truncated_fraction']:.2f}")
        show(f"step {metrics['step']}  loss {metrics['loss']:.5f}  turns {metrics['mean_turns']:.2f}  "
             f"calls {metrics['tool_calls']}  tokens {metrics['assistant_tokens']}  "
             f"trunc {metrics['truncated_fraction']:.2f}  broken {metrics['broken_target_share']:.2f}  "
             f"{metrics['tokens_per_s']:.1f} tok/s  lr {metrics['lr']:.3g}"
             + (f"  masked {metrics['masked_targets']}" if metrics["masked_targets"] else "")
             + ("" if metrics.get("answer_accuracy") is None else f"  correct {metrics['answer_accuracy']:.2f}"))

    def warn(self, line: str) -> None:
        """One warning line to the run log (rank 0 only)."""
        if self.enabled:
            RUN_LOG.warning(line)

    def summary(self, summary: dict, paths: list[Path]) -> None:
        """Write the training curves (``curves``: PNG or None), show the summary table, write it as JSON to ``paths``."""
        curves = write_training_curves(self.rows, self.run_dir / "training_curves.png", title=f"{self.label} training")
        summary["curves"] = str(curves) if curves else None
        summary.update(self.loggers.locations())  # tensorboard --logdir ..., the W&B run's folder
        table = Table(title=f"{self.label} summary", show_header=False)
        for key, value in summary.items():
            table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
        show(table)
        for path in paths:
            atomic_write_json(path, summary)


class BrokenTurnWatch:
    """One warning per run when on-policy forward KL trains on a high (``LIMIT``) or sharply rising (``RISE`` times the
    first ``BASELINE_STEPS``, and ``MIN_RISE`` above them) share of targets in broken turns, averaged over the last
    ``WINDOW`` steps. Forward KL counts such positions in full and broke students in the study (``opd/README.md``)."""

    LIMIT, RISE, MIN_RISE, BASELINE_STEPS, WINDOW = 0.2, 3.0, 0.1, 5, 3

    def __init__(self) -> None:
        self.shares: list[float] = []
        self.warned = False

    def check(self, step: int, share: float) -> str | None:
        """The warning for step ``step`` whose broken-target share is ``share``, or None."""
        self.shares.append(share)
        if self.warned or len(self.shares) < self.WINDOW:
            return None
        recent = sum(self.shares[-self.WINDOW:]) / self.WINDOW
        first = self.shares[:self.BASELINE_STEPS]
        baseline = sum(first) / len(first)
        rose = len(self.shares) > self.BASELINE_STEPS and recent >= max(self.RISE * baseline, baseline + self.MIN_RISE)
        if recent < self.LIMIT and not rose:
            return None
        self.warned = True
        return (f"warning: step {step}: {recent:.0%} of the targets of the last {self.WINDOW} steps are in broken turns "
                f"(unreadable tool calls, or cut at rollout.max_gen_len; {baseline:.0%} in the first steps): on-policy "
                "forward KL pushes hardest there and broke students in the study; try loss.kl_direction=reverse_kl or "
                "loss.mask_broken_turns=true")
