"""The live ``rich`` progress bar of a regen run (and plain status lines when output is not a terminal)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from common.endpoints.endpoint_pool import Endpoint
from regen.outputs.run_stats import RunStats


def endpoint_load(endpoint: Endpoint) -> str:
    """``in flight now/mean[/limit] and tok/s`` of one endpoint, e.g. ``127.0.0.1:8000 37/30.2/40 1234 tok/s``."""
    limit = "" if endpoint.limit is None else f"/{endpoint.limit}"
    name = endpoint.chat_target.host + (f":{endpoint.chat_target.port}" if endpoint.chat_target.port else "")
    return f"{name} {endpoint.active}/{endpoint.mean_in_flight():.1f}{limit} {endpoint.generation_rate():.0f} tok/s"


def status_line(stats: RunStats, endpoints: list[Endpoint]) -> str:
    """One line: done / failed / truncated / rows / requests per s / tokens per s, then each endpoint's load."""
    requests = sum(endpoint.requests for endpoint in endpoints)
    return (
        f"done {stats.done} failed {stats.failed} trunc {sum(stats.truncated.values())} "
        f"bad-input {stats.input_errors} rows {stats.rows} | "
        f"{stats.rate(requests):.1f} req/s {stats.rate(stats.completion_tokens):.0f} tok/s | in flight "
        + ", ".join(endpoint_load(endpoint) for endpoint in endpoints)
    )


def to_do(total: int | None, already_done: int) -> int | None:
    """The conversations this run has left: ``total`` records less those an earlier run finished."""
    return None if total is None else max(total - already_done, 0)


class _StatsColumn(ProgressColumn):
    def __init__(self, stats: RunStats, endpoints: list[Endpoint]):
        super().__init__()
        self.stats, self.endpoints = stats, endpoints

    def render(self, task: Task) -> Text:
        return Text(f"{counted(self.stats, task)} | {status_line(self.stats, self.endpoints)}")


def dealt_with(stats: RunStats) -> int:
    """The conversations this run has dealt with so far (done, failed or refused; not those a resume skipped)."""
    return stats.handled - stats.skipped_done


def counted(stats: RunStats, task: Task) -> str:
    """``dealt with/total`` (without ``/total`` when unknown), from the live counters, as the status line is."""
    completed = dealt_with(stats)
    return f"{completed}" + (f"/{max(task.total, completed):.0f}" if task.total is not None else "")


class ProgressView:
    """A bar over the conversations this run deals with (resume's skipped ones not counted), with the time remaining
    at the last 30 s's rate and the live counters."""

    def __init__(self, stats: RunStats, endpoints: list[Endpoint], total: int | None,
                 console: Console | None = None, log_every_s: float = 60.0):
        self.console = console or Console(stderr=True)
        self.stats, self.endpoints, self.log_every_s = stats, endpoints, log_every_s
        self.progress = Progress(
            SpinnerColumn(), "[bold]regen", BarColumn(bar_width=20), _StatsColumn(stats, endpoints),
            TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, refresh_per_second=2,
        )
        self.task = self.progress.add_task("regen", total=total)

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.update()
        self.progress.stop()

    def update(self) -> None:
        """Move the bar to the conversations dealt with so far, raising the total if the count passes it."""
        completed = dealt_with(self.stats)
        total = self.progress.tasks[self.task].total
        self.progress.update(self.task, completed=completed,
                             **({"total": completed} if total is not None and completed > total else {}))

    def log_line(self) -> str:
        """The status line printed off a terminal: the count, the time remaining when known, the counters."""
        task = self.progress.tasks[self.task]
        remaining = task.time_remaining
        eta = "" if remaining is None else f" eta {timedelta(seconds=round(remaining))}"
        return f"[regen] {counted(self.stats, task)}{eta} | {status_line(self.stats, self.endpoints)}"

    async def follow(self, period_s: float = 0.5) -> None:
        """Forever: move the bar; off a terminal, also print :meth:`log_line` every ``log_every_s``."""
        since_log = 0.0
        while True:
            await asyncio.sleep(period_s)
            self.update()
            since_log += period_s
            if not self.console.is_terminal and since_log >= self.log_every_s:
                since_log = 0.0
                self.console.print(self.log_line(), markup=False, highlight=False, soft_wrap=True)
