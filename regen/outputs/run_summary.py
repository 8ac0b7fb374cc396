"""One run's state and its summary: ``<stem>.summary.json`` and the lines printed at the end.

``RunState.status`` is ``completed``, ``interrupted`` or ``failed: ...``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from regen.conversations.request_params import RequestParams
from regen.outputs.output_files import OutputPaths
from regen.outputs.run_output import RunOutput
from regen.outputs.run_stats import RunStats
from regen.settings import RegenSettings


@dataclass
class RunState:
    """One run as its summary reports it."""

    settings: RegenSettings
    model: str
    output: RunOutput
    tokenizer: str  # where the row-text tokenizer came from (``Detokenizer.source``)
    stats: RunStats = field(default_factory=RunStats)
    status: str = "interrupted"  # until the run ends otherwise

    def summary(self, errors_file_rows: int, endpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The summary, given the error file's rows once compacted and each endpoint's counts (URL -> counts)."""
        settings, paths, resume = self.settings, self.output.paths, self.output.resume
        return {
            "status": self.status,
            "conversations_done": self.stats.done,
            "conversations_failed": self.stats.failed,
            "first_failure": self.stats.first_failure,
            "model": self.model,
            "endpoints_given": list(endpoints),
            "dataset": asdict(settings.dataset),
            "output": str(paths.output),
            "errors_file": str(paths.errors),
            "manifest": str(paths.manifest),
            "errors_file_rows": errors_file_rows,
            "resumed": settings.resume,
            "resume_dropped_partial_rows": resume.dropped_rows,
            "resume_dropped_bytes": resume.dropped_bytes,
            "resume_removed_duplicate_blocks": resume.removed_duplicate_blocks,
            "resume_removed_duplicate_rows": resume.removed_duplicate_rows,
            "recovered_from_errors": len(self.stats.recovered_ids),
            **self.stats.summary(sum(counts["requests"] for counts in endpoints.values())),
            "endpoints": endpoints,
            "sampling_params": RequestParams.from_settings(settings).base,
            "max_tokens": settings.max_tokens,
            "concurrency": settings.concurrency,
            "concurrency_chosen": None if settings.fixed_concurrency is not None else sum(
                counts["in_flight_limit"] for counts in endpoints.values()),
            "tokenizer": self.tokenizer,
            "tokenizer_warning": self.stats.tokenizer_warning,
        }


def print_summary(console: Console, summary: dict[str, Any], paths: OutputPaths) -> None:
    """The end-of-run lines: the counts first (failures in red), then rates, files and each endpoint."""
    failed = summary["conversations_failed"]
    status = summary["status"]
    headline = "red" if failed or status != "completed" else "green"
    console.print(f"[bold {headline}]regen {escape(status.split(':')[0])}[/]: {summary['conversations_done']} conversations done, "
                  + (f"[bold red]{failed} FAILED[/]" if failed else "0 failed")
                  + f", {summary['conversations_truncated']} truncated; {summary['rows_written']} rows -> "
                  f"{escape(str(paths.output))}")
    if failed:
        console.print(f"  [red]first failure:[/] {escape(str(summary['first_failure']))}")
    console.print(f"  input errors {summary['input_errors']} ({summary['duplicate_ids']} duplicate ids), "
                  f"{summary['errors_file_rows']} rows in {escape(str(paths.errors))}")
    console.print(f"  {summary['requests_per_s']} req/s, {summary['completion_tokens_per_s']} tok/s, "
                  f"{summary['elapsed_s']} s; summary: {escape(str(paths.summary))}")
    if summary["reasoning_split_corrected"]:
        console.print(f"  {summary['reasoning_split_corrected']} history turns took their reasoning/answer split "
                      "from the token ids, not from the server's reasoning parser (regen/README.md, reasoning models)")
    for url, counts in summary["endpoints"].items():
        console.print(f"  {url}: {counts['requests']} requests, {counts['failures']} failures, "
                      f"{counts['conversations']} conversations{'' if counts['live'] else ' (taken out)'}; "
                      f"{counts['generation_tokens_per_s']} tok/s, {counts['in_flight_mean']} in flight on average"
                      + (f", limit {counts['in_flight_limit']} (mean {counts['in_flight_limit_mean']}, "
                         f"by {counts['concurrency_control']})" if "in_flight_limit" in counts else ""))
        if counts.get("concurrency_control_reason"):
            console.print(f"    [yellow]concurrency=auto fell back to throughput:[/] "
                          f"{escape(counts['concurrency_control_reason'])}")
        if counts.get("metrics_readings_failed"):
            console.print(f"    [yellow]{counts['metrics_readings_failed']} /metrics readings failed and were "
                          f"skipped[/] (last: {escape(str(counts['metrics_last_failure']))})")
    if summary["concurrency_chosen"] is not None:
        console.print(f"  concurrency=auto settled on {summary['concurrency_chosen']} conversations in flight "
                      "(the sum of the endpoints' limits): a fixed run would set concurrency="
                      f"{summary['concurrency_chosen']}")
