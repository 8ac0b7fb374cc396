"""The evaluation's outputs: a rich comparison table, the JSON report and a PNG chart (matplotlib, optional extra)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from opd.atomic_write import atomic_write

# (report key, column title, format)
COLUMNS = (
    ("accuracy", "accuracy", "{:.3f}"), ("tool_success_rate", "tool ok", "{:.3f}"),
    ("tool_error_rate", "tool err", "{:.3f}"), ("truncation_rate", "truncated", "{:.3f}"),
    ("mean_turns", "turns", "{:.2f}"), ("mean_assistant_tokens", "asst tok", "{:.1f}"),
    ("tool_calls", "calls", "{}"), ("wall_s", "wall s", "{:.1f}"), ("peak_memory_mb", "peak MiB", "{:.0f}"),
)
RATES = (("accuracy", "accuracy"), ("tool_success_rate", "tool success"), ("tool_error_rate", "tool error"),
         ("truncation_rate", "truncation"))


def _cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def print_table(results: list[dict], console: Console | None = None, title: str = "evaluation") -> None:
    """One row per checkpoint, one column per metric."""
    table = Table(title=title)
    table.add_column("checkpoint")
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for result in results:
        table.add_row(result["name"], *(_cell(result[key], fmt) for key, _, fmt in COLUMNS))
    console = console or Console()
    if not console.is_terminal:  # a log file gets every column unabridged
        console.width = max(console.width, 140)
    console.print(table)


def require_matplotlib() -> None:
    """Fail early, with the install command, when the chart is asked for but matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("the chart needs matplotlib: pip install -e '.[chart]' (or set chart=false)") from None


def write_chart(results: list[dict], path: str | Path, title: str = "held-out evaluation") -> Path:
    """A PNG with the rates, mean assistant tokens and mean turns of each checkpoint side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [result["name"] for result in results]
    figure, (rates, tokens, turns) = plt.subplots(1, 3, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1.2, 1.2]})
    width = 0.8 / len(RATES)
    for offset, (key, label) in enumerate(RATES):
        values = [result[key] or 0.0 for result in results]
        bars = rates.bar([i + (offset - (len(RATES) - 1) / 2) * width for i in range(len(names))], values, width,
                         label=label)
        rates.bar_label(bars, labels=[_cell(result[key], "{:.2f}") for result in results], fontsize=7, padding=1)
    rates.set_xticks(range(len(names)), names)
    rates.set_ylim(0, 1.3)  # headroom: the legend sits above the 1.0 bars
    rates.set_ylabel("share")
    rates.legend(fontsize=8, ncols=len(RATES), loc="upper center")
    for axis, key, label in ((tokens, "mean_assistant_tokens", "mean assistant tokens"), (turns, "mean_turns", "mean turns")):
        bars = axis.bar(names, [result[key] for result in results], color="tab:gray")
        axis.bar_label(bars, fmt="%.1f", fontsize=7)
        axis.set_title(label, fontsize=10)
        axis.tick_params(axis="x", labelrotation=30)
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: figure.savefig(stream, format="png", dpi=120))
    plt.close(figure)
    return path
