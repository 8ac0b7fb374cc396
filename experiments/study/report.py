"""The study's report: per arm, horizon, decoding and step, from every evaluation and training log the stages wrote.

- **decodings**: every held-out evaluation runs under each decoding of ``evaluation.decodings`` (``t1``: temperature
  1, as the rollouts decode, k samples per problem; ``greedy``: the negative control); every figure below is per
  decoding.
- **accuracy**: the share of held-out problems of that horizon whose episodes are correct (``opd.episodes.scoring``; with k
  samples a problem counts the share of its samples), as the mean over seeds ± its standard error over seeds;
  ``per_seed`` holds every seed's level. The teachers: one run, ± the SE over problems.
- **minus baseline**: the arm's accuracy minus the baseline arm's on the same problems. ``se`` is the standard error
  over seeds of the per-seed mean differences (what the conclusions rest on: it carries the training's own
  randomness); ``se_problems`` the SE over problems of the per-problem differences averaged over seeds.
- **endpoint**: the pre-registered comparison (``endpoint``: arm, horizon, decoding) after the last step, with its
  95 % Student's t interval over seeds, and the secondary one: the slope over the horizons of the arm's paired
  difference (per seed the least-squares slope, per unit of H; mean, SE and interval over seeds).
- **curve**: the learning curves (``curve_report``): the warm student and every arm's kept checkpoints on the
  curve's problems (one horizon, fewer problems, one decoding), with the area under each curve; the figures above
  are after the last step, on every held-out problem.
- **ties**: every seed, decoding and step at which all arms scored the same at every horizon (a ceiling or a floor:
  there the paired differences can only read 0).
- **gates**: ``experiments.study.gates``.
- **recovery**, **error episodes**, **tool errors** and the call error types: ``opd.episodes.scoring``'s (the evaluation's own
  classifier, run on the episodes' rows): recovery is, of the episodes whose first call error was recoverable (the
  tool world answered it and a turn followed), the share that still ended correct; error episodes count every episode
  with a call error; tool errors the share of calls that returned no result.
- **seconds**: the run's ``elapsed_s`` at the step (loading and cached teacher rollouts included), mean over seeds.
- **warm picks**: per seed, the warm student's SFT step and validation accuracy, and whether it reached
  ``warm.min_accuracy`` (a seed short of it starts from the best checkpoint by the cap, ``warm.best_if_none``).
- **divergence**: the warm student's forward KL, reverse KL, top-1 agreement and top-k overlap against each teacher
  on its own temperature-1 episodes (``experiments.study.divergence``; its file also holds both entropies), mean over
  seeds; **pushes**, per seed and teacher, the token ids each direction's gradient raises most there (per 1,000
  tokens) and the share of each divergence its top 1 % of tokens carry.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from experiments.estimates import episodes_file, interval, jsonl_rows, paired_difference, slope
from experiments.study.gates import ALL, continuation_counts, gate_values, source_line, student_error_rates
from opd.episodes.scoring import aggregate, mean_and_se, score_from_row

# the figures of opd.episodes.scoring.aggregate kept per horizon group
CALL_FIGURES = ("tool_error_rate", "error_episodes", "recovery_rate", "wrong_value_rate", "wrong_operation_rate",
                "failed_call_rate", "broken_json_rate")


def horizons_by_line(heldout: Path) -> dict[int, int]:
    """Line number -> horizon of every held-out record."""
    return {number: json.loads(line)["task"]["horizon"]
            for number, line in enumerate(heldout.read_text().splitlines(), 1) if line.strip()}


def checkpoint_scores(directory: Path, name: str, horizons: dict[int, int]) -> dict:
    """One evaluated checkpoint's episodes grouped by horizon (and ``all``): ``correct`` (line -> the share of the
    problem's samples that ended correct: 0 or 1 with one sample per prompt) and the call figures of
    ``opd.episodes.scoring.aggregate`` (``CALL_FIGURES``)."""
    rows = jsonl_rows(episodes_file(directory, name))
    groups: dict = {}
    for group in sorted({horizons[source_line(row["source"])] for row in rows}) + [ALL]:
        chosen = [row for row in rows if group == ALL or horizons[source_line(row["source"])] == group]
        metrics = aggregate([score_from_row(row) for row in chosen])
        samples = defaultdict(list)
        for row in chosen:
            samples[source_line(row["source"])].append(row["correct"])
        groups[group] = {"correct": {line: sum(correct) / len(correct) for line, correct in samples.items()},
                         **{key: metrics[key] for key in CALL_FIGURES}}
    return groups


def _evaluated(directory: Path, horizons: dict[int, int]) -> dict[str, dict]:
    """Checkpoint name -> ``checkpoint_scores`` of every checkpoint one evaluation stage scored."""
    report = json.loads((directory / "evaluation.json").read_text())
    return {checkpoint["name"]: checkpoint_scores(directory, checkpoint["name"], horizons)
            for checkpoint in report["checkpoints"]}


def _accuracy(correct: dict[int, float]) -> float:
    return sum(correct.values()) / len(correct)


def _mean(values: list) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def _point(step: int, wall: float | None, runs: list[dict]) -> dict:
    """One curve point of a group over seeds (``runs``: that group's scores, one per seed)."""
    accuracy, se = mean_and_se([_accuracy(run["correct"]) for run in runs])
    return {"step": step, "wall_s": wall, "accuracy": accuracy, "se": se, "seeds": len(runs),
            "tool_error_rate": _mean([run["tool_error_rate"] for run in runs]),
            "recovery_rate": _mean([run["recovery_rate"] for run in runs]),
            "error_episodes": sum(run["error_episodes"] for run in runs) / len(runs)}


def training_seconds(metrics: Path, steps: list[int]) -> list[float]:
    """Seconds an arm's run had trained at each of ``steps`` (its ``elapsed_s``; a rerun appends, the last counts)."""
    elapsed = {row["step"]: row["elapsed_s"] for row in map(json.loads, metrics.read_text().splitlines())}
    missing = [step for step in steps if step not in elapsed]
    if missing:
        raise RuntimeError(f"{metrics} has no metrics for steps {missing}; rerun=true")
    return [elapsed[step] for step in steps]


def _divergence(paths, seeds: list[int]) -> dict:
    """Mean over seeds of every divergence figure, per teacher and horizon group."""
    reports = [json.loads(paths.divergence(seed).read_text())["teachers"] for seed in seeds]
    return {teacher: {group: {metric: sum(r[teacher][group][metric] for r in reports) / len(reports)
                              for metric in reports[0][teacher][group]}
                      for group in sorted(reports[0][teacher], key=str)} for teacher in reports[0]}


def pushes(paths, seeds: list[int]) -> dict[str, dict]:
    """Seed -> teacher -> direction -> what its gradient raises most on the warm student's T=1 episodes
    (``experiments.study.divergence``'s ``pushes``)."""
    return {str(seed): json.loads(paths.divergence(seed).read_text())["pushes"] for seed in seeds}


def warm_picks(paths, seeds: list[int]) -> dict[str, dict]:
    """Seed -> the warm student's pick (``experiments.study.warm_start``'s file): its SFT step, validation accuracy
    and whether it reached ``warm.min_accuracy`` (false: the best by ``student.sft_steps``, ``warm.best_if_none``)."""
    picks = {}
    for seed in seeds:
        pick = json.loads(paths.student(seed).with_suffix(".json").read_text())
        picks[str(seed)] = {"step": pick["chosen"]["step"], "accuracy": pick["chosen"]["accuracy"],
                            "reached": pick["reached"], "min_accuracy": pick["min_accuracy"]}
    return picks


def _decoding_report(cfg, paths, steps: list[int], decoding: str, horizons: dict[int, int],
                     walls: dict[str, list[float]]) -> tuple[dict, list[dict]]:
    """One decoding's teachers, curves and paired differences, and its per-seed levels."""
    seeds, arms, baseline = list(cfg.seeds), cfg.running_arms, cfg.baseline_arm
    groups = [*cfg.horizons, ALL]
    teachers = {kind: _evaluated(paths.evaluation(None, f"teacher_{kind}", decoding), horizons)[kind]
                for kind in cfg.teachers}
    students = {seed: _evaluated(paths.evaluation(seed, "student", decoding), horizons)["student"] for seed in seeds}
    own = {arm: cfg.arm_seeds(arm) for arm in arms}  # an arm's seeds; the baseline runs on every seed
    runs = {arm: {seed: _evaluated(paths.evaluation(seed, arm, decoding), horizons) for seed in own[arm]}
            for arm in arms}
    curves = {arm: {group: [_point(0, 0.0, [students[seed][group] for seed in own[arm]]),
                            *(_point(step, wall, [runs[arm][seed][f"step{step}"][group] for seed in own[arm]])
                              for step, wall in zip(steps, walls[arm], strict=True))]
                    for group in groups} for arm in arms}

    def paired_to(arm: str, other: str, group, step: int) -> dict:
        both = [seed for seed in own[arm] if seed in own[other]]
        return paired_difference([runs[arm][seed][f"step{step}"][group]["correct"] for seed in both],
                                 [runs[other][seed][f"step{step}"][group]["correct"] for seed in both])

    paired = {arm: {group: [{"step": step, **paired_to(arm, baseline, group, step)} for step in steps]
                    for group in groups} for arm in arms if arm != baseline}
    e = cfg.endpoint  # the endpoint arm against each co-primary comparator (``endpoint.versus``)
    versus = {other: {group: [{"step": step, **paired_to(e.arm, other, group, step)} for step in steps]
                      for group in groups} for other in e.versus if e.arm in arms and other in arms}
    teacher_points = {kind: {group: {**_point(0, None, [scores[group]]),
                                     "se_problems": mean_and_se(list(scores[group]["correct"].values()))[1]}
                             for group in groups} for kind, scores in teachers.items()}
    per_seed = [{"seed": seed, "arm": "warm_student", "horizon": group, "decoding": decoding, "step": 0,
                 "accuracy": _accuracy(students[seed][group]["correct"])} for seed in seeds for group in groups]
    per_seed += [{"seed": seed, "arm": arm, "horizon": group, "decoding": decoding, "step": step,
                  "accuracy": _accuracy(runs[arm][seed][f"step{step}"][group]["correct"])}
                 for arm in arms for seed in own[arm] for step in steps for group in groups]
    return {"teachers": teacher_points, "student": curves[baseline], "curves": curves,
            "paired_vs_baseline": paired, "endpoint_versus": versus}, per_seed


def curve_report(cfg, paths, steps: list[int], walls: dict[str, list[float]]) -> dict:
    """The learning curves (``curve``): per arm, the warm student (step 0) and its checkpoints at ``steps`` on the
    curve's problems, accuracy mean ± SE over seeds with the per-seed levels and the paired difference to the
    baseline arm; and the area under each curve, per seed the trapezoid over the steps divided by the last step (the
    mean accuracy over training), mean ± SE over seeds. ``walls``: each arm's seconds at ``steps``."""
    c, seeds, baseline = cfg.curve, list(cfg.seeds), cfg.baseline_arm
    horizons = horizons_by_line(paths.curve_prompts())
    student = {seed: _evaluated(paths.curve(seed, "student"), horizons)["student"][c.horizon] for seed in seeds}
    runs = {arm: {seed: _evaluated(paths.curve(seed, arm), horizons) for seed in cfg.arm_seeds(arm)}
            for arm in cfg.running_arms}

    def scores(arm: str, step: int, on: list[int]) -> list[dict]:
        return [student[seed] if step == 0 else runs[arm][seed][f"step{step}"][c.horizon] for seed in on]

    points, arms = [0, *steps], {}
    for arm in cfg.running_arms:
        curve, own = [], cfg.arm_seeds(arm)
        for step, wall in zip(points, [0.0, *walls[arm]], strict=True):
            runs_at = scores(arm, step, own)
            point = {**_point(step, wall, runs_at), "per_seed": [_accuracy(run["correct"]) for run in runs_at]}
            if arm != baseline:
                paired = paired_difference([run["correct"] for run in runs_at],
                                           [run["correct"] for run in scores(baseline, step, own)])
                point.update(minus_baseline=paired["mean"], minus_baseline_se=paired["se_seeds"],
                             minus_baseline_per_seed=paired["per_seed"])
            curve.append(point)
        areas = [sum((b["step"] - a["step"]) * (a["per_seed"][i] + b["per_seed"][i]) / 2
                     for a, b in zip(curve, curve[1:], strict=False)) / steps[-1] for i in range(len(own))]
        mean, se = mean_and_se(areas)
        arms[arm] = {"points": curve, "seeds": own, "area": {"mean": mean, "se": se, "per_seed": areas}}
    return {"horizon": c.horizon, "decoding": c.decoding, "problems": len(horizons),
            "samples_per_prompt": cfg.evaluation.decodings[c.decoding].samples_per_prompt, "steps": points,
            "baseline_arm": baseline, "arms": arms}


def study_report(cfg, paths, steps: list[int]) -> dict:
    """The learning curves at ``steps`` (``curve_report``); after the last of them, per decoding: accuracies, paired
    differences, teachers and students; the per-seed levels, the endpoint, the gates and the divergences (see the
    module doc)."""
    seeds, arms = list(cfg.seeds), cfg.running_arms
    horizons = horizons_by_line(paths.file("heldout_prompts"))
    walls = {arm: [sum(column) / len(cfg.arm_seeds(arm)) for column in zip(
        *(training_seconds(paths.arm(seed, arm) / "run" / "metrics.jsonl", steps) for seed in cfg.arm_seeds(arm)),
        strict=True)] for arm in arms}
    decodings, per_seed, final = {}, [], steps[-1:]
    for decoding in cfg.evaluation.decodings:
        decodings[decoding], levels = _decoding_report(cfg, paths, final, decoding, horizons,
                                                       {arm: wall[-1:] for arm, wall in walls.items()})
        per_seed += levels
    report = {"seeds": seeds, "horizons": list(cfg.horizons), "steps": final, "baseline_arm": cfg.baseline_arm,
              "curve": curve_report(cfg, paths, steps, walls),
              "arms": {arm: {"on_policy": cfg.arm_settings[arm].on_policy, "teacher": cfg.arm_settings[arm].teacher,
                             "entry": cfg.arm_settings[arm].entry, "overrides": cfg.arm_settings[arm].overrides}
                       for arm in arms},
              "heldout_problems": {str(h): sum(1 for value in horizons.values() if value == h) for h in cfg.horizons},
              "samples_per_prompt": {name: d.samples_per_prompt for name, d in cfg.evaluation.decodings.items()},
              "decodings": decodings, "per_seed": per_seed,
              "endpoint": _endpoint(cfg, decodings, steps[-1]),
              "arm_seeds": {arm: cfg.arm_seeds(arm) for arm in arms},
              "shared_recovery": shared_recovery(cfg, paths), "entropy": arm_entropy(cfg, paths),
              "ties": tied_runs(per_seed),
              "divergence": _divergence(paths, seeds), "pushes": pushes(paths, seeds),
              "warm_picks": warm_picks(paths, seeds)}
    report["gates"] = gate_values(cfg, paths, report)
    report["reading"] = reading(report["endpoint"], report["gates"])
    report["noise_match"] = student_error_rates(cfg, paths)
    report["continuation"] = continuation_counts(cfg, paths)
    return report


def _comparison(cfg, paired: dict) -> dict:
    """One endpoint comparison (paired differences by horizon group, per step): at the endpoint's horizon after the
    last step, the mean of the per-seed differences ± SE with its 95 % t interval, and the slope over the horizons."""
    e, final, trend = cfg.endpoint, paired[cfg.endpoint.horizon][-1], None
    seeds = len(final["per_seed"])
    if len(cfg.horizons) > 1:
        slopes = [slope(list(cfg.horizons), [paired[h][-1]["per_seed"][i] for h in cfg.horizons]) for i in range(seeds)]
        mean, se = mean_and_se(slopes)
        trend = {"per_seed": slopes, "mean": mean, "se": se, "ci95": interval(mean, se, seeds)}
    return {"mean": final["mean"], "se": final["se_seeds"], "per_seed": final["per_seed"], "seeds": seeds,
            "ci95": interval(final["mean"], final["se_seeds"], seeds), "slope_over_horizons": trend,
            "horizon": e.horizon, "decoding": e.decoding}


def _endpoint(cfg, decodings: dict, step: int) -> dict | None:
    """The pre-registered comparisons after ``step``: the endpoint arm minus the baseline and minus each
    ``endpoint.versus`` arm (co-primary), each with its interval and slope over the horizons; None when its arm did
    not run."""
    e = cfg.endpoint
    if e.arm not in cfg.running_arms:
        return None
    figures = decodings[e.decoding]
    primary = _comparison(cfg, figures["paired_vs_baseline"][e.arm])
    return {"arm": e.arm, "horizon": e.horizon, "decoding": e.decoding, "step": step, "minus_kd": primary["mean"],
            "minus_kd_se": primary["se"], "minus_kd_per_seed": primary["per_seed"], "seeds": primary["seeds"],
            "minus_kd_ci95": primary["ci95"], "slope_over_horizons": primary["slope_over_horizons"],
            "co_primary": {other: _comparison(cfg, paired) for other, paired in figures["endpoint_versus"].items()}}


def reading(endpoint: dict | None, gates: dict, margin: float = 0.06) -> dict:
    """The registered reading (study README, the amendment of 2026-12-07): with every gate passed, on-policy data
    is supported when every co-primary interval (the baseline and each ``endpoint.versus``) lies above 0, refuted
    when every upper bound lies below ``margin``, undecided otherwise; with a gate failed or not measured, no
    answer."""
    failed = [name for name, gate in gates.items() if gate["passed"] is not True]
    if endpoint is None:
        return {"verdict": "no answer", "why": "the endpoint arm did not run"}
    intervals = {"baseline": endpoint["minus_kd_ci95"], **{other: c["ci95"] for other, c in endpoint["co_primary"].items()}}
    if failed:
        return {"verdict": "no answer", "why": f"gate(s) {', '.join(failed)} not passed", "intervals": intervals}
    if any(bounds is None for bounds in intervals.values()):
        return {"verdict": "no answer", "why": "an interval needs two seeds or more", "intervals": intervals}
    if all(low > 0 for low, _ in intervals.values()):
        verdict = "supported"
    elif all(high < margin for _, high in intervals.values()):
        verdict = "refuted"
    else:
        verdict = "undecided"
    return {"verdict": verdict, "intervals": intervals, "margin": margin}


def shared_recovery(cfg, paths) -> dict:
    """Recovery on one set per seed: the warm student's recoverable T=1 error prefixes continued by each arm's last
    checkpoint (``{arm}/recovery.json``), by the warm student itself (``student-continuation``) and by the robust
    teacher (``continuation``), pooled over the seeds each ran on: continued prefixes, recovered ones (ended correct
    with no call past the chain's) and their share, in all and by first error type."""
    sources = {"warm_student": (cfg.seeds, "student-continuation"), "robust_teacher": (cfg.seeds, "continuation"),
               **{arm: (cfg.arm_seeds(arm), f"{arm}/recovery") for arm in cfg.running_arms}}
    pooled = {}
    for name, (seeds, file) in sources.items():
        found = [json.loads(paths.continuation(seed, file).read_text()) for seed in seeds
                 if paths.continuation(seed, file).is_file()]
        if not found:
            continue
        kinds = sorted({kind for f in found for kind in f.get("by_first_error", {})})
        rows = {"all": [(f["continued"], f.get("recovered", f["correct"])) for f in found],
                **{kind: [(f["by_first_error"][kind]["continued"], f["by_first_error"][kind].get(
                    "recovered", f["by_first_error"][kind]["correct"])) for f in found
                    if kind in f.get("by_first_error", {})]
                   for kind in kinds}}
        pooled[name] = {group: {"continued": sum(c for c, _ in counts), "recovered": sum(r for _, r in counts),
                                "rate": sum(r for _, r in counts) / sum(c for c, _ in counts)
                                if sum(c for c, _ in counts) else None} for group, counts in rows.items()}
        pooled[name]["seeds"] = [seed for seed in seeds if paths.continuation(seed, file).is_file()]
    return pooled


def arm_entropy(cfg, paths) -> dict:
    """Per arm, mean ± SE over its seeds of its last checkpoint's per-token entropy on its own held-out T=1 rollouts,
    with its forward and reverse KL to the robust teacher there (``{arm}/divergence.json``)."""
    found = {}
    for arm in cfg.running_arms:
        files = [paths.arm(seed, arm) / "divergence.json" for seed in cfg.arm_seeds(arm)]
        reports = [json.loads(file.read_text())["teachers"]["robust"][ALL] for file in files if file.is_file()]
        if reports:
            found[arm] = {metric: dict(zip(("mean", "se"), mean_and_se([r[metric] for r in reports]), strict=True))
                          for metric in ("student_entropy", "teacher_entropy", "forward_kl", "reverse_kl")}
    return found


def tied_runs(per_seed: list[dict]) -> list[dict]:
    """Every (seed, decoding, step) at which two or more arms ran and all scored the same at every horizon, with
    that accuracy over all horizons."""
    by_run: dict = defaultdict(lambda: defaultdict(dict))
    for row in per_seed:
        if row["arm"] != "warm_student":
            by_run[row["seed"], row["decoding"], row["step"]][row["arm"]][row["horizon"]] = row["accuracy"]
    tied = []
    for (seed, decoding, step), arms in by_run.items():
        first, *others = arms.values()
        if others and all(levels == first for levels in others):
            tied.append({"seed": seed, "decoding": decoding, "step": step, "accuracy": first[ALL]})
    return tied


def summary_results(report: dict) -> list[dict]:
    """``study_summary.json``'s ``results``: every arm at every horizon (and over all of them, ``"all"``) and decoding
    after the last step."""
    baseline, rows = report["baseline_arm"], []
    for decoding, figures in report["decodings"].items():
        for arm, by_group in figures["curves"].items():
            for horizon in [*report["horizons"], ALL]:
                final = by_group[horizon][-1]
                paired = figures["paired_vs_baseline"][arm][horizon][-1] if arm != baseline else None
                rows.append({"horizon": horizon, "decoding": decoding, "arm": arm,
                             "on_policy": report["arms"][arm]["on_policy"], "accuracy": final["accuracy"],
                             "se": final["se"], "minus_kd": paired["mean"] if paired else 0.0,
                             "minus_kd_se": paired["se_seeds"] if paired else 0.0,
                             "minus_kd_se_problems": paired["se_problems"] if paired else 0.0,
                             "minus_kd_per_seed": paired["per_seed"] if paired else None,
                             "recovery_rate": final["recovery_rate"], "tool_error_rate": final["tool_error_rate"],
                             "wall_s": final["wall_s"]})
    return rows


def _pm(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" + ("" if se is None else f" ± {se:.3f}")


def print_report(report: dict, console: Console) -> None:
    """The gates and the endpoint; per decoding and horizon every arm's final accuracy, its paired difference to the
    baseline, recovery, tool errors; the per-seed levels; the divergences and the curves."""
    if not console.is_terminal:
        console.width = max(console.width, 170)
    seeds, baseline = len(report["seeds"]), report["baseline_arm"]
    gates = Table(title="pilot gates (experiments/study/gates.py)")
    for header in ("gate", "value", "threshold", "passed", "from"):
        gates.add_column(header, justify="left" if header in ("gate", "from") else "right")
    for name, gate in report["gates"].items():
        gates.add_row(name, _pm(gate["value"], None), f"{gate['direction']} {gate['threshold']}",
                      {True: "yes", False: "NO", None: "-"}[gate["passed"]], gate["detail"])
    console.print(gates)
    console.print("warm students (SFT step, validation accuracy): " + ", ".join(
        f"seed {seed} step {pick['step']} ({pick['accuracy']:.3f}"
        + ("" if pick["reached"] else f", short of {pick['min_accuracy']}: the best by the cap") + ")"
        for seed, pick in report["warm_picks"].items()))
    m = report["noise_match"]
    console.print(f"the warm students' first T=1 call errors per call at risk ({m['calls_at_risk']} calls): confused {_pm(m['confused'], None)} "
                  f"(wrong value {_pm(m['wrong_value'], None)}, wrong operation {_pm(m['wrong_operation'], None)}), "
                  f"failed {_pm(m['failed_call'], None)}, broken JSON {_pm(m['broken_json'], None)}; the noisy "
                  f"demonstrations inject value_noise {m['value_noise']} and syntax_noise {m['syntax_noise']}")
    numbers = m.get("wrong_guard_numbers") or {}
    console.print(f"of the confused ones that read back: k alone wrong {_pm(m['wrong_k_share'], None)} (operand_share "
                  f"{m['operand_share']}), a guard number alone {_pm(m['wrong_guard_share'], None)} (guard_share "
                  f"{m['guard_share']}), by number "
                  f"{', '.join(f'{name} {share:.3f}' for name, share in numbers.items()) or '-'} (guard_numbers "
                  f"{', '.join(f'{name} {weight:g}' for name, weight in m['guard_numbers'].items())})")
    for group, what in (("by_error_call", "by the erring call"), ("by_misread_number", "by the number misread")):
        counts = report["continuation"][group]
        if counts:
            console.print(f"G4 {what}: " + ", ".join(f"{key} {c['correct']} of {c['continued']}"
                                                     for key, c in counts.items()))
    e = report["endpoint"]
    if e is None:
        console.print("endpoint: its arm did not run in this slice")
    else:
        ci, trend = e["minus_kd_ci95"], e["slope_over_horizons"]
        console.print(f"endpoint (pre-registered): {e['arm']} minus {baseline} at H={e['horizon']}, {e['decoding']}, step "
                      f"{e['step']}: {_pm(e['minus_kd'], e['minus_kd_se'])} (SE over {e['seeds']} seeds; per seed "
                      f"{', '.join(f'{d:+.3f}' for d in e['minus_kd_per_seed'])}"
                      + ("" if ci is None else f"; 95 % interval {ci[0]:+.3f} to {ci[1]:+.3f}") + ")")
        if trend:
            console.print(f"  its slope over H, per unit of H: {_pm(trend['mean'], trend['se'])} (per seed "
                          f"{', '.join(f'{d:+.4f}' for d in trend['per_seed'])})")
        for other, c in e["co_primary"].items():
            console.print(f"co-primary: {e['arm']} minus {other}: {_pm(c['mean'], c['se'])} (SE over {c['seeds']} "
                          f"seeds; per seed {', '.join(f'{d:+.3f}' for d in c['per_seed'])}"
                          + ("" if c["ci95"] is None else f"; 95 % interval {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}")
                          + ")")
    r = report["reading"]
    console.print(f"reading (registered rule): {r['verdict']}" + (f" ({r['why']})" if "why" in r else ""))
    if report["shared_recovery"]:
        shared = Table(title="recovery on the shared set: the warm students' recoverable T=1 error prefixes continued "
                             "(ended correct, no call past the chain's)")
        for header in ("model", "seeds", "recovered", "of", "rate", "by first error"):
            shared.add_column(header, justify="left" if header in ("model", "by first error") else "right")
        for name, groups in report["shared_recovery"].items():
            kinds = ", ".join(f"{kind} {g['recovered']}/{g['continued']}" for kind, g in groups.items()
                              if kind not in ("all", "seeds"))
            shared.add_row(name, ",".join(map(str, groups["seeds"])), str(groups["all"]["recovered"]),
                           str(groups["all"]["continued"]), _pm(groups["all"]["rate"], None), kinds)
        console.print(shared)
    for arm, figures in report["entropy"].items():
        console.print(f"{arm}: per-token entropy on its held-out T=1 rollouts {_pm(**figures['student_entropy'])} "
                      f"(the robust teacher there {_pm(**figures['teacher_entropy'])}; reverse KL "
                      f"{_pm(**figures['reverse_kl'])})")
    for tie in report["ties"]:
        console.print(f"tie: seed {tie['seed']}, {tie['decoding']}, step {tie['step']}: every arm scored the same at "
                      f"every horizon ({tie['accuracy']:.3f} over all); its paired differences can only read 0")
    for decoding, figures in report["decodings"].items():
        for horizon in [*report["horizons"], ALL]:
            table = Table(title=f"{decoding}, horizon {horizon}: held-out accuracy after {report['steps'][-1]} steps "
                                f"({seeds} seed{'s' if seeds > 1 else ''}, ± SE over seeds; teachers ± SE over problems)")
            for header in ("model", "on-policy", "accuracy", f"minus {baseline} (paired, SE seeds)", "SE problems",
                           "recovery", "error episodes", "tool errors", "seconds"):
                table.add_column(header, justify="left" if header == "model" else "right")
            for kind, point in figures["teachers"].items():
                table.add_row(f"teacher ({kind})", "-", _pm(point[horizon]["accuracy"], point[horizon]["se_problems"]),
                              "-", "-", _pm(point[horizon]["recovery_rate"], None),
                              f"{point[horizon]['error_episodes']:.1f}", _pm(point[horizon]["tool_error_rate"], None),
                              "-")
            start = figures["student"][horizon][0]
            table.add_row("warm student (step 0)", "-", _pm(start["accuracy"], start["se"]), "-", "-",
                          _pm(start["recovery_rate"], None), f"{start['error_episodes']:.1f}",
                          _pm(start["tool_error_rate"], None), "-")
            for arm, by_group in figures["curves"].items():
                final = by_group[horizon][-1]
                paired = figures["paired_vs_baseline"].get(arm, {}).get(horizon, [None])[-1]
                table.add_row(arm, "yes" if report["arms"][arm]["on_policy"] else "no",
                              _pm(final["accuracy"], final["se"]),
                              "-" if paired is None else _pm(paired["mean"], paired["se_seeds"]),
                              "-" if paired is None else _pm(paired["se_problems"], None),
                              _pm(final["recovery_rate"], None), f"{final['error_episodes']:.1f}",
                              _pm(final["tool_error_rate"], None), f"{final['wall_s']:.0f}")
            console.print(table)
    last = report["steps"][-1]
    levels = Table(title=f"per-seed accuracy after {last} steps, all horizons (warm student: step 0)")
    levels.add_column("arm")
    columns = [(decoding, seed) for decoding in report["decodings"] for seed in report["seeds"]]
    for decoding, seed in columns:
        levels.add_column(f"{decoding} seed {seed}", justify="right")
    by_key = {(row["arm"], row["decoding"], row["seed"]): row["accuracy"] for row in report["per_seed"]
              if row["horizon"] == ALL and row["step"] in (0, last) and (row["step"] == 0) == (row["arm"] == "warm_student")}
    for arm in ["warm_student", *report["arms"]]:
        levels.add_row(arm, *(f"{by_key[arm, decoding, seed]:.3f}" for decoding, seed in columns))
    console.print(levels)
    divergence = Table(title="the warm student against each teacher on its own T=1 episodes (mean over seeds)")
    for header in ("teacher", "horizon", "forward KL", "reverse KL", "top-1 agreement", "top-k overlap"):
        divergence.add_column(header, justify="right")
    for teacher, by_group in report["divergence"].items():
        for group, figures in by_group.items():
            divergence.add_row(teacher, group, *(f"{figures[key]:.3f}" for key in
                                                 ("forward_kl", "reverse_kl", "top1_agreement", "topk_overlap")))
    console.print(divergence)
    raised = Table(title="what each divergence's gradient raises most there (probability per 1,000 tokens), and the "
                         "share of it the top 1 % of tokens carry")
    for header in ("seed", "teacher", "direction", "top 1 %", "raises"):
        raised.add_column(header)
    for seed, by_teacher in report["pushes"].items():
        for teacher, by_direction in by_teacher.items():
            for direction, figures in by_direction.items():
                raised.add_row(seed, teacher, direction, f"{figures['top_percent_share']:.2f}", "  ".join(
                    f"{row['token']!r} {row['per_1k_tokens']:+.1f}" for row in figures["raises"]))
    console.print(raised)
    curve = report["curve"]
    table = Table(title=f"learning curves: accuracy per optimizer step on {curve['problems']} held-out problems of "
                        f"H={curve['horizon']}, {curve['decoding']} (± SE over seeds; step 0: the warm student)")
    table.add_column("arm")
    for step in curve["steps"]:
        table.add_column(str(step), justify="right")
    table.add_column("area (mean accuracy over training)", justify="right")
    for arm, figures in curve["arms"].items():
        table.add_row(arm, *(_pm(point["accuracy"], point["se"]) for point in figures["points"]),
                      _pm(figures["area"]["mean"], figures["area"]["se"]))
    console.print(table)
