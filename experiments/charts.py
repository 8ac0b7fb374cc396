"""Charts of the CPU experiments (matplotlib, the optional ``chart`` extra)."""

from __future__ import annotations

from pathlib import Path

from opd.reports.charts import pyplot, save_png


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


def _arm_styles(report: dict) -> dict[str, dict]:
    """One colour, marker and line style per arm, fixed for every panel (dashed: off-policy arms; the baseline
    thicker)."""
    markers, colours = "osD^vP*X", [f"C{i}" for i in range(10)]
    return {arm: {"color": colours[i % 10], "marker": markers[i % len(markers)],
                  "linestyle": "-" if report["arms"][arm]["on_policy"] else "--",
                  "linewidth": 2.2 if arm == report["baseline_arm"] else 1.3}
            for i, arm in enumerate(report["arms"])}


def write_study_charts(report: dict, out: str | Path) -> list[Path]:
    """The study's two charts in ``out``, the legend beside the panels:
    ``accuracy_vs_horizon.png`` (every arm's accuracy after the last step at each horizon, ± 1 SE over seeds, arms
    shifted apart along x so that their bars do not overlap; the teacher every arm distils and the warm student) and
    ``accuracy_vs_steps.png`` (the learning curves, ``report["curve"]``: every arm's accuracy against optimizer steps,
    ± 1 SE bars over seeds, shifted apart in the same way, the area under each curve in the legend)."""
    plt, out = pyplot(), Path(out)
    horizons, seeds, decodings = report["horizons"], len(report["seeds"]), list(report["decodings"])
    styles, arms = _arm_styles(report), list(report["arms"])
    shift = {arm: (i - (len(arms) - 1) / 2) * 0.08 for i, arm in enumerate(arms)}
    figure, axes = plt.subplots(len(decodings), 1, figsize=(8.5, 3.6 * len(decodings)), sharex=True, squeeze=False)
    for axis, decoding in zip(axes[:, 0], decodings, strict=True):
        figures = report["decodings"][decoding]
        for arm, by_group in figures["curves"].items():
            finals = [by_group[h][-1] for h in horizons]
            axis.errorbar([x + shift[arm] for x in range(len(horizons))], [p["accuracy"] for p in finals],
                          yerr=[p["se"] or 0.0 for p in finals], capsize=3, markersize=5, label=arm, **styles[arm])
        for kind, teacher in figures["teachers"].items():
            axis.plot(range(len(horizons)), [teacher[h]["accuracy"] for h in horizons], color="black", linestyle=":",
                      linewidth=1, label=f"teacher ({kind})")
        axis.plot(range(len(horizons)), [figures["student"][h][0]["accuracy"] for h in horizons], color="grey",
                  linewidth=1, label="warm student (step 0)")
        samples = report["samples_per_prompt"][decoding]
        axis.set_title(f"{decoding} ({samples} sample{'s' if samples > 1 else ''} per problem)", fontsize=10)
        axis.set_ylabel("held-out accuracy")
        axis.set_ylim(-0.03, 1.03)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xticks(range(len(horizons)), [str(h) for h in horizons])
    axes[-1, 0].set_xlabel("horizon H (dependent tool calls)")
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle(f"accuracy after {report['steps'][-1]} steps ({seeds} seed{'s' if seeds > 1 else ''}, ± 1 SE; dashed: off-policy arms)")
    paths = [save_png(figure, out / "accuracy_vs_horizon.png")]
    curve = report["curve"]
    figure, axis = plt.subplots(figsize=(8.5, 4.2))
    spread = (curve["steps"][-1] or 1) * 0.012
    for arm, figures in curve["arms"].items():
        points = figures["points"]
        axis.errorbar([p["step"] + shift[arm] / 0.08 * spread for p in points], [p["accuracy"] for p in points],
                      yerr=[p["se"] or 0.0 for p in points], capsize=2, markersize=3,
                      label=f"{arm} (area {figures['area']['mean']:.3f})", **styles[arm])
    axis.set_ylim(-0.03, 1.03)
    axis.grid(alpha=0.3)
    axis.set_xlabel("optimizer steps (0: the warm student)")
    axis.set_ylabel("held-out accuracy")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    samples = curve["samples_per_prompt"]
    axis.set_title(f"learning curves: {curve['problems']} held-out problems of H = {curve['horizon']}, "
                   f"{curve['decoding']} ({samples} sample{'s' if samples > 1 else ''} each), {seeds} "
                   f"seed{'s' if seeds > 1 else ''}, ± 1 SE over seeds", fontsize=10)
    paths.append(save_png(figure, out / "accuracy_vs_steps.png"))
    return paths
