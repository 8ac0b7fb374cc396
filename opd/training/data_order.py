"""Which records each optimizer step uses: epoch ``e`` visits them in ``randperm(n)`` seeded with ``seed + e``, cut
into micro-batches of ``batch_size`` and windows of ``accumulation_steps`` (either may be short at an epoch's end);
one window is one step. ``max_steps`` (resumed steps included) overrides ``epochs``. A ``DataCursor`` (epoch, next
micro-batch) is all a resume needs."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DataCursor:
    """The next micro-batch to train on."""

    epoch: int = 0
    batch: int = 0


@dataclass(frozen=True)
class Window:
    """One optimizer step's data: its 1-based step, each micro-batch's record indices, and the cursor after it."""

    step: int
    epoch: int
    batches: list[list[int]]
    next_cursor: DataCursor


class DataOrder:
    """Deterministic record order and step windows over ``epochs`` passes of ``num_records`` records."""

    def __init__(self, num_records: int, *, batch_size: int, accumulation_steps: int, epochs: int, seed: int,
                 max_steps: int | None) -> None:
        self.num_records = num_records
        self.batch_size = batch_size
        self.accumulation_steps = accumulation_steps
        self.seed = seed
        self.batches_per_epoch = math.ceil(num_records / batch_size)
        per_epoch = math.ceil(self.batches_per_epoch / accumulation_steps)
        if max_steps:  # as in transformers' Trainer, max_steps overrides epochs: as many passes as it takes
            self.epochs, self.total_steps = math.ceil(max_steps / per_epoch), max_steps
        else:
            self.epochs, self.total_steps = epochs, epochs * per_epoch

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_records, generator=generator).tolist()

    def windows(self, cursor: DataCursor = DataCursor(), step: int = 0) -> Iterator[Window]:
        """The windows from ``cursor`` (where step ``step`` left off) until the run's last step."""
        order_epoch, order = None, []
        while step < self.total_steps and cursor.epoch < self.epochs:
            if order_epoch != cursor.epoch:
                order_epoch, order = cursor.epoch, self.order(cursor.epoch)
            end = min(cursor.batch + self.accumulation_steps, self.batches_per_epoch)
            batches = [order[b * self.batch_size:(b + 1) * self.batch_size] for b in range(cursor.batch, end)]
            following = DataCursor(cursor.epoch, end) if end < self.batches_per_epoch else DataCursor(cursor.epoch + 1)
            step += 1
            yield Window(step, cursor.epoch, batches, following)
            cursor = following


def teacher_count(batch: list[int], share: float) -> int:
    """How many episodes of a micro-batch come from the teacher's rollouts: the first ``share``, rounded down."""
    return math.floor(share * len(batch) + 1e-9)  # 0.29 * 100 is 28.999...: still 29
