"""The statistics the experiments report: paired differences on the same problems (means with standard errors are
the evaluation's own, ``opd.scoring.mean_and_se``)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from opd.scoring import mean_and_se


def paired_difference(correct: list[dict[str, float]], baseline: list[dict[str, float]]) -> dict:
    """Arm minus baseline on the same held-out problems: per problem the difference of correctness averaged over
    seeds (one dict source -> correct per seed, both in the same seed order); mean ± SE over problems, and the
    per-seed mean differences with their SE over seeds."""
    problems = sorted(correct[0])
    if any(set(run) != set(problems) for run in [*correct, *baseline]) or len(correct) != len(baseline):
        raise ValueError("paired runs must score the same held-out problems for the same seeds")
    per_problem = [sum(a[p] - b[p] for a, b in zip(correct, baseline, strict=True)) / len(correct) for p in problems]
    mean, se = mean_and_se(per_problem)
    per_seed = [sum(a[p] - b[p] for p in problems) / len(problems) for a, b in zip(correct, baseline, strict=True)]
    seed_mean, seed_se = mean_and_se(per_seed)
    return {"mean": mean, "se_problems": se, "per_seed": per_seed, "se_seeds": seed_se, "problems": len(problems)}


def read_evaluation(directory: Path) -> dict:
    """``opd/evaluate.py``'s report in ``directory``, each checkpoint with ``correct``: source -> the share of its
    episodes that were correct (from ``episodes_{name}.jsonl``: one per sample, so 0 or 1 with one sample)."""
    report = json.loads((directory / "evaluation.json").read_text())
    for checkpoint in report["checkpoints"]:
        samples = defaultdict(list)
        for row in map(json.loads, (directory / f"episodes_{checkpoint['name']}.jsonl").read_text().splitlines()):
            samples[row["source"]].append(row["correct"])
        checkpoint["correct"] = {source: sum(correct) / len(correct) for source, correct in samples.items()}
    return report
