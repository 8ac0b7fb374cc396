"""The PNG charts: the evaluation's comparison and a run's training curves. matplotlib is optional: without it a
chart is left out with one warning (``chart_pyplot``), or refused where it is the point (``require_matplotlib``)."""

from __future__ import annotations

import logging
from pathlib import Path

from common.atomic_write import atomic_write
from common.package_files import extras_install
from common.run_log import RUN_LOG
from common.user_errors import UserError
from opd.reports.tables import cell

RATES = (("accuracy", "accuracy"), ("tool_success_rate", "tool success"), ("tool_error_rate", "tool error"),
         ("truncation_rate", "truncation"))


def require_matplotlib() -> None:
    """Fail early, with the install command, when the chart is asked for but matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(f"the chart needs matplotlib: {extras_install('chart')}", "or set chart=false") from None


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, its font cache built without a word (the first run)."""
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure, path: str | Path) -> Path:
    """Lay out, write atomically as PNG and close ``figure``."""
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: figure.savefig(stream, format="png", dpi=120, bbox_inches="tight"))
    pyplot().close(figure)
    return path


def chart_pyplot(png: str, turn_off: str = ""):
    """``pyplot()``, or None with one warning line when matplotlib is missing (``turn_off`` names the setting)."""
    try:
        return pyplot()
    except ImportError:
        RUN_LOG.warning(f"warning: no {png}: it needs matplotlib ({extras_install('chart')}{turn_off})")
        return None


def write_chart(results: list[dict], path: str | Path, title: str = "held-out evaluation") -> Path:
    """A PNG with the rates (accuracy with its SE as an error bar), mean assistant tokens and mean turns of each
    checkpoint side by side."""
    plt = pyplot()
    names = [result["name"] for result in results]
    figure, (rates, tokens, turns) = plt.subplots(1, 3, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1.2, 1.2]})
    width = 0.8 / len(RATES)
    for offset, (key, label) in enumerate(RATES):
        values = [result[key] or 0.0 for result in results]
        errors = [result["accuracy_se"] or 0.0 for result in results] if key == "accuracy" else None
        bars = rates.bar([i + (offset - (len(RATES) - 1) / 2) * width for i in range(len(names))], values, width,
                         yerr=errors, capsize=3 if errors else 0, label=label)
        rates.bar_label(bars, labels=[cell(result[key], "{:.2f}") for result in results], fontsize=7, padding=1)
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
    return save_png(figure, path)


# (metrics.jsonl key, panel title) of the training curves
CURVES = (("loss", "loss"), ("lr", "learning rate"), ("answer_accuracy", "answer accuracy (graded episodes)"),
          ("broken_target_share", "targets in broken turns"), ("tokens_per_s", "assistant tokens / s"))


def write_training_curves(rows: list[dict], path: str | Path, title: str = "training") -> Path | None:
    """A PNG of a run's ``metrics.jsonl`` rows, one panel per curve of ``CURVES``; None (with a warning) without
    matplotlib or steps."""
    plt = chart_pyplot("training_curves.png")
    if plt is None or not rows:
        return None
    from matplotlib.ticker import MaxNLocator

    panels = [(key, label) for key, label in CURVES if any(row.get(key) is not None for row in rows)]
    figure, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    for axis, (key, label) in zip(axes[0], panels, strict=True):
        measured = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
        axis.plot(*zip(*measured, strict=True), marker="o" if len(measured) < 30 else None, markersize=3)
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key == "answer_accuracy":
            axis.set_ylim(-0.03, 1.03)
    figure.suptitle(title)
    return save_png(figure, path)
