"""Where an entry's metrics go: ``metrics.jsonl`` in the run folder always, and TensorBoard (``tensorboard/``) and W&B
(``wandb/``) when ``logger.backends`` lists them. One ``log`` call is one row at one step; its numbers go to the other
backends as ``{prefix}/{key}`` scalars. Only the logging process (rank 0) makes one; a W&B run ends with the run's exit
status, so an error or signal shows it as failed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from common.atomic_write import no_space
from common.user_errors import exit_status
from opd.config import LoggerConfig


class MetricLoggers:
    """Context manager over ``run_dir``'s loggers; ``config`` is the W&B run's config."""

    def __init__(self, settings: LoggerConfig, run_dir: Path, *, config: dict | None = None):
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.config = config or {}
        self.metrics_path = self.run_dir / "metrics.jsonl"

    def __enter__(self) -> MetricLoggers:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = self.metrics_path.open("ab", buffering=0)  # unbuffered: a line is on disk whole, or not at all
        self._tensorboard = self._wandb = None
        if "tensorboard" in self.settings.backends:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if "wandb" in self.settings.backends:
            import wandb

            wandb_settings = self.settings.wandb
            self._wandb = wandb.init(project=wandb_settings.project, name=wandb_settings.name,
                                     mode=wandb_settings.mode, dir=str(self.run_dir), config=self.config)
        return self

    def locations(self) -> dict[str, str]:
        """Where the listed backends write (``tensorboard``, ``wandb``), for the run summary."""
        backends = self.settings.backends
        return {name: str(self.run_dir / name) for name in ("tensorboard", "wandb") if name in backends}

    def __exit__(self, exc_type, error, traceback) -> None:
        self._jsonl.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:  # W&B shows a run that ended by an error or a signal as failed, not finished
            self._wandb.finish(exit_code=exit_status(error))

    def _append(self, line: bytes) -> None:
        """``line`` at the end of ``metrics.jsonl``; a full disk truncates what it wrote of it (a resume appends after
        whole lines) and raises ``no_space``."""
        end, written = self._jsonl.tell(), 0
        try:
            while written < len(line):
                written += self._jsonl.write(line[written:])
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            os.ftruncate(self._jsonl.fileno(), end)
            raise no_space(self.metrics_path, len(line)) from None

    def log(self, row: dict, *, step: int, prefix: str) -> None:
        """One row at ``step``, whole to ``metrics.jsonl``; its numbers as ``{prefix}/{key}`` scalars to the backends."""
        self._append(json.dumps(row).encode() + b"\n")
        scalars = {f"{prefix}/{key}": value for key, value in row.items()
                   if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)}
        if self._tensorboard is not None:
            for tag, value in scalars.items():
                self._tensorboard.add_scalar(tag, value, global_step=step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
