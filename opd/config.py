"""The settings of opd's entries (train, sft, evaluate) as one typed schema, validated once at start; every problem
is a ``ConfigError`` naming the key. Values come from ``configs/`` (no defaults here but the architecture flags and
the sampling keys). Importing this module registers the configs' resolvers."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from common.config_schema import (
    ConfigError,
    auto_or_count,
    check_choice,
    check_integer,
    check_integers,
    check_name,
    check_positive,
    parsed_by,
    require,
)
from common.minimind.precision import Precision, check_precision_names, resolve_precision
from common.minimind.spec import ModelSpec, is_native_checkpoint
from common.package_files import CONFIG_DIR, extras_install, register_resolvers
from common.user_errors import UserError

MODEL_PRESETS = CONFIG_DIR / "model"
DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")
SCHEDULERS = ("constant", "linear", "cosine")
MODES = ("on_policy", "offline")
OFFLINE_SOURCES = ("dataset", "teacher_rollouts", "regen_rows")
GUIDANCE_OPTIONS = ("turn_share", "token_mix", "top_k")
# sampling keys the local rollout does not implement: refused by name when set, never silently ignored
UNIMPLEMENTED_SAMPLING_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
# logger.backends: each metrics backend -> the package it needs, which the extra of the same name installs (jsonl: none)
LOGGER_BACKENDS = {"jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb"}
WANDB_MODES = ("offline", "online", "shared", "disabled")  # wandb.init's modes
PATH_KEYS = ("data", "tokenizer", "out_dir", "resume", "checkpoint", "cache_dir")  # left out of sweep folder names

def per_sweep_job(default: str) -> str:
    """``out_dir: ${per_sweep_job:out/agent_opd}``: ``default`` in a single run; under ``-m``, a folder of that name in
    the job's own sweep folder, so no two jobs share an ``out_dir``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return str(Path(HydraConfig.get().runtime.output_dir) / Path(default).name)
    return default


def path_keys(overrides) -> list[str]:
    """``exclude_keys: ${path_keys:${hydra.overrides.task}}``: the override keys that hold paths (last part in
    ``PATH_KEYS``, or ``models``), left out of sweep folder names (a ``/`` would nest them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [override.key_or_group for override in OverridesParser.create().parse_overrides(list(overrides))]
    return [key for key in keys if key.split(".")[-1] in PATH_KEYS or key == "models"]


OmegaConf.register_new_resolver("per_sweep_job", per_sweep_job, replace=True)
OmegaConf.register_new_resolver("path_keys", path_keys, replace=True)
register_resolvers()  # package_data and tiny_checkpoint, which the presets use


def register_model_groups() -> None:
    """Store every preset of ``configs/model/`` in Hydra's config store as the groups ``teacher`` and ``student``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for path in sorted(MODEL_PRESETS.glob("*.yaml")):
        preset = OmegaConf.load(path)
        for group in ("teacher", "student"):
            store.store(group=group, name=path.stem, node=preset)


class _Precision:
    """The ``device`` and ``dtype`` keys: checked by name when parsed (torch-free), resolved when the run asks."""

    def check_precision(self) -> None:
        try:
            check_precision_names(self.device, self.dtype)
        except UserError as error:
            raise ConfigError(str(error)) from None

    @property
    def precision(self) -> Precision:
        try:
            return resolve_precision(self.device, self.dtype)
        except UserError as error:
            raise ConfigError(str(error)) from None


@dataclass
class SamplingConfig:
    """How the local rollout picks each token; null keys are off; temperature 0 is greedy."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        refused = [key for key in UNIMPLEMENTED_SAMPLING_KEYS if getattr(self, key) is not None]
        if refused:
            raise ConfigError(f"sampling.{', sampling.'.join(refused)}: not implemented by the local rollout; set "
                              f"{'them' if len(refused) > 1 else 'it'} to null (implemented: temperature, top_p, "
                              "top_k, min_p, seed)")
        self.temperature = 1.0 if self.temperature is None else self.temperature
        self.top_p = 1.0 if self.top_p is None else self.top_p
        self.top_k = 0 if self.top_k is None else self.top_k
        self.min_p = 0.0 if self.min_p is None else self.min_p
        require(math.isfinite(self.temperature) and self.temperature >= 0, "sampling.temperature",
                "a number >= 0 (0 = greedy)", self.temperature)
        require(0 < self.top_p <= 1, "sampling.top_p", "in (0, 1]", self.top_p)
        check_integer("sampling.top_k", self.top_k, 0)
        require(0 <= self.min_p <= 1, "sampling.min_p", "in [0, 1]", self.min_p)

    def seed_or(self, run_seed: int) -> int:
        """The sampling seed: ``sampling.seed`` when set, else the run's seed."""
        return self.seed if self.seed is not None else run_seed


@dataclass
class RolloutConfig:
    """Episode limits and the chat template flag: what ``AgentRollout`` runs with."""

    max_turns: int  # assistant turns per episode
    max_gen_len: int  # generated tokens per turn
    max_total_len: int  # prompt + turns + observations
    open_thinking: bool  # passed to the chat template

    def __post_init__(self) -> None:
        check_integers("rollout.", self, ("max_turns", "max_gen_len", "max_total_len"))


@dataclass
class LossConfig:
    """The distillation divergence between temperature-scaled softmaxes, times ``temperature``²."""

    kl_direction: str
    temperature: float
    jsd_beta: float  # kl_direction=jsd only: β in (0, 1); β → 0 tends to forward KL (·β), β → 1 to reverse KL (·(1-β))
    mask_broken_turns: bool = False  # broken turns (unreadable tool calls, cut at max_gen_len) are context, not targets

    def __post_init__(self) -> None:
        check_choice("loss.kl_direction", self.kl_direction, DIVERGENCES)
        require(math.isfinite(self.temperature) and self.temperature > 0, "loss.temperature", "a number > 0",
                self.temperature)
        require(0 < self.jsd_beta < 1, "loss.jsd_beta",
                "in (0, 1) (the limits are loss.kl_direction=forward_kl and reverse_kl)", self.jsd_beta)

    def resume_settings(self) -> dict:
        """What a continuation must share: ``jsd_beta`` only with ``jsd``, ``mask_broken_turns`` only when on (older
        runs still resume)."""
        settings = {"kl_direction": self.kl_direction, "temperature": self.temperature}
        if self.kl_direction == "jsd":
            settings["jsd_beta"] = self.jsd_beta
        if self.mask_broken_turns:
            settings["mask_broken_turns"] = True
        return settings


@dataclass
class GuidanceConfig:
    """The behaviour policy of on-policy rollouts (``opd.rollouts.guidance``): at most one of ``turn_share``,
    ``token_mix`` and ``top_k``; all null: the student writes every token."""

    turn_share: float | None  # Guided-OPD: probability that the teacher writes an assistant turn
    turn_share_final: float | None  # turn_share at the schedule's last step (linear in between); null: turn_share
    token_mix: float | None  # MiniLLM: every token from token_mix·p_teacher + (1 - token_mix)·p_student
    top_k: int | None  # Speculative KD: a student token outside the teacher's top_k is replaced by a teacher sample

    def __post_init__(self) -> None:
        for key in ("turn_share", "turn_share_final", "token_mix"):
            value = getattr(self, key)
            require(value is None or 0 <= value <= 1, f"guidance.{key}", "null or in [0, 1]", value)
        check_integer("guidance.top_k", self.top_k, 1, optional=True)
        require(self.turn_share_final is None or self.turn_share is not None, "guidance.turn_share_final",
                "null unless guidance.turn_share is set", self.turn_share_final)
        chosen = [f"guidance.{key}={getattr(self, key)}" for key in GUIDANCE_OPTIONS if getattr(self, key) is not None]
        if len(chosen) > 1:
            raise ConfigError(f"set at most one of guidance.turn_share, guidance.token_mix and guidance.top_k "
                              f"(got {', '.join(chosen)})")
        if self.turn_share is not None and self.turn_share_final is None:
            self.turn_share_final = self.turn_share

    @property
    def active(self) -> bool:
        """Whether the teacher runs in the decode loop (any option set, even one that never lets it write)."""
        return any(getattr(self, key) is not None for key in GUIDANCE_OPTIONS)


@dataclass
class OptimConfig:
    """AdamW, its learning-rate schedule and gradient clipping."""

    learning_rate: float
    weight_decay: float
    lr_scheduler: str
    warmup_steps: int
    lr_schedule_steps: int | None  # steps the schedule spans; null: the run's planned steps
    grad_clip: float | None  # max gradient norm; null: none

    def __post_init__(self) -> None:
        check_positive("optim.learning_rate", self.learning_rate)
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "optim.weight_decay",
                "a non-negative number", self.weight_decay)
        check_choice("optim.lr_scheduler", self.lr_scheduler, SCHEDULERS)
        check_integer("optim.warmup_steps", self.warmup_steps, 0)
        check_integer("optim.lr_schedule_steps", self.lr_schedule_steps, 1, optional=True)
        require(self.grad_clip is None or self.grad_clip > 0, "optim.grad_clip", "null or > 0", self.grad_clip)

    def resume_settings(self) -> dict:
        """What a continuation must share: all but ``lr_schedule_steps`` (the loop records its resolved span)."""
        return {name: getattr(self, name) for name in
                ("learning_rate", "weight_decay", "lr_scheduler", "warmup_steps", "grad_clip")}


def _endpoints(key: str, value) -> list | None:
    """``teacher_server.endpoints``: null, or a list of URLs (or one), each parsed (``common.endpoints.address``)."""
    from common.endpoints.address import parse_endpoint

    if value is None:
        return None
    urls = [value] if isinstance(value, str) else list(value)
    require(bool(urls), key, "null (the teacher runs in this process) or a list of URLs", value)
    addresses = []
    for url in urls:
        try:
            addresses.append(parse_endpoint(url))
        except ValueError as error:
            raise ConfigError(f"{key}: {error}") from None
    require(len({address.base for address in addresses}) == len(addresses), key, "URLs naming different servers",
            [address.base for address in addresses])
    return addresses


@dataclass
class TeacherServerConfig:
    """The teacher served by vLLM (``opd.training.served_teacher``): top ``top_logprobs`` log-probabilities of the
    student's exact ids; null ``endpoints``: the teacher runs in this process."""

    endpoints: list | None = parsed_by(_endpoints)
    model: str | None  # the served model's name; null: the first the endpoints list
    top_logprobs: int  # k; vLLM refuses more than its --max-logprobs (20 unless raised)
    api_key_env: str | None  # the environment variable holding the API key
    concurrency: int  # requests in flight over all endpoints
    request_timeout_s: float
    max_retries: int

    def __post_init__(self) -> None:
        check_integer("teacher_server.top_logprobs", self.top_logprobs, 1)
        check_integer("teacher_server.concurrency", self.concurrency, 1)
        check_integer("teacher_server.max_retries", self.max_retries, 0)
        check_positive("teacher_server.request_timeout_s", self.request_timeout_s)
        if self.active and self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ConfigError(f"teacher_server.api_key_env={self.api_key_env}: that environment variable is not set",
                              f"export {self.api_key_env}=<your key> first, or drop teacher_server.api_key_env")

    @property
    def active(self) -> bool:
        return self.endpoints is not None


def _processes(key: str, value) -> int | str:
    """``dataset_num_proc``: ``auto`` or an integer >= 1 (``opd.episodes.demonstrations.tokenizing_processes``)."""
    return auto_or_count(key, value, "the CPUs of this rank", 1)


@dataclass
class OfflineConfig:
    """The fixed-data baseline's sequences (``mode=offline``)."""

    source: str  # dataset: the records' own assistant turns; teacher_rollouts: the teacher's episodes, cached;
    # regen_rows: onpolicy-regen's rows (input_ids, loss_mask) as they are
    cache_dir: str
    drop_too_long: bool  # source=dataset: leave out (and count) demonstrations over rollout.max_total_len
    row_logprobs: bool  # source=regen_rows: the loss uses the top-k log-probabilities the rows carry; no teacher
    dataset_num_proc: int | str = parsed_by(_processes)  # source=dataset: processes that tokenize them, or auto

    def __post_init__(self) -> None:
        check_choice("offline.source", self.source, OFFLINE_SOURCES)
        require(self.source == "regen_rows" or not self.row_logprobs, "offline.row_logprobs",
                "false unless offline.source=regen_rows (onpolicy-regen top_logprobs=K stores them)", self.row_logprobs)
        require(self.source != "teacher_rollouts" or not self.drop_too_long, "offline.drop_too_long",
                "false with offline.source=teacher_rollouts (it leaves out the data's fixed sequences)",
                self.drop_too_long)


@dataclass
class MixtureConfig:
    """GKD's mixture (``mode=on_policy``): a share of every micro-batch from the teacher's own cached rollouts."""

    teacher_share: float  # episodes per micro-batch taken from the teacher (rounded down); the rest are the student's

    def __post_init__(self) -> None:
        require(0 <= self.teacher_share < 1, "mixture.teacher_share", "in [0, 1) (all teacher episodes is mode=offline)",
                self.teacher_share)


@dataclass
class WandbConfig:
    """The W&B run of ``logger.backends`` with wandb."""

    project: str
    name: str | None  # null: W&B names the run
    mode: str  # offline (no network), online, shared or disabled; checked only when wandb is a backend


@dataclass
class LoggerConfig:
    """Where metrics go: ``metrics.jsonl`` plus ``backends``; a backend without its package is refused here."""

    backends: list[str]
    wandb: WandbConfig

    def __post_init__(self) -> None:
        for backend in self.backends:
            check_choice("logger.backends", backend, tuple(LOGGER_BACKENDS))
        if "wandb" in self.backends:  # its mode may come from $WANDB_MODE, set for other tools: checked when used
            check_choice("logger.wandb.mode", self.wandb.mode, WANDB_MODES)
        for backend in self.backends:
            package = LOGGER_BACKENDS[backend]
            if package and importlib.util.find_spec(package) is None:
                raise ConfigError(f"logger.backends: {backend} needs the {package} package, which is not installed: "
                                  f"{extras_install(backend)}")


def _model_with_tokenizer(key: str, spec: ModelSpec, tokenizer: str | None) -> None:
    """The model block ``key`` takes the entry's ``tokenizer`` unless it names its own; a MiniMind ``.pth`` holds none,
    so a missing one is refused naming ``tokenizer=``, the key a person types."""
    if spec.tokenizer is None:
        spec.tokenizer = tokenizer
    if not spec.tokenizer and is_native_checkpoint(spec.checkpoint):
        raise ConfigError(f"tokenizer is not set, and {key}.checkpoint={spec.checkpoint} holds none (a MiniMind .pth)",
                          "pass tokenizer=PATH (your MiniMind checkout's tokenizer folder, or a hub id) or export "
                          "MINIMIND_TOKENIZER (`onpolicy-tiny` writes a stand-in one, which the tiny presets use)")


@dataclass
class TrainingRunConfig(_Precision):
    """What every training entry shares: data, output folder and resume, device, and the step loop."""

    tokenizer: str | None
    data: str
    out_dir: str
    resume: str | None
    overwrite: bool  # replace the checkpoints already in out_dir
    device: str
    dtype: str
    seed: int
    batch_size: int
    accumulation_steps: int
    epochs: int
    max_steps: int | None
    save_interval: int
    keep_saved_weights: bool  # also keep each save's weights as {stem}_step{N}.pth
    gradient_checkpointing: bool  # recompute activations in the backward pass instead of keeping them
    optim: OptimConfig
    logger: LoggerConfig

    def __post_init__(self) -> None:
        self.check_precision()
        check_integers("", self, ("batch_size", "accumulation_steps", "epochs", "save_interval"))
        check_integer("max_steps", self.max_steps, 1, optional=True)


@dataclass
class OPDConfig(TrainingRunConfig):
    """``python opd/train.py``: on-policy distillation, or its fixed-data baseline (``mode=offline``)."""

    teacher: ModelSpec
    student: ModelSpec
    sampling: SamplingConfig
    rollout: RolloutConfig
    guidance: GuidanceConfig
    loss: LossConfig
    offline: OfflineConfig
    mixture: MixtureConfig
    mode: str
    teacher_server: TeacherServerConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mode", self.mode, MODES)
        if self.teacher_server.active:
            self._check_top_k_teacher("with teacher_server.endpoints set")
        if self.offline.row_logprobs:
            require(self.mode == "offline", "offline.row_logprobs", "false with mode=on_policy (the student's "
                    "rollouts have no stored scores)", self.offline.row_logprobs)
            require(not self.teacher_server.active, "teacher_server.endpoints", "null with offline.row_logprobs=true "
                    "(the rows carry the teacher's scores)", self.teacher_server.endpoints)
            self._check_top_k_teacher("with offline.row_logprobs=true")
        require(self.mode == "on_policy" or not self.guidance.active, "guidance",
                "off (null keys) with mode=offline (it steers on-policy rollouts)",
                {key: getattr(self.guidance, key) for key in GUIDANCE_OPTIONS if getattr(self.guidance, key) is not None})
        require(self.mode == "on_policy" or not self.mixture.teacher_share, "mixture.teacher_share",
                "0 with mode=offline (the mixture mixes into on-policy batches)", self.mixture.teacher_share)
        for key in ("teacher", "student"):
            _model_with_tokenizer(key, getattr(self, key), self.tokenizer)

    def _check_top_k_teacher(self, served: str) -> None:
        """What a teacher known only by its top-k log-probabilities at temperature 1 can and cannot train."""
        loss = self.loss
        require(loss.kl_direction != "jsd", "loss.kl_direction", f"forward_kl or reverse_kl {served} (JSD needs the "
                "teacher's whole distribution; a server returns its top-k)", loss.kl_direction)
        require(loss.temperature == 1, "loss.temperature", f"1 {served} (vLLM's log-probabilities are at temperature "
                "1 whatever the request's temperature, and a top-k cannot be rescaled)", loss.temperature)
        require(not self.guidance.active, "guidance", f"off {served} (the teacher must decode beside the student)",
                {key: getattr(self.guidance, key) for key in GUIDANCE_OPTIONS if getattr(self.guidance, key) is not None})
        require(not self.mixture.teacher_share, "mixture.teacher_share", f"0 {served} (the teacher's rollouts are "
                "generated in this process)", self.mixture.teacher_share)
        require(self.mode == "on_policy" or self.offline.source != "teacher_rollouts", "offline.source",
                f"dataset or regen_rows {served} (teacher_rollouts are generated in this process; onpolicy-regen "
                "writes a served model's)", self.offline.source)
        if loss.kl_direction == "reverse_kl":
            require(self.mode == "on_policy", "loss.kl_direction", f"forward_kl with mode=offline {served} (the "
                    "sampled-token reverse KL needs the student's own samples)", loss.kl_direction)
            plain = (self.sampling.temperature, self.sampling.top_p, self.sampling.top_k, self.sampling.min_p)
            require(plain == (1.0, 1.0, 0, 0.0), "sampling", f"the student's own distribution (temperature 1, "
                    f"top_p 1, top_k 0, min_p 0) for reverse_kl {served}: the sampled-token estimator is unbiased "
                    "only on samples from it", dict(zip(("temperature", "top_p", "top_k", "min_p"), plain, strict=True)))

    @property
    def demonstrated(self) -> bool:
        """The fixed-data baseline on the data file's own demonstrations (not the teacher's rollouts)."""
        return self.mode == "offline" and self.offline.source == "dataset"

    @property
    def local_teacher(self) -> bool:
        """Whether the teacher runs in this process (not served, and its scores not stored in the rows)."""
        return not (self.teacher_server.active or (self.token_rows and self.offline.row_logprobs))

    @property
    def token_rows(self) -> bool:
        """The fixed-data baseline on onpolicy-regen's rows (``data`` holds token ids, not conversations)."""
        return self.mode == "offline" and self.offline.source == "regen_rows"

    def recipe_settings(self) -> dict:
        """The recipe's part of the resume signature: what is off is left out, so older runs still resume."""
        on_policy = self.mode == "on_policy"
        settings = {"mode": self.mode, "rollout": self.rollout, "loss": self.loss, "sampling": self.sampling}
        if not on_policy:
            settings["offline.source"] = self.offline.source
        if (self.demonstrated or self.token_rows) and self.offline.drop_too_long:
            settings["offline.drop_too_long"] = True
        if on_policy and self.mixture.teacher_share:
            settings["mixture.teacher_share"] = self.mixture.teacher_share
        if on_policy and self.guidance.active:
            settings["guidance"] = self.guidance
        if self.token_rows and self.offline.row_logprobs:
            settings["offline.row_logprobs"] = True
        if self.teacher_server.active:
            settings["teacher_server"] = {"model": self.teacher_server.model,
                                          "top_logprobs": self.teacher_server.top_logprobs}
        return settings


@dataclass
class SFTConfig(TrainingRunConfig):
    """``python opd/sft.py``: cross-entropy on demonstrations' assistant tokens."""

    model: ModelSpec
    from_scratch: bool  # a seeded random init of model's architecture instead of model.checkpoint
    save_prefix: str
    max_total_len: int
    drop_too_long: bool  # leave out (and count) demonstrations over max_total_len instead of refusing the data
    open_thinking: bool
    dataset_num_proc: int | str = parsed_by(_processes)  # processes that tokenize the demonstrations, or auto

    def __post_init__(self) -> None:
        super().__post_init__()
        check_integer("max_total_len", self.max_total_len, 1)
        check_name("save_prefix", self.save_prefix, "files in out_dir")
        _model_with_tokenizer("model", self.model, self.tokenizer)

    def recipe_settings(self) -> dict:
        """The recipe's part of the resume signature; ``drop_too_long`` only when on (runs from before it resume)."""
        settings = {"from_scratch": self.from_scratch, "max_total_len": self.max_total_len,
                    "open_thinking": self.open_thinking}
        if self.drop_too_long:
            settings["drop_too_long"] = True
        return settings


@dataclass
class EvalConfig(_Precision):
    """``python opd/evaluate.py``: several checkpoints on held-out records with identical decoding and limits."""

    sampling: SamplingConfig
    rollout: RolloutConfig
    models: dict[str, ModelSpec]
    tokenizer: str | None
    data: str
    out_dir: str
    device: str
    dtype: str
    seed: int
    samples_per_prompt: int  # k episodes per record, sample j seeded by (seed, the prompt, j): opd.rollouts.sampling.sample_seed
    batch_size: int
    isolate: bool  # each checkpoint in a fresh process (its own peak RSS on CPU)
    chart: bool
    logger: LoggerConfig
    log_step: int  # the x axis of the scores in the loggers (e.g. the training step of the checkpoints)

    def __post_init__(self) -> None:
        self.check_precision()
        check_integer("batch_size", self.batch_size, 1)
        check_integer("samples_per_prompt", self.samples_per_prompt, 1)
        check_integer("log_step", self.log_step, 0)
        require(self.samples_per_prompt == 1 or self.sampling.temperature > 0, "samples_per_prompt",
                "1 with greedy decoding (sampling.temperature=0: every sample would be the same episode; pick a "
                "sampling preset such as sampling=opd_rollout)", self.samples_per_prompt)
        require(bool(self.models), "models", "a mapping of name -> model block (checkpoint and architecture flags)",
                self.models)
        for name, spec in self.models.items():
            check_name(f"models.{name}", name, "files in out_dir")
            _model_with_tokenizer(f"models.{name}", spec, self.tokenizer)
