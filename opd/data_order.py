"""Which records each optimizer update uses: a seeded shuffle per epoch, micro-batches, accumulation windows.

Epoch ``e`` visits the records in ``randperm(n)`` seeded with ``seed + e``, cut into micro-batches of
``batch_size`` (the last one may be short) and windows of ``accumulation_steps`` micro-batches (the last
window of an epoch may be partial). A ``DataCursor`` (epoch, next micro-batch) is all a resume needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DataCursor:
    """The next micro-batch to train on."""

    epoch: int = 0
    batch: int = 0


class EpochBatches:
    """Deterministic record order and update windows over ``epochs`` passes of ``num_records`` records."""

    def __init__(self, num_records: int, *, batch_size: int, accumulation_steps: int, epochs: int, seed: int) -> None:
        self.num_records = num_records
        self.batch_size = batch_size
        self.accumulation_steps = accumulation_steps
        self.epochs = epochs
        self.seed = seed

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(self.num_records / self.batch_size)

    @property
    def windows_per_epoch(self) -> int:
        return math.ceil(self.batches_per_epoch / self.accumulation_steps)

    @property
    def total_windows(self) -> int:
        return self.epochs * self.windows_per_epoch

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_records, generator=generator).tolist()

    def window(self, cursor: DataCursor) -> tuple[list[list[int]], DataCursor] | None:
        """Record indices of each micro-batch of the update at ``cursor`` and the cursor after it; None when done."""
        if cursor.epoch >= self.epochs:
            return None
        order = self.order(cursor.epoch)
        end = min(cursor.batch + self.accumulation_steps, self.batches_per_epoch)
        batches = [order[b * self.batch_size:(b + 1) * self.batch_size] for b in range(cursor.batch, end)]
        following = DataCursor(cursor.epoch, end) if end < self.batches_per_epoch else DataCursor(cursor.epoch + 1, 0)
        return batches, following
