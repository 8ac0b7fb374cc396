"""The CPU recipe's settings (``configs/recipe.yaml``) as one typed schema, validated once at start.

``parse_config(RecipeConfig, cfg)`` (``common.config_schema``'s, as every entry of this repo uses) merges the composed Hydra
config into these dataclasses — OmegaConf checks every value's type and refuses unknown or missing keys, naming the
full key — and each ``__post_init__`` checks ranges, choices and how the blocks fit together; every problem is a
``ConfigError`` naming the key. Values come from the YAML file: the dataclasses hold no defaults of their own,
except an arm's ``learning_rate`` (null: ``distill.learning_rate``), since arms are a mapping a user extends
(``+arms.NAME={entry: ..., data: ..., overrides: [...]}``) and have no YAML entry to inherit it from.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config_schema import (
    ConfigError,
    check_choice,
    check_integer,
    check_integers,
    check_name,
    check_positive,
    require,
)
from opd.config import SCHEDULERS

ENTRIES = ("opd", "sft")  # an arm continues the student with opd/train.py or with opd/sft.py
TASK_FILES = ("train_demonstrations", "distill_prompts", "heldout_prompts")  # what the data stage leaves behind


def check_staged_run(cfg) -> None:
    """The settings every staged experiment shares: a tokenizer, distinct seeds, threads and jobs of at least 1."""
    if not cfg.tokenizer:
        raise ConfigError("tokenizer is not set: pass tokenizer=PATH or export MINIMIND_TOKENIZER")
    require(bool(cfg.seeds) and len(set(cfg.seeds)) == len(cfg.seeds), "seeds",
            "a non-empty list of distinct integers", cfg.seeds)
    check_integer("threads", cfg.threads, 1)
    check_integer("jobs", cfg.jobs, 1)
    if cfg.max_wall_s is not None:
        require(isinstance(cfg.max_wall_s, int | float) and cfg.max_wall_s > 0, "max_wall_s",
                "a positive number of seconds, or null", cfg.max_wall_s)


@dataclass
class TaskSizes:
    """``data``: the synthetic task's seed and the records of each split (``experiments.recipe.synthetic_task``)."""

    seed: int
    train: int  # SFT demonstrations
    distill: int  # prompts of the distillation arms
    heldout: int  # held-out problems

    def __post_init__(self) -> None:
        check_integers("data.", self, ("train", "distill", "heldout"))

    def count(self, task_file: str) -> int:
        """Records in one of the task's files (the task writes exactly the configured counts)."""
        return {"train_demonstrations": self.train, "distill_prompts": self.distill,
                "heldout_prompts": self.heldout}[task_file]


@dataclass
class RecipeModel:
    """``student``: a MiniMind-3-shaped architecture trained by SFT from a seeded random init (the run's seed)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    sft_steps: int
    learning_rate: float

    def _check(self, role: str) -> None:
        check_integers(f"{role}.", self, ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "sft_steps"))
        check_positive(f"{role}.learning_rate", self.learning_rate)

    def __post_init__(self) -> None:
        self._check("student")


@dataclass
class RecipeTeacher(RecipeModel):
    """``teacher``: as a student, from its own init seed."""

    seed: int

    def __post_init__(self) -> None:
        self._check("teacher")


@dataclass
class SFTSettings:
    """``sft``: the batch and warmup of the teacher's and the students' SFT."""

    batch_size: int
    warmup_steps: int

    def __post_init__(self) -> None:
        check_integers("sft.", self, ("batch_size",))
        check_integers("sft.", self, ("warmup_steps",), 0)


@dataclass
class DistillSettings:
    """``distill``: what every arm shares: optimizer steps, curve points, batch, schedule, rollout limits."""

    steps: int
    eval_every: int  # a checkpoint of every arm is evaluated every eval_every steps and at the end
    batch_size: int
    learning_rate: float
    warmup_steps: int
    lr_scheduler: str
    max_turns: int
    max_gen_len: int
    max_total_len: int

    def __post_init__(self) -> None:
        check_integers("distill.", self, ("steps", "eval_every", "batch_size", "max_turns", "max_gen_len", "max_total_len"))
        check_integers("distill.", self, ("warmup_steps",), 0)
        check_positive("distill.learning_rate", self.learning_rate)
        check_choice("distill.lr_scheduler", self.lr_scheduler, SCHEDULERS)


@dataclass
class Arm:
    """One arm: the entry that continues the student, the task file it trains on, and its own overrides."""

    entry: str  # opd: opd/train.py, sft: opd/sft.py
    data: str  # one of TASK_FILES
    overrides: list[str]  # appended to the arm's command
    learning_rate: float | None = None  # the arm's own peak lr (sweeps); null: distill.learning_rate


@dataclass
class EvaluationSettings:
    """``evaluation``: identical for every checkpoint (greedy decoding, one seed, one set of limits)."""

    seed: int
    batch_size: int
    max_turns: int
    max_gen_len: int
    max_total_len: int

    def __post_init__(self) -> None:
        check_integers("evaluation.", self, ("batch_size", "max_turns", "max_gen_len", "max_total_len"))


@dataclass
class RecipeConfig:
    """``python -m experiments.recipe.recipe``: the CPU recipe (``experiments/recipe/recipe.py``)."""

    tokenizer: str | None
    out_dir: str
    seeds: list[int]  # one student and one run of every arm per seed
    threads: int  # torch threads of each stage
    jobs: int  # stages running at once
    max_wall_s: float | None  # start no stage whose projected end falls past this many seconds (experiments.stages)
    data: TaskSizes
    teacher: RecipeTeacher
    student: RecipeModel
    sft: SFTSettings
    distill: DistillSettings
    arms: dict[str, Arm]
    baseline_arm: str  # the paired comparison: every other arm minus this one
    evaluation: EvaluationSettings

    def __post_init__(self) -> None:
        check_staged_run(self)
        require(bool(self.arms), "arms", "a mapping of name -> {entry, data, overrides}", self.arms)
        for name, arm in self.arms.items():
            check_name(f"arms.{name}", name, "folders and stages")
            check_choice(f"arms.{name}.entry", arm.entry, ENTRIES)
            check_choice(f"arms.{name}.data", arm.data, TASK_FILES)
            if arm.learning_rate is not None:
                check_positive(f"arms.{name}.learning_rate", arm.learning_rate)
        require(self.baseline_arm in self.arms, "baseline_arm", f"one of the arms ({', '.join(self.arms)})",
                self.baseline_arm)
