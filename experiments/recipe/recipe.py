"""The CPU recipe end to end: each stage is one real command of this repo, run as a subprocess, timed, skipped when done.

    python -m experiments.recipe.recipe tokenizer=PATH                     (make recipe: one seed)
    python -m experiments.recipe.recipe tokenizer=PATH 'seeds=[0,1,2]'     (three seeds: mean ± standard error)

1. ``data``: the synthetic tool-use task (``python -m experiments.recipe.synthetic_task``): SFT demonstrations, distillation
   prompts and held-out prompts, three splits of disjoint problems.
2. ``teacher``: SFT of a seeded random init on the demonstrations (``opd/sft.py``), long enough to be good at
   the task; ``teacher-eval`` scores it on the held-out split.
3. Per seed: ``student``: the same architecture, a far shorter SFT on the same demonstrations from its own
   seed; ``student-eval`` scores it (every arm's step 0).
4. Per seed and arm (``arms``: on-policy distillation with forward and reverse KL, fixed-data KD on cached
   teacher rollouts, continued SFT): the same optimizer steps, batch and schedule from that student, one run
   that keeps its weights every ``distill.eval_every`` steps (``keep_saved_weights``); then ``eval`` scores
   every kept checkpoint on the held-out split, so each arm is a learning curve.
5. ``report`` (in this process): mean ± standard error per arm and step (and its seconds of training), the
   paired difference of every arm against ``baseline_arm`` on the same held-out problems, the final table and
   the chart (``curves.png``).

Stages run ``jobs`` at a time, each once the stages it reads are done, with ``threads`` torch threads and
its output in ``logs/{name}.log``. A stage the run folder's ``manifest.jsonl`` records as finished with the same
command, inputs and outputs is skipped (``experiments.stages``; other settings need a new ``out_dir``);
``max_wall_s`` bounds one invocation. ``recipe_summary.json`` holds every stage's command and wall time, the curves and the table.
Settings: ``configs/recipe.yaml`` (schema ``experiments.recipe.config.RecipeConfig``, checked once at start).
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the start-up (common.start_up)
    from common.start_up import run_entry

    run_entry("experiments.recipe.recipe")
    raise SystemExit

import json
import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from common.atomic_write import atomic_write_json
from common.config_schema import parse_config
from common.package_files import CONFIG_DIR
from common.start_up import started
from common.user_errors import exit_on_user_error
from experiments.charts import write_curve_chart
from experiments.estimates import paired_difference, read_evaluation
from experiments.recipe.config import TASK_FILES, RecipeConfig, RecipeModel
from experiments.stages import Stage, replay, run_stages
from opd.episodes.scoring import mean_and_se
from opd.reports.charts import require_matplotlib
from opd.training.checkpoints import step_weights_path

ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
NO_INTERMEDIATE_SAVES = 1_000_000  # save_interval: only each run's final checkpoint


def _architecture(block: RecipeModel, prefix: str) -> list[str]:
    return [f"{prefix}.{key}={getattr(block, key)}" for key in ARCHITECTURE_KEYS]


def _model_block(checkpoint: Path, block: RecipeModel) -> str:
    return "{" + f"checkpoint: '{checkpoint}', " + ", ".join(
        f"{key}: {getattr(block, key)}" for key in ARCHITECTURE_KEYS) + "}"


def curve_steps(cfg: RecipeConfig) -> list[int]:
    """The optimizer steps at which every arm's checkpoint is evaluated (the last one is ``distill.steps``)."""
    d = cfg.distill
    return sorted({*range(d.eval_every, d.steps, d.eval_every), d.steps})


def _paths(cfg: RecipeConfig) -> dict:
    out = Path(cfg.out_dir)
    data = out / "data"
    return {"out": out, "data": data, "teacher": out / "teacher" / f"teacher_sft_{cfg.teacher.hidden_size}.pth",
            "files": {name: data / f"{name}.jsonl" for name in TASK_FILES}}


def seed_dir(cfg: RecipeConfig, seed: int) -> Path:
    return Path(cfg.out_dir) / f"seed{seed}"


def student_weights(cfg: RecipeConfig, seed: int) -> Path:
    return seed_dir(cfg, seed) / "student" / f"student_sft_{cfg.student.hidden_size}.pth"


def arm_dir(cfg: RecipeConfig, seed: int, arm: str) -> Path:
    return seed_dir(cfg, seed) / arm


def arm_checkpoint(cfg: RecipeConfig, seed: int, arm: str, step: int) -> Path:
    """The weights an arm's run keeps at ``step`` (``agent_opd_{hidden}`` or ``{save_prefix}_{hidden}`` stem)."""
    stem = f"{'agent_opd' if cfg.arms[arm].entry == 'opd' else 'continued_sft'}_{cfg.student.hidden_size}"
    return step_weights_path(arm_dir(cfg, seed, arm), stem, step)


def eval_dir(cfg: RecipeConfig, seed: int | None, name: str) -> Path:
    return (Path(cfg.out_dir) if seed is None else seed_dir(cfg, seed)) / "eval" / name


def _sft_command(cfg: RecipeConfig, role: str, seed: int, data: Path, out_dir: Path) -> list[str]:
    block = getattr(cfg, role)
    epochs = math.ceil(block.sft_steps * cfg.sft.batch_size / cfg.data.train)
    return [sys.executable, "opd/sft.py", f"data={data}", f"tokenizer={cfg.tokenizer}", "device=cpu",
            "from_scratch=true", f"model.name=recipe_{role}", *_architecture(block, "model"), f"seed={seed}",
            f"max_steps={block.sft_steps}", f"epochs={epochs}", f"batch_size={cfg.sft.batch_size}", "overwrite=true",
            f"optim.learning_rate={block.learning_rate}", f"optim.warmup_steps={cfg.sft.warmup_steps}",
            "optim.lr_scheduler=cosine", f"max_total_len={cfg.distill.max_total_len}", f"save_prefix={role}_sft",
            f"out_dir={out_dir}", f"hydra.run.dir={out_dir / 'run'}", f"save_interval={NO_INTERMEDIATE_SAVES}"]


def _arm_command(cfg: RecipeConfig, seed: int, arm: str) -> list[str]:
    """An arm's run from the seed's student: ``distill.steps`` steps, weights kept every ``distill.eval_every``."""
    d, spec, paths = cfg.distill, cfg.arms[arm], _paths(cfg)
    data = paths["files"][spec.data]
    out = arm_dir(cfg, seed, arm)
    epochs = math.ceil(d.steps * d.batch_size / cfg.data.count(spec.data))
    learning_rate = spec.learning_rate or d.learning_rate  # an arm's own lr: for sweeps only
    common = [f"data={data}", f"tokenizer={cfg.tokenizer}", "device=cpu", f"seed={seed}", f"max_steps={d.steps}",
              f"epochs={epochs}", f"batch_size={d.batch_size}", f"optim.learning_rate={learning_rate}",
              f"optim.warmup_steps={d.warmup_steps}", f"optim.lr_scheduler={d.lr_scheduler}",
              "overwrite=true", f"out_dir={out}", f"hydra.run.dir={out / 'run'}",
              f"save_interval={d.eval_every}", "keep_saved_weights=true"]
    student = student_weights(cfg, seed)
    if spec.entry == "sft":
        return [sys.executable, "opd/sft.py", *common, f"model.checkpoint={student}", "model.name=recipe_student",
                *_architecture(cfg.student, "model"), "save_prefix=continued_sft",
                f"max_total_len={d.max_total_len}", *spec.overrides]
    return [sys.executable, "opd/train.py", *common,
            f"teacher.checkpoint={paths['teacher']}", "teacher.name=recipe_teacher", *_architecture(cfg.teacher, "teacher"),
            f"student.checkpoint={student}", "student.name=recipe_student", *_architecture(cfg.student, "student"),
            f"rollout.max_turns={d.max_turns}", f"rollout.max_gen_len={d.max_gen_len}",
            f"rollout.max_total_len={d.max_total_len}", f"offline.cache_dir={seed_dir(cfg, seed) / 'teacher_rollouts'}",
            *spec.overrides]


def _eval_stage(cfg: RecipeConfig, name: str, out: Path, models: dict[str, tuple[Path, RecipeModel]],
                needs: Iterable[str]) -> Stage:
    """Held-out evaluation of ``models``; every evaluation stage of the recipe decodes with these same settings."""
    e, paths = cfg.evaluation, _paths(cfg)
    command = [sys.executable, "opd/evaluate.py", f"data={paths['files']['heldout_prompts']}",
               f"tokenizer={cfg.tokenizer}", "device=cpu", f"seed={e.seed}", "sampling=greedy",
               "models={" + ", ".join(f"{key}: {_model_block(*spec)}" for key, spec in models.items()) + "}",
               f"batch_size={e.batch_size}", f"rollout.max_turns={e.max_turns}", f"rollout.max_gen_len={e.max_gen_len}",
               f"rollout.max_total_len={e.max_total_len}", "isolate=false", "chart=false", f"out_dir={out}",
               f"hydra.run.dir={out / 'run'}"]
    return Stage(name, command, [out / "evaluation.json"], tuple(needs))


def recipe_stages(cfg: RecipeConfig) -> list[Stage]:
    """The recipe's commands, each after the stages it reads (see the module doc). Training stages come before
    evaluations: of the stages ready to start, the runner starts the first listed."""
    paths, python = _paths(cfg), sys.executable
    files = paths["files"]
    stages = [Stage("data", [python, "-m", "experiments.recipe.synthetic_task", "--out", str(paths["data"]),
                             "--train", str(cfg.data.train), "--distill", str(cfg.data.distill),
                             "--heldout", str(cfg.data.heldout), "--seed", str(cfg.data.seed)], list(files.values())),
              Stage("teacher", _sft_command(cfg, "teacher", cfg.teacher.seed, files["train_demonstrations"],
                                            paths["out"] / "teacher"), [paths["teacher"]], ("data",))]
    evaluations = [_eval_stage(cfg, "teacher-eval", eval_dir(cfg, None, "teacher"),
                               {"teacher": (paths["teacher"], cfg.teacher)}, ("teacher",))]
    steps = curve_steps(cfg)
    for seed in cfg.seeds:
        prefix = f"seed{seed}"
        stages.append(Stage(f"{prefix}-student", _sft_command(cfg, "student", seed, files["train_demonstrations"],
                                                              seed_dir(cfg, seed) / "student"),
                            [student_weights(cfg, seed)], ("data",)))
        evaluations.append(_eval_stage(cfg, f"{prefix}-student-eval", eval_dir(cfg, seed, "student"),
                                       {"student": (student_weights(cfg, seed), cfg.student)}, (f"{prefix}-student",)))
        for arm, spec in cfg.arms.items():
            checkpoints = {f"step{step}": (arm_checkpoint(cfg, seed, arm, step), cfg.student) for step in steps}
            needs = (f"{prefix}-student", *(["teacher"] if spec.entry == "opd" else []))
            stages.append(Stage(f"{prefix}-{arm}", _arm_command(cfg, seed, arm),
                                [path for path, _ in checkpoints.values()], needs))
            evaluations.append(_eval_stage(cfg, f"{prefix}-{arm}-eval", eval_dir(cfg, seed, arm), checkpoints,
                                           (f"{prefix}-{arm}",)))
    stages += evaluations
    return stages


# --- the report: curves, errors bars, paired differences, the final table

TABLE_METRICS = ("tool_success_rate", "tool_error_rate", "recovery_rate", "truncation_rate", "mean_turns")


def _point(step: int, wall: float, runs: list[dict]) -> dict:
    """One curve point over seeds: accuracy mean ± SE over seeds (and the problem-level binomial SE), tool metrics."""
    accuracy, se_seeds = mean_and_se([run["accuracy"] for run in runs])
    episodes = runs[0]["episodes"] * len(runs)
    metrics = {key: (sum(run[key] for run in runs) / len(runs)
                     if all(run[key] is not None for run in runs) else None) for key in TABLE_METRICS}
    return {"step": step, "wall_s": wall, "accuracy": accuracy, "se_seeds": se_seeds,
            "se_problems": math.sqrt(accuracy * (1 - accuracy) / episodes), "seeds": len(runs), **metrics}


def training_seconds(cfg: RecipeConfig, seed: int, arm: str, steps: list[int]) -> list[float]:
    """Seconds an arm's run had trained when it reached each of ``steps`` (``elapsed_s`` of its metrics; a
    rerun appends to the file, so the last row of a step counts)."""
    path = arm_dir(cfg, seed, arm) / "run" / "metrics.jsonl"
    elapsed = {row["step"]: row["elapsed_s"] for row in map(json.loads, path.read_text().splitlines())}
    missing = [step for step in steps if step not in elapsed]
    if missing:
        raise RuntimeError(f"{path} has no metrics for steps {missing}; rerun=true")
    return [elapsed[step] for step in steps]


def curve_report(cfg: RecipeConfig) -> dict:
    """Curves, the final table and the paired differences, from every evaluation the stages wrote."""
    steps, seeds = curve_steps(cfg), list(cfg.seeds)
    teacher = read_evaluation(eval_dir(cfg, None, "teacher"))
    students = {seed: read_evaluation(eval_dir(cfg, seed, "student")) for seed in seeds}
    arms = {arm: {seed: read_evaluation(eval_dir(cfg, seed, arm)) for seed in seeds} for arm in cfg.arms}
    evaluations = [teacher, *students.values(), *(report for runs in arms.values() for report in runs.values())]
    if any((e["settings"], e["data_sha256"]) != (teacher["settings"], teacher["data_sha256"]) for e in evaluations):
        raise RuntimeError("the recipe's evaluations differ in decoding settings or held-out data; rerun=true")
    by_step = {arm: {seed: {c["name"]: c for c in runs[seed]["checkpoints"]} for seed in seeds}
               for arm, runs in arms.items()}
    curves, paired = {}, {}
    for arm, runs in by_step.items():
        walls = [sum(column) / len(seeds) for column in zip(*(training_seconds(cfg, seed, arm, steps) for seed in seeds),
                                                              strict=True)]
        curves[arm] = [_point(0, 0.0, [students[seed]["checkpoints"][0] for seed in seeds]),
                       *(_point(step, wall, [runs[seed][f"step{step}"] for seed in seeds])
                         for step, wall in zip(steps, walls, strict=True))]
    baseline = by_step[cfg.baseline_arm]
    for arm, runs in by_step.items():
        if arm != cfg.baseline_arm:
            paired[arm] = [{"step": step, **paired_difference([runs[s][f"step{step}"]["correct"] for s in seeds],
                                                              [baseline[s][f"step{step}"]["correct"] for s in seeds])}
                           for step in steps]
    teacher_accuracy = teacher["checkpoints"][0]["accuracy"]
    student_accuracy = curves[cfg.baseline_arm][0]["accuracy"]
    gap = teacher_accuracy - student_accuracy
    final = {arm: {**points[-1], "gap_closed": (points[-1]["accuracy"] - student_accuracy) / gap if gap else None,
                   "vs_baseline": paired[arm][-1] if arm in paired else None} for arm, points in curves.items()}
    return {"seeds": seeds, "steps": steps, "teacher": _point(0, 0.0, teacher["checkpoints"]),
            "student": curves[cfg.baseline_arm][0], "curves": curves, "paired_vs_baseline": paired,
            "baseline_arm": cfg.baseline_arm, "final": final, "heldout_problems": teacher["records"]}


def _pm(mean: float, se: float | None) -> str:
    return f"{mean:.3f}" + ("" if se is None else f" ± {se:.3f}")


def print_report(report: dict, console: Console) -> None:
    """The final table (accuracy, tool metrics, gap closed, paired difference) and the curves' accuracies."""
    if not console.is_terminal:  # a log file gets every column unabridged
        console.width = max(console.width, 160)
    one_seed = len(report["seeds"]) == 1
    table = Table(title=f"held-out accuracy after {report['steps'][-1]} steps ({len(report['seeds'])} seed(s), "
                        f"± SE over {'problems' if one_seed else 'seeds'})")
    for header in ("checkpoint", "accuracy", "gap closed", f"minus {report['baseline_arm']} (paired)", "tool ok",
                   "tool err", "recovery", "truncated"):
        table.add_column(header, justify="left" if header == "checkpoint" else "right")

    def cell(value):
        return "-" if value is None else f"{value:.3f}"

    for name, row in [("teacher", report["teacher"]), ("student", report["student"]), *report["final"].items()]:
        se = row["se_problems"] if one_seed else row["se_seeds"]
        paired = row.get("vs_baseline")
        table.add_row(name, _pm(row["accuracy"], se), cell(row.get("gap_closed")),
                      "-" if paired is None else _pm(paired["mean"], paired["se_problems"]),
                      cell(row["tool_success_rate"]), cell(row["tool_error_rate"]), cell(row["recovery_rate"]),
                      cell(row["truncation_rate"]))
    console.print(table)
    curves = Table(title="accuracy per optimizer step (mean over seeds)")
    curves.add_column("arm")
    for point in next(iter(report["curves"].values())):
        curves.add_column(str(point["step"]), justify="right")
    for arm, points in report["curves"].items():
        curves.add_row(arm, *(f"{point['accuracy']:.3f}" for point in points))
    console.print(curves)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="recipe")
def main(cfg: DictConfig) -> None:
    started()  # Ctrl-C from here on stops the stages (experiments.stages)
    with exit_on_user_error():
        run(parse_config(RecipeConfig, cfg))


def run(cfg: RecipeConfig) -> dict:
    """Run (or resume) the recipe as ``cfg`` (checked by ``parse_config``) says; returns the summary also written
    to ``recipe_summary.json``."""
    require_matplotlib()
    out, console = Path(cfg.out_dir), Console()
    stages = recipe_stages(cfg)
    started = time.perf_counter()
    results = run_stages(stages, out, jobs=cfg.jobs, threads=cfg.threads, console=console,
                         places={"tokenizer": Path(cfg.tokenizer)}, max_wall_s=cfg.max_wall_s)
    if len(results) < len(stages):
        return {}  # max_wall_s: the runner named the stages left; the report waits for them
    wall = time.perf_counter() - started
    report = curve_report(cfg)
    chart = write_curve_chart(report, out / "curves.png")
    times = Table(title="recipe stages (wall s; stages ran jobs at a time)")
    times.add_column("stage")
    times.add_column("wall s", justify="right")
    for name, result in results.items():
        times.add_row(name + (" (earlier run)" if result["reused"] else ""), f"{result['wall_s']:.0f}")
    stage_wall = {name: result["wall_s"] for name, result in results.items()}
    from_nothing = replay(stages, stage_wall, cfg.jobs)
    times.add_row("recipe (this invocation)", f"{wall:.0f}")
    times.add_row("recipe from nothing (these stage times)", f"{from_nothing:.0f}")
    console.print(times)
    print_report(report, console)
    summary = {"wall_s": wall, "stage_wall_s": stage_wall, "wall_s_from_nothing": from_nothing,
               "reused_stages": [name for name, r in results.items() if r["reused"]],
               "commands": {stage.name: stage.command for stage in stages}, "report": report, "chart": str(chart)}
    atomic_write_json(out / "recipe_summary.json", summary)
    console.print(f"wrote {out / 'recipe_summary.json'} and {chart}")
    return summary

