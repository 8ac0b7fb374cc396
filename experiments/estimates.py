"""The statistics the experiments report: paired differences on the same problems, Student's t intervals over seeds
and least-squares slopes (means with standard errors are the evaluation's own, ``opd.episodes.scoring.mean_and_se``)."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

from opd.episodes.scoring import mean_and_se


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


def t_critical(df: int, level: float = 0.95) -> float:
    """The two-sided critical value c of Student's t with ``df`` degrees of freedom: P(|T| <= c) = ``level`` (12.706
    for df 1, 4.303 for df 2, 1.960 in the limit). By bisection on the density's integral (Simpson's rule): the
    project has no statistics library for this one number."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    def mass(x: float, intervals: int = 4000) -> float:  # P(0 <= T <= x)
        h = x / intervals
        inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, intervals))
        return h / 3 * (density(0.0) + density(x) + inner)

    low, high = 0.0, 1.0
    while mass(high) < level / 2:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if mass(middle) < level / 2 else (low, middle)
    return (low + high) / 2


def interval(mean: float, se: float | None, n: int, level: float = 0.95) -> list[float] | None:
    """The ``level`` Student's t interval of a mean of ``n`` values with standard error ``se`` (None below 2)."""
    if se is None or n < 2:
        return None
    half = t_critical(n - 1, level) * se
    return [mean - half, mean + half]


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs``."""
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True))
            / sum((x - x_mean) ** 2 for x in xs))


def jsonl_rows(path: Path) -> list[dict]:
    """The JSON lines of ``path``, gzipped (``*.gz``, as the study keeps episodes) or not."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def episodes_file(directory: Path, name: str) -> Path:
    """An evaluation's ``episodes_{name}.jsonl`` in ``directory``, or its gzipped copy where only that is kept."""
    plain = directory / f"episodes_{name}.jsonl"
    return plain if plain.is_file() or not plain.with_suffix(".jsonl.gz").is_file() else plain.with_suffix(".jsonl.gz")


def read_evaluation(directory: Path) -> dict:
    """``opd/evaluate.py``'s report in ``directory``, each checkpoint with ``correct``: source -> the share of its
    episodes that were correct (from ``episodes_{name}.jsonl``: one per sample, so 0 or 1 with one sample)."""
    report = json.loads((directory / "evaluation.json").read_text())
    for checkpoint in report["checkpoints"]:
        samples = defaultdict(list)
        for row in jsonl_rows(episodes_file(directory, checkpoint["name"])):
            samples[row["source"]].append(row["correct"])
        checkpoint["correct"] = {source: sum(correct) / len(correct) for source, correct in samples.items()}
    return report
