"""Training progress: a rich progress bar, one console line and one flushed JSONL line per optimizer step."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table


class TrainLog:
    """Context manager around the step loop; ``metrics_path`` receives one JSON object per step."""

    def __init__(self, metrics_path: Path, *, total_steps: int, start_step: int, console: Console | None = None,
                 label: str = "opd"):
        self.metrics_path = Path(metrics_path)
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        self.console = console or Console()
        self.progress = Progress(
            TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tokens_per_s]} tok/s  turns {task.fields[turns]}  "
                       "trunc {task.fields[truncated]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
        self.task = self.progress.add_task("steps", total=total_steps, completed=start_step,
                                           loss="-", tokens_per_s="-", turns="-", truncated="-")

    def __enter__(self) -> TrainLog:
        self._stream = self.metrics_path.open("a", encoding="utf-8")
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()
        self._stream.close()

    def step(self, metrics: dict) -> None:
        """Record one optimizer step's metrics (a flat dict with at least the figures the bar shows)."""
        self._stream.write(json.dumps(metrics) + "\n")
        self._stream.flush()
        self.progress.update(self.task, completed=metrics["step"], loss=f"{metrics['loss']:.4f}",
                             tokens_per_s=f"{metrics['tokens_per_s']:.1f}", turns=f"{metrics['mean_turns']:.2f}",
                             truncated=f"{metrics['truncated_fraction']:.2f}")
        self.progress.console.print(
            f"step {metrics['step']}  loss {metrics['loss']:.5f}  turns {metrics['mean_turns']:.2f}  "
            f"calls {metrics['tool_calls']}  tokens {metrics['assistant_tokens']}  "
            f"trunc {metrics['truncated_fraction']:.2f}  {metrics['tokens_per_s']:.1f} tok/s  lr {metrics['lr']:.3g}")


def print_summary(summary: dict, console: Console | None = None, title: str = "opd summary") -> None:
    """The end-of-run summary as a two-column table."""
    table = Table(title=title, show_header=False)
    for key, value in summary.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    (console or Console()).print(table)

