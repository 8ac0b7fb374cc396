"""Charts of the CPU experiments (matplotlib, the optional ``chart`` extra)."""

from __future__ import annotations

from pathlib import Path

from opd.reporting import pyplot, save_png


def write_curve_chart(report: dict, path: str | Path) -> Path:
    """The recipe's learning curves: held-out accuracy of every arm against optimizer steps and against wall
    seconds, with a band of ± one standard error (over seeds when there are several, else over problems), and
    the teacher's and the starting student's accuracy as horizontal lines."""
    plt = pyplot()
    over_seeds = len(report["seeds"]) > 1
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for axis, x_key, x_label in ((axes[0], "step", "student updates (optimizer steps)"),
                                 (axes[1], "wall_s", "seconds of training (loading and teacher rollouts included)")):
        for arm, points in report["curves"].items():
            xs = [point[x_key] for point in points]
            ys = [point["accuracy"] for point in points]
            ses = [(point["se_seeds"] if over_seeds else point["se_problems"]) or 0.0 for point in points]
            line, = axis.plot(xs, ys, marker="o", markersize=3, label=arm)
            axis.fill_between(xs, [y - se for y, se in zip(ys, ses, strict=True)],
                              [y + se for y, se in zip(ys, ses, strict=True)], color=line.get_color(), alpha=0.2)
        for name, style in (("teacher", "--"), ("student", ":")):
            axis.axhline(report[name]["accuracy"], color="black", linestyle=style, linewidth=1,
                         label=f"{name} ({report[name]['accuracy']:.3f})")
        axis.set_xlabel(x_label)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy")
    axes[0].legend(fontsize=8, loc="best")
    seeds = len(report["seeds"])
    figure.suptitle(f"held-out accuracy, {report['heldout_problems']} problems, {seeds} seed{'s' if seeds > 1 else ''}"
                    f" (bands: ± 1 SE over {'seeds' if over_seeds else 'problems'})")
    return save_png(figure, path)
