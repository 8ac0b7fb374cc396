"""The evaluation's comparison table: one row per checkpoint, one column per metric (``print_table``)."""

from __future__ import annotations

from rich.table import Table

from common.run_log import show

# (report key, column title, format)
COLUMNS = (
    ("accuracy", "accuracy", "{:.3f}"), ("accuracy_se", "± SE", "{:.3f}"), ("tool_success_rate", "tool ok", "{:.3f}"),
    ("tool_error_rate", "tool err", "{:.3f}"), ("wrong_value_rate", "wrong val", "{:.3f}"),
    ("wrong_operation_rate", "wrong op", "{:.3f}"), ("failed_call_rate", "failed", "{:.3f}"),
    ("broken_json_rate", "broken", "{:.3f}"), ("recovery_rate", "recovery", "{:.3f}"), ("truncation_rate", "truncated", "{:.3f}"),
    ("mean_turns", "turns", "{:.2f}"), ("mean_assistant_tokens", "asst tok", "{:.1f}"),
    ("tool_calls", "calls", "{}"), ("wall_s", "wall s", "{:.1f}"), ("peak_memory_mb", "peak MiB", "{:.0f}"),
)


def cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def print_table(results: list[dict], title: str = "evaluation") -> None:
    """One row per checkpoint, one column per metric, to the run log (``show``)."""
    table = Table(title=title)
    table.add_column("checkpoint")
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for result in results:
        table.add_row(result["name"], *(cell(result[key], fmt) for key, _, fmt in COLUMNS))
    show(table)
