"""The CPU recipe end to end: each stage is one real command of this repo, run in order, timed, skipped when done.

    python opd/recipe.py tokenizer=PATH            (make recipe)


1. ``data``: the synthetic tool-use task (``python -m opd.synthetic_task``).
2. ``teacher``: SFT of a seeded random init on the train demonstrations (``opd/sft.py``), long enough to be
   good at the task.
3. ``student``: the same architecture, a shorter SFT from another seed: it knows the format, is worse at
   the task, and has the capacity to reach the teacher (so the comparison measures the training signal,
   not a capacity gap).
4. ``opd`` and ``offline``: on-policy distillation and the fixed-data baseline from that student, with
   every setting equal but ``mode`` (``opd/train.py``), for the same number of optimizer steps.
5. ``evaluate``: the four checkpoints on the held-out split (``opd/evaluate.py``): table, JSON, chart.

A stage is skipped when ``{out_dir}/stages/{name}.json`` records the same command, its outputs exist and
no earlier stage ran in this invocation (a stage that runs makes every later one run too, since they read
its outputs); ``rerun=true`` runs everything again. ``recipe_summary.json`` holds every stage's command and wall time
and the evaluation table.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from opd.atomic_write import atomic_write_json
from opd.reporting import print_table
from opd.user_errors import UserError, exit_on_user_error

REPO_ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
NO_INTERMEDIATE_SAVES = 1_000_000  # save_interval: only the final checkpoint


@dataclass(frozen=True)
class Stage:
    """One recipe step: the command it runs and the files it must leave behind."""

    name: str
    command: list[str]
    outputs: list[Path]


def _architecture(block: DictConfig, prefix: str) -> list[str]:
    return [f"{prefix}.{key}={block[key]}" for key in ARCHITECTURE_KEYS]


def _model_block(checkpoint: Path, block: DictConfig) -> str:
    return "{" + f"checkpoint: '{checkpoint}', " + ", ".join(f"{key}: {block[key]}" for key in ARCHITECTURE_KEYS) + "}"


def recipe_stages(cfg: DictConfig) -> list[Stage]:
    """The recipe's commands, in order."""
    out, python = Path(cfg.out_dir), sys.executable
    data = out / "data"
    common = [f"tokenizer={cfg.tokenizer}", "device=cpu"]
    weights = {role: out / role / f"{role}_sft_{cfg[role].hidden_size}.pth" for role in ("teacher", "student")}
    stages = [Stage("data", [python, "-m", "opd.synthetic_task", "--out", str(data), "--train", str(cfg.data.train),
                             "--heldout", str(cfg.data.heldout), "--seed", str(cfg.seed)],
                    [data / "train_demonstrations.jsonl", data / "train_prompts.jsonl", data / "heldout_prompts.jsonl"])]
    for offset, role in enumerate(("teacher", "student")):
        block = cfg[role]
        epochs = math.ceil(block.sft_steps * cfg.sft.batch_size / cfg.data.train)
        stages.append(Stage(role, [
            python, "opd/sft.py", f"data={data / 'train_demonstrations.jsonl'}", *common, "from_scratch=true",
            f"model.name=recipe_{role}", *_architecture(block, "model"), f"seed={cfg.seed + offset}",
            f"max_steps={block.sft_steps}", f"epochs={epochs}", f"batch_size={cfg.sft.batch_size}", "overwrite=true",
            f"optim.learning_rate={block.learning_rate}", f"optim.warmup_steps={cfg.sft.warmup_steps}",
            "optim.lr_scheduler=cosine",
            f"save_prefix={role}_sft", f"out_dir={out / role}", f"hydra.run.dir={out / role / 'run'}",
            f"save_interval={NO_INTERMEDIATE_SAVES}"], [weights[role]]))
    d = cfg.distill
    distill = [
        "opd/train.py", f"data={data / 'train_prompts.jsonl'}", *common,
        f"teacher.checkpoint={weights['teacher']}", "teacher.name=recipe_teacher", *_architecture(cfg.teacher, "teacher"),
        f"student.checkpoint={weights['student']}", "student.name=recipe_student", *_architecture(cfg.student, "student"),
        f"seed={cfg.seed}", f"max_steps={d.steps}", f"batch_size={d.batch_size}", f"optim.learning_rate={d.learning_rate}",
        f"rollout.max_turns={d.max_turns}", f"rollout.max_gen_len={d.max_gen_len}",
        f"rollout.max_total_len={d.max_total_len}", "overwrite=true",
        f"save_interval={NO_INTERMEDIATE_SAVES}"]
    hidden = cfg.student.hidden_size
    stages.append(Stage("opd", [python, *distill, "mode=on_policy", f"out_dir={out / 'opd'}",
                                f"hydra.run.dir={out / 'opd' / 'run'}"], [out / "opd" / f"agent_opd_{hidden}.pth"]))
    stages.append(Stage("offline", [python, *distill, "mode=offline", f"offline.source={d.offline_source}",
                                    f"offline.cache_dir={out / 'teacher_rollouts'}", f"out_dir={out / 'offline'}",
                                    f"hydra.run.dir={out / 'offline' / 'run'}"],
                        [out / "offline" / f"agent_opd_{hidden}.pth"]))
    models = {"student": (weights["student"], cfg.student), "teacher": (weights["teacher"], cfg.teacher),
              "opd": (out / "opd" / f"agent_opd_{hidden}.pth", cfg.student),
              "offline": (out / "offline" / f"agent_opd_{hidden}.pth", cfg.student)}
    e = cfg.evaluation
    stages.append(Stage("evaluate", [
        python, "opd/evaluate.py", f"data={data / 'heldout_prompts.jsonl'}", *common, f"seed={cfg.seed}",
        "models={" + ", ".join(f"{name}: {_model_block(*spec)}" for name, spec in models.items()) + "}",
        f"batch_size={e.batch_size}", f"rollout.max_turns={e.max_turns}", f"rollout.max_gen_len={e.max_gen_len}",
        f"rollout.max_total_len={e.max_total_len}", f"out_dir={out / 'eval'}", f"hydra.run.dir={out / 'eval' / 'run'}"],
        [out / "eval" / "evaluation.json", out / "eval" / "evaluation.png"]))
    return stages


def run_stage(stage: Stage, marker: Path, threads: int, console: Console) -> float:
    """Run one stage's command from the repository root; returns its wall time. Fails naming the stage."""
    console.rule(f"[bold]{stage.name}")
    console.print(" ".join(stage.command), style="dim", soft_wrap=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    result = subprocess.run(stage.command, cwd=REPO_ROOT, env=env, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise UserError(f"recipe stage {stage.name!r} failed (exit {result.returncode}; its output is above): "
                        f"{' '.join(stage.command)}")
    missing = [str(path) for path in stage.outputs if not path.exists()]
    if missing:
        raise RuntimeError(f"recipe stage {stage.name!r} finished without writing {missing}")
    atomic_write_json(marker, {"command": stage.command, "wall_s": wall})
    return wall


@hydra.main(version_base="1.3", config_path="../configs", config_name="recipe")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error():
        run(cfg)


def run(cfg: DictConfig) -> dict:
    """Run (or resume) the recipe; returns the summary also written to ``recipe_summary.json``."""
    if not cfg.tokenizer:
        raise UserError("tokenizer is not set: pass tokenizer=PATH or export MINIMIND_TOKENIZER")
    out, console = Path(cfg.out_dir), Console()
    times, reused, upstream_ran = {}, [], bool(cfg.rerun)
    stages = recipe_stages(cfg)
    for stage in stages:
        marker = out / "stages" / f"{stage.name}.json"
        done = json.loads(marker.read_text()) if marker.is_file() else None
        if not upstream_ran and done and done["command"] == stage.command and all(p.exists() for p in stage.outputs):
            console.print(f"[bold]{stage.name}[/]: done earlier ({done['wall_s']:.0f} s), skipped")
            times[stage.name], reused = done["wall_s"], [*reused, stage.name]
            continue
        times[stage.name], upstream_ran = run_stage(stage, marker, cfg.threads, console), True
    evaluation = json.loads((out / "eval" / "evaluation.json").read_text())
    table = Table(title="recipe stages")
    table.add_column("stage")
    table.add_column("wall s", justify="right")
    for name, wall in times.items():
        table.add_row(name + (" (earlier run)" if name in reused else ""), f"{wall:.0f}")
    table.add_row("total", f"{sum(times.values()):.0f}")
    console.print(table)
    print_table(evaluation["checkpoints"], console, title="held-out evaluation")
    summary = {"stage_wall_s": times, "total_wall_s": sum(times.values()), "reused_stages": reused,
               "commands": {stage.name: stage.command for stage in stages},
               "evaluation": evaluation["checkpoints"], "chart": evaluation["chart"]}
    atomic_write_json(out / "recipe_summary.json", summary)
    return summary


if __name__ == "__main__":
    main()
