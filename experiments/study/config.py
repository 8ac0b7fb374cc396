"""The study's settings (``configs/study.yaml``) as one typed schema, validated once at start.

``parse_config(StudyConfig, cfg)`` (``opd.config``'s, as every entry of this repo uses) merges the composed Hydra
config into these dataclasses (OmegaConf refuses unknown, missing or wrongly typed keys, naming them) and each
``__post_init__`` checks ranges and how the blocks fit together; every problem is a ``ConfigError`` naming the key.
Values come from the YAML file; the dataclasses hold no defaults of their own. The model, SFT, distillation and
evaluation blocks are the recipe's (``experiments.recipe.config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.recipe.config import (
    DistillSettings,
    EvaluationSettings,
    RecipeModel,
    RecipeTeacher,
    check_staged_run,
    require_setting,
)
from experiments.study.chain_task import TIMES
from opd.config import SCHEDULERS

ENTRIES = ("opd", "sft")  # an arm continues the student with opd/train.py or with opd/sft.py
TEACHERS = ("gold", "robust", "none")  # gold-only SFT, SFT on noise-injected demonstrations; none: an SFT arm
TASK_FILES = ("train_demonstrations", "train_noisy_demonstrations", "warm_demonstrations", "distill_prompts",
              "distill_demonstrations", "distill_noisy_demonstrations", "heldout_prompts")


@dataclass
class ChainData:
    """``data``: the chain task's seed, records per horizon and split, and the noise of the noisy files."""

    seed: int
    train: int
    distill: int
    noise: float

    def __post_init__(self) -> None:
        for key in ("train", "distill"):
            require_setting(getattr(self, key) >= 1, f"data.{key}", "an integer >= 1", getattr(self, key))
        require_setting(0 < self.noise < 1, "data.noise", "in (0, 1)", self.noise)


@dataclass
class StudySFT:
    """``sft``: the batch, warmup and lr schedule of the teachers' and the students' SFT, and how long the robust
    teacher continues the gold one on noise-injected demonstrations."""

    batch_size: int
    warmup_steps: int
    teacher_lr_scheduler: str
    student_lr_scheduler: str
    robust_teacher_steps: int

    def __post_init__(self) -> None:
        require_setting(self.batch_size >= 1, "sft.batch_size", "an integer >= 1", self.batch_size)
        require_setting(self.robust_teacher_steps >= 1, "sft.robust_teacher_steps", "an integer >= 1",
                        self.robust_teacher_steps)
        require_setting(self.warmup_steps >= 0, "sft.warmup_steps", "an integer >= 0", self.warmup_steps)
        for key in ("teacher_lr_scheduler", "student_lr_scheduler"):
            require_setting(getattr(self, key) in SCHEDULERS, f"sft.{key}", f"one of {', '.join(SCHEDULERS)}",
                            getattr(self, key))


@dataclass
class StudyArm:
    """One arm: the entry that continues the warm student, the teacher it distils, its task file, whether it learns
    on the student's own rollouts (reported as ``on_policy``), and its own overrides."""

    entry: str
    teacher: str
    data: str
    on_policy: bool
    overrides: list[str]


@dataclass
class WarmStart:
    """``warm``: the warm student is the first kept SFT checkpoint whose greedy accuracy on validation prompts (the
    distillation split) reaches ``min_accuracy`` (``experiments.study.warm_start``)."""

    horizons: list[int]  # the horizons of the student's SFT demonstrations
    check_every: int  # SFT steps between kept checkpoints
    prompts: int
    min_accuracy: float

    def __post_init__(self) -> None:
        require_setting(self.check_every >= 1, "warm.check_every", "an integer >= 1", self.check_every)
        require_setting(self.prompts >= 1, "warm.prompts", "an integer >= 1", self.prompts)
        require_setting(0 <= self.min_accuracy <= 1, "warm.min_accuracy", "in [0, 1] (0: the first kept checkpoint)",
                        self.min_accuracy)


@dataclass
class DivergenceSettings:
    """``divergence``: how the warm student's initial divergence from each teacher is measured."""

    prompts: int
    top_k: int

    def __post_init__(self) -> None:
        require_setting(self.prompts >= 1, "divergence.prompts", "an integer >= 1", self.prompts)
        require_setting(self.top_k >= 1, "divergence.top_k", "an integer >= 1", self.top_k)


@dataclass
class StudyConfig:
    """``python -m experiments.study.study``: the study (``experiments/study/study.py``)."""

    tokenizer: str | None
    out_dir: str
    seeds: list[int]
    horizons: list[int]
    arms: list[str] | None  # the arms to run (the baseline always runs); None: every arm of ``arm_settings``
    threads: int
    jobs: int
    rerun: bool
    data: ChainData
    teacher: RecipeTeacher
    student: RecipeModel
    sft: StudySFT
    warm: WarmStart
    distill: DistillSettings
    arm_settings: dict[str, StudyArm]
    baseline_arm: str
    divergence: DivergenceSettings
    evaluation: EvaluationSettings

    def __post_init__(self) -> None:
        check_staged_run(self)
        require_setting(bool(self.horizons) and len(set(self.horizons)) == len(self.horizons)
                        and all(h in TIMES for h in self.horizons), "horizons",
                        f"a non-empty list of distinct horizons among {sorted(TIMES)}", self.horizons)
        require_setting(bool(self.warm.horizons) and set(self.warm.horizons) <= set(self.horizons), "warm.horizons",
                        "a non-empty subset of horizons", self.warm.horizons)
        require_setting(self.warm.check_every <= self.student.sft_steps, "warm.check_every",
                        f"at most student.sft_steps ({self.student.sft_steps})", self.warm.check_every)
        for name, arm in self.arm_settings.items():
            require_setting(all(c.isalnum() or c in "_.-" for c in name), f"arm_settings.{name}",
                            "named with letters, digits, '_', '-' and '.' only (it names folders and stages)", name)
            require_setting(arm.entry in ENTRIES, f"arm_settings.{name}.entry", f"one of {', '.join(ENTRIES)}", arm.entry)
            require_setting(arm.teacher in TEACHERS, f"arm_settings.{name}.teacher", f"one of {', '.join(TEACHERS)}", arm.teacher)
            require_setting((arm.teacher == "none") == (arm.entry == "sft"), f"arm_settings.{name}.teacher",
                            "none for an sft arm and gold or robust for an opd arm", arm.teacher)
            require_setting(arm.data in TASK_FILES, f"arm_settings.{name}.data", f"one of {', '.join(TASK_FILES)}", arm.data)
        require_setting(self.baseline_arm in self.arm_settings, "baseline_arm",
                        f"one of the arms ({', '.join(self.arm_settings)})", self.baseline_arm)
        unknown = [name for name in self.arms or () if name not in self.arm_settings]
        require_setting(not unknown, "arms", f"a list of arm names among {', '.join(self.arm_settings)}", self.arms)
        steps = self.distill.steps
        for block in ("distill", "evaluation"):
            turns = getattr(self, block).max_turns
            require_setting(turns >= 2 * max(self.horizons) + 1, f"{block}.max_turns",
                            f"at least 2 * max(horizons) + 1 = {2 * max(self.horizons) + 1} (every call retried once, then "
                            "the answer)", turns)
        require_setting(self.distill.eval_every <= steps, "distill.eval_every", f"at most distill.steps ({steps})",
                        self.distill.eval_every)

    @property
    def running_arms(self) -> list[str]:
        """The arms this invocation runs, the baseline first."""
        chosen = list(self.arm_settings) if self.arms is None else list(self.arms)
        return [self.baseline_arm, *(name for name in chosen if name != self.baseline_arm)]
