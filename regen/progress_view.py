"""The live ``rich`` progress bar of a regen run (and plain status lines when output is not a terminal)."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TimeElapsedColumn
from rich.text import Text

from regen.endpoint_pool import Endpoint
from regen.run_stats import RunStats


def endpoint_load(endpoint: Endpoint) -> str:
    """``in flight now/mean[/limit] and tok/s`` of one endpoint, e.g. ``127.0.0.1:8000 37/30.2/40 1234 tok/s``."""
    limit = "" if endpoint.limit is None else f"/{endpoint.limit}"
    name = endpoint.chat_target.host + (f":{endpoint.chat_target.port}" if endpoint.chat_target.port else "")
    return f"{name} {endpoint.active}/{endpoint.mean_in_flight():.1f}{limit} {endpoint.generation_rate():.0f} tok/s"


def status_line(stats: RunStats, endpoints: list[Endpoint]) -> str:
    """done / failed / truncated / rows / requests per s / tokens per s, then each endpoint's in-flight
    count (now/mean, and its limit with concurrency=auto) and generation rate, as one line."""
    requests = sum(endpoint.requests for endpoint in endpoints)
    return (
        f"done {stats.done} failed {stats.failed} trunc {sum(stats.truncated.values())} "
        f"bad-input {stats.input_errors} rows {stats.rows} | "
        f"{stats.rate(requests):.1f} req/s {stats.rate(stats.completion_tokens):.0f} tok/s | in flight "
        + ", ".join(endpoint_load(endpoint) for endpoint in endpoints)
    )


class _StatsColumn(ProgressColumn):
    def __init__(self, stats: RunStats, endpoints: list[Endpoint]):
        super().__init__()
        self.stats, self.endpoints = stats, endpoints

    def render(self, task: Task) -> Text:
        read = f"{task.completed:.0f}" + (f"/{task.total:.0f}" if task.total is not None else "")
        return Text(f"{read} | {status_line(self.stats, self.endpoints)}")


class ProgressView:
    """A bar over conversations (total = the row limit when known) plus the live counters."""

    def __init__(self, stats: RunStats, endpoints: list[Endpoint], total: int | None,
                 console: Console | None = None, log_every_s: float = 60.0):
        self.console = console or Console(stderr=True)
        self.stats, self.endpoints, self.log_every_s = stats, endpoints, log_every_s
        self.progress = Progress(
            SpinnerColumn(), "[bold]regen", BarColumn(bar_width=20), _StatsColumn(stats, endpoints),
            TimeElapsedColumn(),
            console=self.console, refresh_per_second=2,
        )
        self.task = self.progress.add_task("regen", total=total)

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.update(self.task, completed=self.stats.handled)
        self.progress.stop()

    async def follow(self, period_s: float = 0.5) -> None:
        """Forever: move the bar to the records handled so far; off a terminal, also print the status
        line every ``log_every_s`` (nothing is done per conversation, so the bar costs no client CPU)."""
        since_log = 0.0
        while True:
            await asyncio.sleep(period_s)
            self.progress.update(self.task, completed=self.stats.handled)
            since_log += period_s
            if not self.console.is_terminal and since_log >= self.log_every_s:
                since_log = 0.0
                self.console.print(f"[regen] {status_line(self.stats, self.endpoints)}", highlight=False)
