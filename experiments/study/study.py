"""The study end to end: each stage one real command of this repo, run as a subprocess, timed, skipped when done.

    python -m experiments.study.study tokenizer=PATH                                  (make study)
    python -m experiments.study.study tokenizer=PATH 'seeds=[0]' 'arms=[kd]'          (a slice: the pilot gates)

1. ``data``: the chain task (``python -m experiments.study.chain_task``): horizons of dependent calculator calls,
   gold demonstrations, distillation prompts, every held-out problem at every horizon; three splits disjoint by
   problem. ``noisy-data``: the same problems as noise-injected (DART) demonstrations at ``data.value_noise``,
   ``data.syntax_noise``, ``data.operand_share``, ``data.guard_share`` and ``data.guard_numbers`` (a stage of its
   own, so that setting them from the pilot reruns nothing else); with ``data.match_noise`` at the rates the
   ``noise-match`` stage (``python -m experiments.study.noise_match``) measures on every seed's warm student at
   temperature 1 (its held-out evaluation, step 3), so the robust teacher then waits for the students.
2. ``teacher-gold``: SFT (``opd/sft.py``) of a seeded random init of the teacher's architecture on the gold
   demonstrations, keeping its weights every ``teacher_pick.check_every`` steps, run by
   ``experiments.study.warm_start``, which stops it at the first of them whose greedy validation accuracy reaches
   ``teacher_pick.min_accuracy`` (the task is learnt at a cliff whose step varies with the seed);
   ``teacher-robust``: that teacher continued by SFT on the noise-injected demonstrations (noise
   calls are context, never targets: it learns the retry after a wrong or failed call), for
   ``sft.robust_teacher_steps`` at the teacher's lr (stage ``teacher-robust-sft``), then for
   ``sft.robust_anneal_steps`` at ``sft.robust_anneal_learning_rate``. The teachers the arms
   distil are evaluated on the held-out problems under every decoding.
3. Per seed: ``student``: SFT of the much smaller student architecture from the seed's init on the gold
   demonstrations of ``warm.horizons``, keeping its weights every ``warm.check_every`` steps, stopped at the first of
   them whose greedy accuracy on validation prompts reaches ``warm.min_accuracy`` (none by ``student.sft_steps``: the
   best of them, ``warm.best_if_none``): the warm student every arm of
   the seed starts from (``python -m experiments.study.warm_start``); it is evaluated under every decoding (every
   arm's step 0); ``divergence``: its KL and top-k overlap against each teacher on its own temperature-1 episodes;
   ``continuation``: the robust teacher continuing its temperature-1 held-out episodes after their first call error
   (``python -m experiments.study.continuation``, gate G4; its episodes in ``continuation_episodes.jsonl``).
4. Per seed and arm (``arm_settings``, or the slice ``arms``): one run from that student with the same optimizer
   steps, batch, schedule and data order, keeping its weights every ``distill.eval_every`` steps; every kept
   checkpoint (and the warm student) is evaluated on the learning curve's problems (``curve``: the first
   ``curve.problems`` held-out problems of ``curve.horizon``, stage ``curve-data``) under ``curve.decoding``, and the
   last one on every held-out problem under every decoding of ``evaluation.decodings``.
5. ``report`` (this process, ``experiments.study.report``): the pilot gates (``experiments.study.gates``), per arm,
   horizon, decoding and step accuracy as mean ± SE over seeds and per seed, the paired difference against
   ``baseline_arm`` on the same problems, the pre-registered ``endpoint``, recovery and call errors, seconds of
   training; the charts; ``study_summary.json``.

Stages run ``jobs`` at a time with ``threads`` torch threads each, the robust teacher's SFT stages alone on all
``jobs × threads`` (``experiments.stages``). ``out_dir`` is the run's folder: each finished stage goes into its
``manifest.jsonl`` with the hashes of what it read and wrote, and is skipped by every later invocation, in any clone
on any machine; what later stages read is kept (weights as safetensors, episodes gzipped), scratch (training runs,
kept weights, logs) under ``scratch/`` and ``logs/`` stays out of git (the folder's ``.gitignore``). ``max_wall_s``
bounds a sitting: no stage starts whose projected end falls past it.
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the start-up (common.start_up)
    from common.start_up import run_entry

    run_entry("experiments.study.study")
    raise SystemExit

import json
import math
import re
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console

from common.atomic_write import atomic_write_json
from common.config_schema import parse_config
from common.package_files import CONFIG_DIR
from common.start_up import started
from common.user_errors import exit_on_user_error
from experiments.charts import write_study_charts
from experiments.recipe.config import RecipeModel
from experiments.stage_manifest import Manifest
from experiments.stages import Stage, replay, run_stages
from experiments.study.config import StudyConfig
from experiments.study.report import print_report, study_report, summary_results
from opd.reports.charts import require_matplotlib
from opd.training.checkpoints import step_weights_path

PILOT_TIMES = Path(__file__).parent / "fourth_run_pilots" / "pilot3_study_summary.json"
REPORT_FILES = ("README.md", "gates.json", "study_summary.json", "accuracy_vs_horizon.png", "accuracy_vs_steps.png")
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
NO_INTERMEDIATE_SAVES = 1_000_000  # save_interval: only each run's final checkpoint
DATA_FILES = ("train_demonstrations", "train_prompts", "warm_demonstrations", "distill_demonstrations",
              "distill_prompts", "heldout_prompts")
NOISY_FILES = ("train_noisy_demonstrations", "distill_noisy_demonstrations")


def _architecture(block: RecipeModel, prefix: str) -> list[str]:
    return [f"{prefix}.{key}={getattr(block, key)}" for key in ARCHITECTURE_KEYS]


def _arch_flag(block: RecipeModel) -> str:
    return ",".join(str(getattr(block, key)) for key in ARCHITECTURE_KEYS)


def _model_block(checkpoint: Path, block: RecipeModel) -> str:
    return "{" + f"checkpoint: '{checkpoint}', " + ", ".join(f"{k}: {getattr(block, k)}" for k in ARCHITECTURE_KEYS) + "}"


class StudyPaths:
    """Where every stage of the study reads and writes, under ``out_dir``."""

    def __init__(self, cfg: StudyConfig) -> None:
        self.cfg, self.out = cfg, Path(cfg.out_dir).resolve()
        self.data = self.out / "data"
        self.scratch = self.out / "scratch"  # what no later stage reads: training runs, kept weights, resume files

    def file(self, name: str) -> Path:
        return self.data / f"{name}.jsonl"

    def noise_rates(self) -> Path:
        """The noise settings matched to the warm students (``data.match_noise``; ``experiments.study.noise_match``)."""
        return self.data / "noise_rates.json"

    def teacher(self, kind: str) -> Path:
        return self.out / "teachers" / f"teacher_{kind}_{self.cfg.teacher.hidden_size}.safetensors"

    def teacher_run(self, kind: str) -> Path:
        """The final weights of a teacher's SFT run (``gold_sft``, ``robust_sft``, ``robust``; the kept ones beside)."""
        return self.scratch / "teachers" / kind / f"teacher_{kind}_{self.cfg.teacher.hidden_size}.pth"

    def robust_sft(self) -> Path:
        """The robust teacher before its anneal (``sft.robust_anneal_steps``)."""
        return self.teacher("robust_sft")

    def seed(self, seed: int) -> Path:
        return self.out / f"seed{seed}"

    def student_sft(self, seed: int) -> Path:
        """The student's SFT run (its final weights; the kept ones beside them)."""
        return self.scratch / f"seed{seed}" / "student_sft" / f"student_sft_{self.cfg.student.hidden_size}.pth"

    def student(self, seed: int) -> Path:
        """The warm student: the chosen SFT checkpoint (``experiments.study.warm_start``), its pick in ``.json``."""
        return self.seed(seed) / f"student_warm_{self.cfg.student.hidden_size}.safetensors"

    def arm(self, seed: int, arm: str) -> Path:
        return self.seed(seed) / arm

    def arm_checkpoint(self, seed: int, arm: str, step: int) -> Path:
        """The weights an arm's run keeps at ``step``."""
        entry = self.cfg.arm_settings[arm].entry
        stem = f"{'agent_opd' if entry == 'opd' else 'continued_sft'}_{self.cfg.student.hidden_size}"
        return step_weights_path(self.arm(seed, arm), stem, step)

    def arm_metrics(self, seed: int, arm: str) -> Path:
        """An arm's step log (``opd/train.py``'s ``metrics.jsonl``)."""
        return self.arm(seed, arm) / "run" / "metrics.jsonl"

    def arm_final(self, seed: int, arm: str) -> Path:
        """An arm's last weights as the run keeps them (safetensors, MiniMind's fp16 as evaluated)."""
        return self.arm(seed, arm) / f"student_final_{self.cfg.student.hidden_size}.safetensors"

    def teacher_rollouts(self, seed: int) -> Path:
        """The teacher's rollouts the seed's KD arms distil (``experiments.study.rollout_cache``)."""
        return self.seed(seed) / "teacher_rollouts.jsonl.gz"

    def evaluation(self, seed: int | None, name: str, decoding: str) -> Path:
        return (self.out if seed is None else self.seed(seed)) / "eval" / name / decoding

    def continuation(self, seed: int, name: str = "continuation") -> Path:
        """G4's continuation by the robust teacher, or (``student-continuation``) G6's by the warm student."""
        return self.seed(seed) / f"{name}.json"

    def continuation_episodes(self, seed: int, name: str = "continuation") -> Path:
        return self.seed(seed) / f"{name}_episodes.jsonl"

    def episodes(self, directory: Path, name: str) -> Path:
        """An evaluation's episodes as the run keeps them: ``opd/evaluate.py``'s ``episodes_{name}.jsonl``, gzipped."""
        return directory / f"episodes_{name}.jsonl.gz"

    def divergence(self, seed: int) -> Path:
        return self.seed(seed) / "divergence.json"

    def curve_prompts(self) -> Path:
        """The learning curves' held-out problems (``curve``; ``experiments.study.curve_problems``)."""
        return self.data / "curve_prompts.jsonl"

    def curve(self, seed: int, name: str) -> Path:
        """The learning-curve evaluation of the warm student (``student``) or an arm's kept checkpoints."""
        return self.seed(seed) / "curve" / name


def curve_steps(cfg: StudyConfig) -> list[int]:
    """The optimizer steps at which every arm's checkpoint is kept and evaluated on the learning curve's problems
    (the last one, ``distill.steps``, also under every horizon and decoding)."""
    d = cfg.distill
    return sorted({*range(d.eval_every, d.steps, d.eval_every), d.steps})


def _records(cfg: StudyConfig, name: str) -> int:
    """Records in one of the task's files (the chain task writes exactly the configured counts)."""
    if name.startswith("warm"):
        return cfg.data.train * len(cfg.warm.horizons)
    return (cfg.data.train if name.startswith("train") else cfg.data.distill) * len(cfg.horizons)


def _noise_flags(data) -> list[str]:
    """chain_task's flags of ``data``'s five noise settings."""
    return ["--value-noise", str(data.value_noise), "--syntax-noise", str(data.syntax_noise),
            "--operand-share", str(data.operand_share), "--guard-share", str(data.guard_share),
            "--guard-numbers", ",".join(f"{name}={weight:g}" for name, weight in data.guard_numbers.items())]


def _sft_command(cfg: StudyConfig, block: RecipeModel, role: str, seed: int, data: Path, out: Path,
                 prefix: str, keep_every: int | None = None, start: Path | None = None,
                 steps: int | None = None, learning_rate: float | None = None, noisy: bool = False) -> list[str]:
    """SFT from a seeded random init, or from the weights ``start``, for ``steps`` (default ``block.sft_steps``) at
    ``learning_rate`` (default ``block.learning_rate``); ``keep_every``: also keep the weights every that many
    steps. ``noisy`` demonstrations leave out those over ``distill.max_total_len``: retries make a few of them longer
    than any rollout may grow."""
    steps = block.sft_steps if steps is None else steps
    learning_rate = block.learning_rate if learning_rate is None else learning_rate
    epochs = math.ceil(steps * cfg.sft.batch_size / _records(cfg, data.stem))
    d = cfg.distill
    return [sys.executable, "opd/sft.py", f"data={data}", f"tokenizer={cfg.tokenizer}", "device=cpu",
            "from_scratch=true" if start is None else f"model.checkpoint={start}", f"model.name=study_{role}",
            *_architecture(block, "model"), f"seed={seed}", f"max_steps={steps}", f"epochs={epochs}", f"batch_size={cfg.sft.batch_size}", "overwrite=true",
            f"optim.learning_rate={learning_rate}", f"optim.warmup_steps={cfg.sft.warmup_steps}",
            f"optim.lr_scheduler={getattr(cfg.sft, f'{role}_lr_scheduler')}", f"max_total_len={d.max_total_len}",
            f"save_prefix={prefix}", *(["drop_too_long=true"] if noisy else []),
            f"out_dir={out}", f"hydra.run.dir={out / 'run'}",
            *([f"save_interval={keep_every}", "keep_saved_weights=true"] if keep_every
              else [f"save_interval={NO_INTERMEDIATE_SAVES}"])]


def _arm_command(cfg: StudyConfig, paths: StudyPaths, seed: int, arm: str) -> list[str]:
    """An arm's run from the seed's warm student: ``distill.steps`` steps, weights kept every ``eval_every``."""
    d, spec = cfg.distill, cfg.arm_settings[arm]
    data, out = paths.file(spec.data), paths.arm(seed, arm)
    epochs = math.ceil(d.steps * d.batch_size / _records(cfg, spec.data))
    common = [f"data={data}", f"tokenizer={cfg.tokenizer}", "device=cpu", f"seed={seed}", f"max_steps={d.steps}",
              f"epochs={epochs}", f"batch_size={d.batch_size}", f"optim.learning_rate={d.learning_rate}",
              f"optim.warmup_steps={d.warmup_steps}", f"optim.lr_scheduler={d.lr_scheduler}", "overwrite=true",
              f"out_dir={out}", f"hydra.run.dir={out / 'run'}", f"save_interval={d.eval_every}",
              "keep_saved_weights=true"]
    student, noisy = paths.student(seed), spec.data in NOISY_FILES  # noisy demonstrations: see _sft_command
    if spec.entry == "sft":
        return [sys.executable, "opd/sft.py", *common, f"model.checkpoint={student}", "model.name=study_student",
                *_architecture(cfg.student, "model"), "save_prefix=continued_sft", f"max_total_len={d.max_total_len}",
                *(["drop_too_long=true"] if noisy else []), *spec.overrides]
    return [sys.executable, "opd/train.py", *common, f"teacher.checkpoint={paths.teacher(spec.teacher)}",
            f"teacher.name=study_teacher_{spec.teacher}", *_architecture(cfg.teacher, "teacher"),
            f"student.checkpoint={student}", "student.name=study_student", *_architecture(cfg.student, "student"),
            f"rollout.max_turns={d.max_turns}", f"rollout.max_gen_len={d.max_gen_len}",
            f"rollout.max_total_len={d.max_total_len}",
            f"offline.cache_dir={paths.seed(seed) / 'teacher_rollouts'}",
            *(["offline.drop_too_long=true"] if noisy else []), *spec.overrides]


def _eval_stages(cfg: StudyConfig, paths: StudyPaths, name: str, seed: int | None,
                 models: dict[str, tuple[Path, RecipeModel]], needs: tuple[str, ...]) -> list[Stage]:
    """Held-out evaluation of ``models`` under every decoding of ``evaluation.decodings``: every evaluation of the
    study decodes with these same settings (stage ``{name}-eval-{decoding}``)."""
    stages = []
    for decoding in cfg.evaluation.decodings:
        out = paths.evaluation(seed, name, decoding)
        prefix = name if seed is None else f"seed{seed}-{name}"
        stages.append(Stage(f"{prefix}-eval-{decoding}", _evaluate_command(
            cfg, paths.file("heldout_prompts"), decoding, models, out),
            [out / "evaluation.json", *(paths.episodes(out, key) for key in models)], needs,
            then=tuple(_gzip(paths.episodes(out, key)) for key in models)))
    return stages


def _weights_copy(source: Path, target: Path) -> list[str]:
    """The command that keeps a run's weights ``source`` as ``target`` (safetensors, ``experiments.weights``)."""
    return [sys.executable, "-m", "experiments.weights", str(source), str(target)]


def _gzip(target: Path) -> list[str]:
    """The command that writes ``target`` (``*.gz``) from the file beside it without the suffix (kept)."""
    return [sys.executable, "-m", "gzip", "--best", str(target.with_suffix(""))]


def _curve_stage(cfg: StudyConfig, paths: StudyPaths, name: str, seed: int,
                 models: dict[str, tuple[Path, RecipeModel]], needs: tuple[str, ...]) -> Stage:
    """The learning-curve evaluation of ``models`` on the curve's problems under its decoding (``curve``)."""
    out = paths.curve(seed, name)
    return Stage(f"seed{seed}-{name}-curve", _evaluate_command(cfg, paths.curve_prompts(), cfg.curve.decoding, models,
                                                               out),
                 [out / "evaluation.json", *(paths.episodes(out, key) for key in models)], (*needs, "curve-data"),
                 then=tuple(_gzip(paths.episodes(out, key)) for key in models))


def _evaluate_command(cfg: StudyConfig, data: Path, decoding: str, models: dict[str, tuple[Path, RecipeModel]],
                      out: Path) -> list[str]:
    """``opd/evaluate.py`` of ``models`` on ``data`` under ``decoding``, with the evaluation's one set of settings."""
    e, spec = cfg.evaluation, cfg.evaluation.decodings[decoding]
    return [sys.executable, "opd/evaluate.py", f"data={data}", f"tokenizer={cfg.tokenizer}", "device=cpu",
            f"seed={e.seed}", f"sampling={spec.sampling}", f"samples_per_prompt={spec.samples_per_prompt}",
            "models={" + ", ".join(f"{key}: {_model_block(*model)}" for key, model in models.items()) + "}",
            f"batch_size={e.batch_size}", f"rollout.max_turns={e.max_turns}", f"rollout.max_gen_len={e.max_gen_len}",
            f"rollout.max_total_len={e.max_total_len}", "isolate=false", "chart=false", f"out_dir={out}",
            f"hydra.run.dir={out / 'run'}"]


def _continuation_stage(cfg: StudyConfig, paths: StudyPaths, seed: int, name: str, model: Path, block: RecipeModel,
                        needs: str) -> Stage:
    """``experiments.study.continuation``: ``model`` continues the seed's warm student's T=1 held-out episodes after
    their first recoverable call error (stage ``seed{seed}-{name}``, its report ``paths.continuation(seed, name)``)."""
    e, episodes = cfg.evaluation, paths.episodes(paths.evaluation(seed, "student", "t1"), "student")
    out, continued = paths.continuation(seed, name), paths.continuation_episodes(seed, name)
    return Stage(f"seed{seed}-{name}", [
        sys.executable, "-m", "experiments.study.continuation", "--episodes", str(episodes),
        "--data", str(paths.file("heldout_prompts")), "--tokenizer", str(cfg.tokenizer), "--model", str(model),
        "--arch", _arch_flag(block), "--sampling", e.decodings["t1"].sampling, "--seed", str(seed),
        "--batch-size", str(e.batch_size), "--max-turns", str(e.max_turns), "--max-gen-len", str(e.max_gen_len),
        "--max-total-len", str(e.max_total_len), "--out", str(out), "--episodes-out", str(continued)],
        [out, continued.with_suffix(".jsonl.gz")], (f"seed{seed}-student-eval-t1", needs),
        then=(_gzip(continued.with_suffix(".jsonl.gz")),))


def _pick_command(cfg: StudyConfig, paths: StudyPaths, run: Path, block: RecipeModel, pick, out: Path,
                  sft: list[str]) -> list[str]:
    """``experiments.study.warm_start`` running the SFT command ``sft`` (final weights ``run``): the first
    checkpoint it keeps whose greedy accuracy on the first ``pick.prompts`` distillation prompts reaches
    ``pick.min_accuracy`` is copied to ``out``, and the SFT is stopped there (none: the best, with
    ``pick.best_if_none``)."""
    d = cfg.distill
    return [sys.executable, "-m", "experiments.study.warm_start", "--run-dir", str(run.parent), "--stem", run.stem,
            "--arch", _arch_flag(block), "--data", str(paths.file("distill_prompts")), "--tokenizer", str(cfg.tokenizer),
            "--prompts", str(pick.prompts), "--min-accuracy", str(pick.min_accuracy), "--max-turns", str(d.max_turns),
            "--max-gen-len", str(d.max_gen_len), "--max-total-len", str(d.max_total_len), "--out", str(out),
            "--role", "teacher" if block is cfg.teacher else "student",
            *(["--best-if-none"] if pick.best_if_none else []), "--", *sft]


def with_estimates(stages: list[Stage], arms: list[str], times: Path = PILOT_TIMES) -> list[Stage]:
    """``stages`` with the time each stage of the same kind took in the fourth run's third pilot (``max_wall_s``
    projects from these until the run has measured its own); an arm's stage (of ``arms``), whose parts were stages
    of their own then, by the pilot's ``kd``: its run, curve, evaluations and the two probes it now holds."""
    pilot = {re.sub(r"^seed\d+-", "", name): wall for name, wall in json.loads(times.read_text())["stage_wall_s"].items()}
    arm = sum(pilot.get(part, 0.0) for part in ("kd", "kd-curve", "kd-eval-t1", "kd-eval-greedy", "continuation",
                                                "divergence"))
    return [replace(stage, estimate_s=arm if stage.kind in arms else pilot.get(stage.kind)) for stage in stages]


def study_stages(cfg: StudyConfig) -> list[Stage]:
    """The study's commands, each after the stages it reads (see the module doc). Training comes before
    evaluation: of the stages ready to start, the runner starts the first listed."""
    paths, python, data = StudyPaths(cfg), sys.executable, cfg.data
    task = [python, "-m", "experiments.study.chain_task", "--out", str(paths.data), "--train", str(data.train),
            "--distill", str(data.distill), "--seed", str(data.seed), "--horizons", ",".join(map(str, cfg.horizons)),
            "--warm-horizons", ",".join(map(str, cfg.warm.horizons)), *(["--checked"] if data.checked else []),
            *(["--checked-operand"] if data.checked_operand else [])]
    # the warm start's recoveries (warm.noisy_share) at data's five noise settings, set by hand (see the YAML)
    warm_noise = ["--warm-noisy-share", str(cfg.warm.noisy_share), *_noise_flags(data),
                  *(["--retry-names-input"] if data.retry_names_input else [])] if cfg.warm.noisy_share else []
    warm_files = ["warm_noisy_demonstrations"] if cfg.warm.noisy_share else []
    stages = [Stage("data", [*task, "--part", "task", *warm_noise],
                    [paths.file(name) for name in (*DATA_FILES, *warm_files)], rebuilt=True),
              Stage("curve-data", [python, "-m", "experiments.study.curve_problems", "--heldout",
                                   str(paths.file("heldout_prompts")), "--horizon", str(cfg.curve.horizon),
                                   "--problems", str(cfg.curve.problems), "--out", str(paths.curve_prompts())],
                    [paths.curve_prompts()], ("data",), rebuilt=True)]
    if data.match_noise:  # the rates measured on every seed's warm student at T=1, then the files
        noise = ["--noise-rates", str(paths.noise_rates())]
        stages.append(Stage("noise-match", [
            python, "-m", "experiments.study.noise_match", "--heldout", str(paths.file("heldout_prompts")),
            *(flag for seed in cfg.seeds for flag in (
                "--episodes", str(paths.episodes(paths.evaluation(seed, "student", "t1"), "student")))),
            "--out", str(paths.noise_rates())], [paths.noise_rates()],
            tuple(f"seed{seed}-student-eval-t1" for seed in cfg.seeds)))
    else:
        noise = _noise_flags(data)
    stages.append(Stage("noisy-data", [*task, "--part", "noisy", *noise,
                                       *(["--retry-names-input"] if data.retry_names_input else [])],
                        [paths.file(name) for name in NOISY_FILES], ("noise-match",) if data.match_noise else (),
                        rebuilt=True))
    evaluations = []
    w = cfg.warm
    # the students are listed before the gold teacher, so they start first: a seed's student may run to its cap
    # (the third full run's seed 1: 3,089 s, against 1,366 s for the gold teacher), and the robust teacher waits for
    # every student's T=1 evaluation (noise-match) as for the gold teacher. On that run's stage times the study takes
    # 7,857 s from nothing so, 8,684 s with the gold teacher first (experiments.stages.replay)
    warm_data = "warm_noisy_demonstrations" if w.noisy_share else "warm_demonstrations"
    for seed in cfg.seeds:
        student_sft = _sft_command(cfg, cfg.student, "student", seed, paths.file(warm_data),
                                   paths.student_sft(seed).parent, "student_sft", keep_every=w.check_every,
                                   noisy=bool(w.noisy_share))
        stages.append(Stage(f"seed{seed}-student", _pick_command(cfg, paths, paths.student_sft(seed), cfg.student, w,
                                                                 paths.student(seed), student_sft),
                            [paths.student(seed), paths.student(seed).with_suffix(".json")], ("data",)))
    gold_sft = _sft_command(cfg, cfg.teacher, "teacher", cfg.teacher.seed, paths.file("train_demonstrations"),
                            paths.teacher_run("gold_sft").parent, "teacher_gold_sft",
                            keep_every=cfg.teacher_pick.check_every)
    stages.append(Stage("teacher-gold", _pick_command(cfg, paths, paths.teacher_run("gold_sft"), cfg.teacher,
                                                      cfg.teacher_pick, paths.teacher("gold"), gold_sft),
                        [paths.teacher("gold"), paths.teacher("gold").with_suffix(".json")], ("data",)))
    noisy_sft = partial(_sft_command, cfg, cfg.teacher, "teacher", cfg.teacher.seed,
                        paths.file("train_noisy_demonstrations"), noisy=True)
    robust_start, robust_needs = paths.teacher("gold"), ("teacher-gold", "noisy-data")
    # the robust teacher's stages take every core (wide): only the students' greedy evaluations could run beside
    # them, and an SFT without generation writes the same weights under any thread count (opd/sft.py on 1 and 2
    # threads: identical checkpoints; sampled generation is not so, and keeps ``threads``)
    if cfg.sft.robust_anneal_steps:  # the robust teacher's SFT at the teacher's lr, then the anneal writes it
        stages.append(Stage("teacher-robust-sft", noisy_sft(
            paths.teacher_run("robust_sft").parent, "teacher_robust_sft", start=robust_start,
            steps=cfg.sft.robust_teacher_steps), [paths.robust_sft()], robust_needs, wide=True,
            then=(_weights_copy(paths.teacher_run("robust_sft"), paths.robust_sft()),)))
        robust_start, robust_needs = paths.robust_sft(), ("teacher-robust-sft",)
        steps, learning_rate = cfg.sft.robust_anneal_steps, cfg.sft.robust_anneal_learning_rate
    else:
        steps, learning_rate = cfg.sft.robust_teacher_steps, cfg.teacher.learning_rate
    stages.append(Stage("teacher-robust", noisy_sft(paths.teacher_run("robust").parent, "teacher_robust",
                                                    start=robust_start, steps=steps, learning_rate=learning_rate),
                        [paths.teacher("robust")], robust_needs, wide=True,
                        then=(_weights_copy(paths.teacher_run("robust"), paths.teacher("robust")),)))
    teachers = cfg.teachers
    for kind in teachers:
        evaluations += _eval_stages(cfg, paths, f"teacher_{kind}", None, {kind: (paths.teacher(kind), cfg.teacher)},
                                    (f"teacher-{kind}",))
    steps = curve_steps(cfg)
    for seed in cfg.seeds:
        prefix = f"seed{seed}"
        warm = {"student": (paths.student(seed), cfg.student)}
        evaluations += _eval_stages(cfg, paths, "student", seed, warm, (f"{prefix}-student",))
        evaluations.append(_curve_stage(cfg, paths, "student", seed, warm, (f"{prefix}-student",)))
        evaluations.append(Stage(f"{prefix}-divergence", _divergence_command(
            cfg, paths, seed, paths.student(seed), paths.file("distill_prompts"), paths.divergence(seed)),
            [paths.divergence(seed)], (f"{prefix}-student", *(f"teacher-{kind}" for kind in teachers))))
        # G4: the robust teacher continues the warm student's T=1 episodes after their first recoverable error; G6:
        # the warm student itself, its probability of the retry note there
        evaluations.append(_continuation_stage(cfg, paths, seed, "continuation", paths.teacher("robust"), cfg.teacher,
                                               "teacher-robust"))
        evaluations.append(_continuation_stage(cfg, paths, seed, "student-continuation", paths.student(seed),
                                               cfg.student, f"{prefix}-student"))
        producer = None  # the first arm of the seed that distils the teacher's rollouts keeps them for the others
        for arm in [arm for arm in cfg.running_arms if seed in cfg.arm_seeds(arm)]:
            stages.append(_arm_stage(cfg, paths, seed, arm, steps, producer))
            if _distils_teacher_rollouts(cfg, arm):
                producer = producer or arm
    return stages + evaluations


def _distils_teacher_rollouts(cfg: StudyConfig, arm: str) -> bool:
    return "offline.source=teacher_rollouts" in cfg.arm_settings[arm].overrides


def _arm_stage(cfg: StudyConfig, paths: StudyPaths, seed: int, arm: str, steps: list[int],
               producer: str | None) -> Stage:
    """An arm on one seed, one stage: its run from the warm student, then on the kept checkpoints the learning curve,
    on the last one the full evaluation, the shared-set recovery (it continues the warm student's recoverable T=1
    error prefixes, as G4's teacher does) and the entropy of its own held-out T=1 rollouts (``divergence``), then
    its last weights kept as safetensors in the fp16 they were evaluated in (read back equal). An arm distilling
    the teacher's rollouts keeps them (the seed's first such arm) or restores and checks that one's, so both train on
    the same bytes on any machine."""
    spec, prefix, last = cfg.arm_settings[arm], f"seed{seed}", steps[-1]
    checkpoints = {f"step{step}": (paths.arm_checkpoint(seed, arm, step), cfg.student) for step in steps}
    final = {f"step{last}": checkpoints[f"step{last}"]}
    needs = (f"{prefix}-student", f"{prefix}-student-eval-t1", "curve-data",
             *([f"teacher-{spec.teacher}"] if spec.entry == "opd" else []),
             *(["noisy-data"] if spec.data in NOISY_FILES else []),
             *([f"{prefix}-{producer}"] if producer and _distils_teacher_rollouts(cfg, arm) else []))
    commands, outputs = [_arm_command(cfg, paths, seed, arm)], [paths.arm_metrics(seed, arm)]
    rollouts, cache = paths.teacher_rollouts(seed), [f"--cache-dir={paths.seed(seed) / 'teacher_rollouts'}"]
    if _distils_teacher_rollouts(cfg, arm) and producer:
        commands.insert(0, [sys.executable, "-m", "experiments.study.rollout_cache", "restore", f"--kept={rollouts}",
                            *cache, f"--data={paths.file(spec.data)}"])
        commands.append([sys.executable, "-m", "experiments.study.rollout_cache", "check", f"--kept={rollouts}", *cache])
    elif _distils_teacher_rollouts(cfg, arm):
        commands.append([sys.executable, "-m", "experiments.study.rollout_cache", "keep", f"--kept={rollouts}", *cache])
        outputs.append(rollouts)
    for out, data, decoding, models in (
            (paths.curve(seed, arm), paths.curve_prompts(), cfg.curve.decoding, checkpoints),
            *((paths.evaluation(seed, arm, decoding), paths.file("heldout_prompts"), decoding, final)
              for decoding in cfg.evaluation.decodings)):
        commands += [_evaluate_command(cfg, data, decoding, models, out),
                     *(_gzip(paths.episodes(out, key)) for key in models)]
        outputs += [out / "evaluation.json", *(paths.episodes(out, key) for key in models)]
    recovery = _continuation_stage(cfg, paths, seed, f"{arm}/recovery", paths.arm_checkpoint(seed, arm, last),
                                   cfg.student, "")
    entropy = _divergence_command(cfg, paths, seed, paths.arm_checkpoint(seed, arm, last), paths.file("heldout_prompts"),
                                  paths.arm(seed, arm) / "divergence.json")
    commands += [*recovery.commands, entropy, _weights_copy(paths.arm_checkpoint(seed, arm, last),
                                                            paths.arm_final(seed, arm))]
    outputs += [*recovery.outputs, paths.arm(seed, arm) / "divergence.json", paths.arm_final(seed, arm)]
    return Stage(f"{prefix}-{arm}", commands[0], outputs, needs, then=tuple(commands[1:]))


def _divergence_command(cfg: StudyConfig, paths: StudyPaths, seed: int, student: Path, data: Path,
                        out: Path) -> list[str]:
    """``experiments.study.divergence``: ``student`` on ``data``'s first ``divergence.prompts`` at T=1, its entropy
    and its KL and top-k overlap against each teacher."""
    d = cfg.distill
    return [sys.executable, "-m", "experiments.study.divergence", "--data", str(data), "--tokenizer",
            str(cfg.tokenizer), "--student", str(student), "--student-arch", _arch_flag(cfg.student),
            *(flag for kind in cfg.teachers for flag in ("--teacher", f"{kind}={paths.teacher(kind)}")),
            "--teacher-arch", _arch_flag(cfg.teacher), "--prompts", str(cfg.divergence.prompts),
            "--top-k", str(cfg.divergence.top_k), "--push-tokens", str(cfg.divergence.push_tokens), "--seed", str(seed),
            "--max-turns", str(d.max_turns), "--max-gen-len", str(d.max_gen_len), "--max-total-len",
            str(d.max_total_len), "--out", str(out)]


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="study")
def main(cfg: DictConfig) -> None:
    started()  # Ctrl-C from here on stops the stages (experiments.stages)
    with exit_on_user_error():
        run(parse_config(StudyConfig, cfg))


def stage_machines(out: Path) -> dict[str, dict]:
    """Which machine ran each finished stage, when and for how long (the run folder's manifest)."""
    return {name: {"cpu": entry["machine"]["cpu"], "node": entry["machine"]["node"], "finished": entry["finished"],
                   "wall_s": entry["wall_s"], "torch": entry["torch"]}
            for name, (_, entry) in Manifest(out).entries.items()}


def _gate_line(name: str, gate: dict) -> str:
    value = "-" if gate["value"] is None else f"{gate['value']:.3f}"
    return f"{name} {value} ({gate['direction']} {gate['threshold']}: {'pass' if gate['passed'] else 'FAIL'})"


def run(cfg: StudyConfig) -> dict:
    """Run (or continue) the study; returns the summary also written to ``study_summary.json`` (empty while stages
    remain). Gates first: the stages of the baseline arm's slice (teachers, warm students, the baseline on every
    seed, the probes) run before any other arm, then the gates are read pooled over the seeds into ``gates.json``;
    a failed gate stops the study there (the stop rule of the study README), else every other stage runs."""
    require_matplotlib()
    if Path(cfg.tokenizer).exists():  # one spelling of the tokenizer in every command ({tokenizer} in the manifest)
        cfg = replace(cfg, tokenizer=str(Path(cfg.tokenizer).resolve()))
    out, console, paths = Path(cfg.out_dir).resolve(), Console(), StudyPaths(cfg)
    gate_cfg = replace(cfg, arms=[cfg.baseline_arm])
    stages = with_estimates(study_stages(cfg), list(cfg.arm_settings))
    first = with_estimates(study_stages(gate_cfg), list(cfg.arm_settings))
    every = {stage.name: stage for stage in stages}
    if any(every[stage.name] != stage for stage in first):
        raise RuntimeError("the baseline's slice builds other stages than the full study")
    started = time.perf_counter()
    for phase in (first, stages):
        left = None if cfg.max_wall_s is None else cfg.max_wall_s - (time.perf_counter() - started)
        results = run_stages(phase, out, jobs=cfg.jobs, threads=cfg.threads, console=console,
                             places={"tokenizer": Path(cfg.tokenizer)}, max_wall_s=left, keep=REPORT_FILES)
        if len(results) < len(phase):
            return {}  # max_wall_s: the runner named the stages left; the report waits for them
        if phase is first:
            gates = study_report(gate_cfg, paths, curve_steps(cfg))["gates"]
            atomic_write_json(out / "gates.json", gates)
            failed = [name for name, gate in gates.items() if gate["passed"] is False]
            console.print("gates, pooled over seeds " + ", ".join(map(str, cfg.seeds)) + ": "
                          + ", ".join(_gate_line(name, gate) for name, gate in gates.items()))
            if failed and len(first) < len(stages):
                console.print(f"stop rule: {', '.join(failed)} failed pooled over the seeds; the other arms are not "
                              f"run (experiments/study/README.md), and the study answers nothing")
                return {"gates": gates, "stopped": failed}
    wall = time.perf_counter() - started
    report = study_report(cfg, paths, curve_steps(cfg))
    charts = write_study_charts(report, out)
    print_report(report, console)
    stage_wall = {name: result["wall_s"] for name, result in results.items()}
    summary = {"seeds": list(cfg.seeds), "horizons": list(cfg.horizons), "gates": report["gates"],
               "endpoint": report["endpoint"], "ties": report["ties"], "results": summary_results(report),
               "per_seed": report["per_seed"], "curves": report["curve"], "reading": report["reading"],
               "shared_recovery": report["shared_recovery"], "entropy": report["entropy"],
               "arm_seeds": report["arm_seeds"], "stages": stage_machines(out),
               "wall_s": wall, "stage_wall_s": stage_wall, "stage_wall_s_total": sum(stage_wall.values()),
               "wall_s_from_nothing": replay(stages, stage_wall, cfg.jobs),
               "reused_stages": [name for name, r in results.items() if r["reused"]],
               "commands": {stage.name: stage.command for stage in stages}, "report": report,
               "charts": [str(chart) for chart in charts]}
    atomic_write_json(out / "study_summary.json", summary)
    console.print(f"wrote {out / 'study_summary.json'} and {', '.join(str(chart) for chart in charts)}")
    return summary
