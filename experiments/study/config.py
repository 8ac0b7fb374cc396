"""The study's settings (``configs/study.yaml``) as one typed schema, validated once at start.

``parse_config(StudyConfig, cfg)`` (``common.config_schema``'s, as every entry of this repo uses) merges the composed Hydra
config into these dataclasses (OmegaConf refuses unknown, missing or wrongly typed keys, naming them) and each
``__post_init__`` checks ranges and how the blocks fit together; every problem is a ``ConfigError`` naming the key.
Values come from the YAML file; the dataclasses hold no defaults of their own. The model, SFT, distillation and
evaluation blocks are the recipe's (``experiments.recipe.config``).
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
from experiments.recipe.config import (
    DistillSettings,
    EvaluationSettings,
    RecipeModel,
    RecipeTeacher,
    check_staged_run,
)
from experiments.study.chain_task import GUARD_NUMBERS, TIMES
from opd.config import SCHEDULERS

ENTRIES = ("opd", "sft")  # an arm continues the student with opd/train.py or with opd/sft.py
TEACHERS = ("gold", "robust", "none")  # gold-only SFT, SFT on noise-injected demonstrations; none: an SFT arm
TASK_FILES = ("train_demonstrations", "train_noisy_demonstrations", "warm_demonstrations", "distill_prompts",
              "distill_demonstrations", "distill_noisy_demonstrations", "heldout_prompts")


@dataclass
class ChainData:
    """``data``: the chain task's seed, records per horizon and split, whether its calls are checked (their input,
    and with ``checked_operand`` their k too), and the noise of the noisy files (and whether their retry notes name
    the retry's input, and which guard number a confused guard misreads), or whether that noise is set from the warm
    students' measured errors instead (``match_noise``)."""

    seed: int
    train: int
    distill: int
    checked: bool
    checked_operand: bool
    value_noise: float
    syntax_noise: float
    operand_share: float
    guard_share: float
    retry_names_input: bool
    guard_numbers: dict
    match_noise: bool

    def __post_init__(self) -> None:
        check_integers("data.", self, ("train", "distill"))
        for key in ("value_noise", "syntax_noise"):
            require(0 <= getattr(self, key) < 1, f"data.{key}", "in [0, 1)", getattr(self, key))
        require(self.value_noise + self.syntax_noise < 1, "data.syntax_noise",
                f"below 1 - data.value_noise = {1 - self.value_noise:g}", self.syntax_noise)
        for key in ("operand_share", "guard_share"):
            require(0 <= getattr(self, key) <= 1, f"data.{key}", "in [0, 1]", getattr(self, key))
        require(self.checked or not self.guard_share, "data.guard_share", "0 unless data.checked is true (only a "
                "checked call has a guard)", self.guard_share)
        require(self.checked or not self.checked_operand, "data.checked_operand", "false unless data.checked is true "
                "(the operand's check is part of the guard)", self.checked_operand)
        weights = self.guard_numbers
        require(isinstance(weights, dict) and set(weights) <= set(GUARD_NUMBERS) and all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights.values())
            and sum(weights.values()) > 0, "data.guard_numbers", f"a mapping of some of {', '.join(GUARD_NUMBERS)} to "
                "weights >= 0, not all 0", weights)
        require(self.checked_operand or not (weights.get("c") or weights.get("m")), "data.guard_numbers",
                "without c and m unless data.checked_operand is true (they are the operand check's numbers)", weights)


@dataclass
class StudySFT:
    """``sft``: the batch, warmup and lr schedule of the teachers' and the students' SFT, how long the robust
    teacher continues the gold one on noise-injected demonstrations, and how long it then continues on them at the
    lower ``robust_anneal_learning_rate`` (0 steps: not at all)."""

    batch_size: int
    warmup_steps: int
    teacher_lr_scheduler: str
    student_lr_scheduler: str
    robust_teacher_steps: int
    robust_anneal_steps: int
    robust_anneal_learning_rate: float

    def __post_init__(self) -> None:
        check_integer("sft.batch_size", self.batch_size, 1)
        check_integer("sft.robust_teacher_steps", self.robust_teacher_steps, 1)
        check_integer("sft.robust_anneal_steps", self.robust_anneal_steps, 0)
        check_positive("sft.robust_anneal_learning_rate", self.robust_anneal_learning_rate)
        check_integer("sft.warmup_steps", self.warmup_steps, 0)
        for key in ("teacher_lr_scheduler", "student_lr_scheduler"):
            check_choice(f"sft.{key}", getattr(self, key), SCHEDULERS)


@dataclass
class StudyArm:
    """One arm: the entry that continues the warm student, the teacher it distils, its task file, whether it learns
    on the student's own rollouts (reported as ``on_policy``), and its own overrides."""

    entry: str
    teacher: str
    data: str
    on_policy: bool
    overrides: list[str]
    seeds: list[int] | None = None  # the seeds it runs on, a subset of the study's; None: every seed


@dataclass
class CheckpointPick:
    """``teacher_pick``: the gold teacher is the first kept SFT checkpoint whose greedy accuracy on the first
    ``prompts`` validation prompts (the distillation split) reaches ``min_accuracy``
    (``experiments.study.warm_start``); when none does by the end of the SFT, the best one if ``best_if_none``, else
    the study stops there."""

    check_every: int  # SFT steps between kept checkpoints
    prompts: int
    min_accuracy: float
    best_if_none: bool

    def _check(self, block: str) -> None:
        check_integer(f"{block}.check_every", self.check_every, 1)
        check_integer(f"{block}.prompts", self.prompts, 1)
        require(0 <= self.min_accuracy <= 1, f"{block}.min_accuracy",
                "in [0, 1] (0: the first kept checkpoint)", self.min_accuracy)

    def __post_init__(self) -> None:
        self._check("teacher_pick")


@dataclass
class WarmStart(CheckpointPick):
    """``warm``: the warm student, picked as the teacher is (``CheckpointPick``), from an SFT on the demonstrations of
    ``horizons``, of which the share ``noisy_share`` is noise-injected at ``data``'s five noise settings (recoveries in
    the student's support before any distillation; written by stage ``data``)."""

    horizons: list[int]
    noisy_share: float

    def __post_init__(self) -> None:
        self._check("warm")
        require(0 <= self.noisy_share <= 1, "warm.noisy_share", "in [0, 1]", self.noisy_share)


@dataclass
class DivergenceSettings:
    """``divergence``: how the warm student's initial divergence from each teacher is measured."""

    prompts: int
    top_k: int
    push_tokens: int

    def __post_init__(self) -> None:
        check_integer("divergence.prompts", self.prompts, 1)
        check_integer("divergence.top_k", self.top_k, 1)
        check_integer("divergence.push_tokens", self.push_tokens, 1)


@dataclass
class Decoding:
    """One decoding of the evaluation: a sampling preset of ``configs/sampling/`` and samples per held-out problem."""

    sampling: str
    samples_per_prompt: int


@dataclass
class StudyEvaluation(EvaluationSettings):
    """``evaluation``: the recipe's block (one seed, one set of limits for every checkpoint) and every decoding."""

    decodings: dict[str, Decoding]

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.decodings), "evaluation.decodings", "at least one decoding", self.decodings)
        for name, decoding in self.decodings.items():
            require(name.isidentifier(), f"evaluation.decodings.{name}", "a name of letters, digits and _", name)
            check_integer(f"evaluation.decodings.{name}.samples_per_prompt", decoding.samples_per_prompt, 1)


@dataclass
class Endpoint:
    """``endpoint``: the pre-registered comparison (the arm minus the baseline at one horizon and decoding, last step)."""

    arm: str
    horizon: int
    decoding: str
    versus: list[str]  # co-primary: the arm minus each of these too (the baseline is always compared)


@dataclass
class CurveSettings:
    """``curve``: the cheap learning curves, every arm's kept checkpoints (every ``distill.eval_every`` steps, the last
    included) and the warm student evaluated on the first ``problems`` held-out problems of ``horizon`` under
    ``decoding``; the full evaluation (every horizon and decoding) runs on the last step only."""

    horizon: int
    problems: int
    decoding: str


GATES = ("G0_teacher_t1_accuracy", "G1_student_intermediate_errors", "G2_recoverable_errors", "G3_kd_horizon_drop",
         "G4_teacher_continuation", "G5_kd_recovery", "G6_student_retry_note", "G7_student_recovery")  # experiments.study.gates: each gate's value and direction


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
    max_wall_s: float | None
    data: ChainData
    teacher: RecipeTeacher
    student: RecipeModel
    sft: StudySFT
    warm: WarmStart
    teacher_pick: CheckpointPick
    distill: DistillSettings
    arm_settings: dict[str, StudyArm]
    baseline_arm: str
    endpoint: Endpoint
    curve: CurveSettings
    divergence: DivergenceSettings
    evaluation: StudyEvaluation
    gates: dict[str, float]

    def __post_init__(self) -> None:
        check_staged_run(self)
        require(bool(self.horizons) and len(set(self.horizons)) == len(self.horizons)
                and all(h in TIMES for h in self.horizons), "horizons",
                f"a non-empty list of distinct horizons among {sorted(TIMES)}", self.horizons)
        require(bool(self.warm.horizons) and set(self.warm.horizons) <= set(self.horizons), "warm.horizons",
                "a non-empty subset of horizons", self.warm.horizons)
        require(self.warm.check_every <= self.student.sft_steps, "warm.check_every",
                f"at most student.sft_steps ({self.student.sft_steps})", self.warm.check_every)
        require(self.teacher_pick.check_every <= self.teacher.sft_steps, "teacher_pick.check_every",
                f"at most teacher.sft_steps ({self.teacher.sft_steps})", self.teacher_pick.check_every)
        for name, arm in self.arm_settings.items():
            check_name(f"arm_settings.{name}", name, "folders and stages")
            check_choice(f"arm_settings.{name}.entry", arm.entry, ENTRIES)
            check_choice(f"arm_settings.{name}.teacher", arm.teacher, TEACHERS)
            require((arm.teacher == "none") == (arm.entry == "sft"), f"arm_settings.{name}.teacher",
                    "none for an sft arm and gold or robust for an opd arm", arm.teacher)
            check_choice(f"arm_settings.{name}.data", arm.data, TASK_FILES)
            require(arm.seeds is None or (bool(arm.seeds) and len(set(arm.seeds)) == len(arm.seeds)),
                    f"arm_settings.{name}.seeds", "null or a non-empty list of distinct seeds", arm.seeds)
        require(self.baseline_arm in self.arm_settings, "baseline_arm",
                f"one of the arms ({', '.join(self.arm_settings)})", self.baseline_arm)
        require(self.arm_settings[self.baseline_arm].seeds is None, f"arm_settings.{self.baseline_arm}.seeds",
                "null: the baseline runs on every seed", self.arm_settings[self.baseline_arm].seeds)
        unknown = [name for name in self.arms or () if name not in self.arm_settings]
        require(not unknown, "arms", f"a list of arm names among {', '.join(self.arm_settings)}", self.arms)
        steps = self.distill.steps
        for block in ("distill", "evaluation"):
            turns = getattr(self, block).max_turns
            require(turns >= 2 * max(self.horizons) + 2, f"{block}.max_turns",
                    f"at least 2 * max(horizons) + 2 = {2 * max(self.horizons) + 2} (every call retried once, the "
                    "answer and a turn to spare)", turns)
        require(self.endpoint.arm in self.arm_settings and self.endpoint.arm != self.baseline_arm,
                "endpoint.arm", f"an arm other than the baseline ({self.baseline_arm})", self.endpoint.arm)
        for other in self.endpoint.versus:
            require(other in self.arm_settings and other not in (self.endpoint.arm, self.baseline_arm),
                    "endpoint.versus", "arms other than the endpoint's and the baseline", self.endpoint.versus)
        require(self.endpoint.horizon in self.horizons, "endpoint.horizon", f"one of {self.horizons}",
                self.endpoint.horizon)
        require(self.endpoint.decoding in self.evaluation.decodings, "endpoint.decoding",
                f"one of {', '.join(self.evaluation.decodings)}", self.endpoint.decoding)
        if sorted(self.gates) != sorted(GATES):
            raise ConfigError(f"gates: expected exactly the keys {', '.join(GATES)}, got {', '.join(self.gates)}")
        require("t1" in self.evaluation.decodings, "evaluation.decodings",
                "a decoding named t1 (the gates read the temperature-1 evaluations)", list(self.evaluation.decodings))
        require(self.distill.eval_every <= steps, "distill.eval_every", f"at most distill.steps ({steps})",
                self.distill.eval_every)
        require(self.curve.horizon in self.horizons, "curve.horizon", f"one of {self.horizons}", self.curve.horizon)
        check_integer("curve.problems", self.curve.problems, 1)
        require(self.curve.decoding in self.evaluation.decodings, "curve.decoding",
                f"one of {', '.join(self.evaluation.decodings)}", self.curve.decoding)

    @property
    def running_arms(self) -> list[str]:
        """The arms this invocation runs, the baseline first."""
        chosen = list(self.arm_settings) if self.arms is None else list(self.arms)
        return [self.baseline_arm, *(name for name in chosen if name != self.baseline_arm)]

    def arm_seeds(self, arm: str) -> list[int]:
        """The seeds ``arm`` runs on: those of ``seeds`` its own ``seeds`` lists (null: all)."""
        own = self.arm_settings[arm].seeds
        return [seed for seed in self.seeds if own is None or seed in own]

    @property
    def teachers(self) -> list[str]:
        """The teachers the running arms distil, and always the robust one (the gates read it)."""
        return sorted({"robust", *(self.arm_settings[arm].teacher for arm in self.running_arms)} - {"none"})
