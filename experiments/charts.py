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


def write_study_charts(report: dict, out: str | Path) -> list[Path]:
    """The study's two charts in ``out``: ``accuracy_vs_horizon.png`` (every arm's accuracy after the last step at
    each horizon, ± 1 SE over seeds, with both teachers and the warm student) and ``accuracy_vs_steps.png`` (one
    panel per horizon: every arm's accuracy against optimizer steps, ± 1 SE bands)."""
    plt, out = pyplot(), Path(out)
    horizons, seeds = report["horizons"], len(report["seeds"])
    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    for arm, by_group in report["curves"].items():
        finals = [by_group[h][-1] for h in horizons]
        axis.errorbar(horizons, [p["accuracy"] for p in finals], yerr=[p["se"] or 0.0 for p in finals], marker="o",
                      capsize=3, linestyle="-" if report["arms"][arm]["on_policy"] else "--", label=arm)
    for kind, style in (("gold", ":"), ("robust", "-.")):
        axis.plot(horizons, [report["teachers"][kind][h]["accuracy"] for h in horizons], color="black",
                  linestyle=style, linewidth=1, label=f"teacher ({kind})")
    axis.plot(horizons, [report["student"][h][0]["accuracy"] for h in horizons], color="grey", linewidth=1,
              label="warm student (step 0)")
    axis.set_xticks(horizons)
    axis.set_xlabel("horizon H (dependent tool calls)")
    axis.set_ylabel("held-out accuracy (greedy)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="best")
    figure.suptitle(f"accuracy after {report['steps'][-1]} steps ({seeds} seeds, ± 1 SE; dashed: off-policy arms)")
    paths = [save_png(figure, out / "accuracy_vs_horizon.png")]
    figure, axes = plt.subplots(1, len(horizons), figsize=(4.6 * len(horizons), 4.2), sharey=True, squeeze=False)
    for axis, horizon in zip(axes[0], horizons, strict=True):
        for arm, by_group in report["curves"].items():
            points = by_group[horizon]
            xs, ys = [p["step"] for p in points], [p["accuracy"] for p in points]
            ses = [p["se"] or 0.0 for p in points]
            line, = axis.plot(xs, ys, marker="o", markersize=3, label=arm,
                              linestyle="-" if report["arms"][arm]["on_policy"] else "--")
            axis.fill_between(xs, [y - s for y, s in zip(ys, ses, strict=True)],
                              [y + s for y, s in zip(ys, ses, strict=True)], color=line.get_color(), alpha=0.15)
        axis.set_title(f"H = {horizon}")
        axis.set_xlabel("student updates (optimizer steps)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (greedy)")
    axes[0][-1].legend(fontsize=7, loc="best")
    figure.suptitle(f"learning curves ({seeds} seeds, bands ± 1 SE over seeds)")
    paths.append(save_png(figure, out / "accuracy_vs_steps.png"))
    return paths
