"""The OPD training run: ``run(cfg)`` wires models, data, episodes, updates, checkpoints and logging.

``mode=on_policy`` (the default): each optimizer step takes the next accumulation window of records, rolls
every micro-batch out with the current student, and distils the frozen teacher's next-token distributions
into the student on exactly those token sequences. ``mode=offline`` is the fixed-data baseline: the same
loss, data order and step accounting on fixed token sequences, either the records' own assistant turns
(``offline.source=dataset``, see ``opd.demonstrations``) or teacher rollouts generated once and cached
(``offline.source=teacher_rollouts``, see ``opd.teacher_rollouts``). The step loop, resume and
checkpoints are ``opd.update_loop``'s.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import torch
from omegaconf import DictConfig

from opd.agent_records import load_agent_records
from opd.chat_format import ChatFormat
from opd.checkpoints import architecture_of, file_fingerprint, vocabulary_fingerprint
from opd.data_order import DataCursor
from opd.demonstrations import demonstration_episode, load_demonstrations
from opd.distill_loss import KL_DIRECTIONS
from opd.distill_step import DistillSettings, distill_update, freeze
from opd.minimind.model import load_model
from opd.minimind.precision import Precision, resolve_precision
from opd.minimind.tokenizer import check_same_tokenizer
from opd.rollout import AgentRollout, RolloutLimits
from opd.sampling import SamplingSettings, TokenSampler
from opd.teacher_rollouts import TeacherRolloutCache, rollout_cache_key, teacher_episodes
from opd.update_loop import OPTIMIZATION_KEYS, plan_steps, run_updates, validate_optimization

MODES = ("on_policy", "offline")
OFFLINE_SOURCES = ("dataset", "teacher_rollouts")
# settings copied verbatim into the resume signature (a continuation must share them)
SIGNATURE_KEYS = ("mode", "max_turns", "max_gen_len", "max_total_len", "open_thinking", "kl_direction",
                  "distill_temperature", *OPTIMIZATION_KEYS)


def validate_settings(cfg: DictConfig) -> None:
    """Refuse out-of-range training settings before any model is loaded, naming the key."""
    validate_optimization(cfg)
    for key in ("max_turns", "max_gen_len", "max_total_len"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {cfg[key]!r}")
    if not isinstance(cfg.distill_temperature, int | float) or not cfg.distill_temperature > 0:
        raise ValueError(f"distill_temperature must be a positive number, got {cfg.distill_temperature!r}")
    if cfg.kl_direction not in KL_DIRECTIONS:
        raise ValueError(f"kl_direction must be one of {KL_DIRECTIONS}, got {cfg.kl_direction!r}")
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    if cfg.offline.source not in OFFLINE_SOURCES:
        raise ValueError(f"offline.source must be one of {OFFLINE_SOURCES}, got {cfg.offline.source!r}")


def check_pair(teacher: torch.nn.Module, student: torch.nn.Module, max_total_len: int) -> None:
    """The teacher and student must share the vocabulary size and fit ``max_total_len`` positions."""
    sizes = {role: model.get_output_embeddings().weight.shape[0] for role, model in
             (("teacher", teacher), ("student", student))}
    if sizes["teacher"] != sizes["student"]:
        raise ValueError(f"teacher and student vocabulary sizes differ: {sizes['teacher']} vs {sizes['student']}")
    for role, model in (("teacher", teacher), ("student", student)):
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and max_total_len > limit:
            raise ValueError(f"max_total_len={max_total_len} exceeds the {role}'s {limit} positions")


def run_signature(cfg: DictConfig, *, teacher, student, tokenizer, data_sha256: str, sampling: SamplingSettings,
                  schedule_steps: int, precision: Precision) -> dict:
    """Everything a continuation must share with the run that wrote the resume file, as flat dotted keys."""
    signature = {"data.sha256": data_sha256, "teacher.checkpoint_sha256": file_fingerprint(cfg.teacher.checkpoint),
                 "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer),
                 "lr_schedule_steps": schedule_steps, "dtype": precision.dtype_name}
    signature.update({f"teacher.{k}": v for k, v in architecture_of(teacher).items()})
    signature.update({f"student.{k}": v for k, v in architecture_of(student).items()})
    signature.update({f"sampling.{k}": v for k, v in asdict(sampling).items()})
    signature.update({key: cfg[key] for key in SIGNATURE_KEYS})
    if cfg.mode == "offline":
        signature["offline.source"] = cfg.offline.source
    return signature


def run(cfg: DictConfig) -> dict:
    """Train the student by on-policy distillation (or its fixed-data baseline) as configured; returns the summary."""
    validate_settings(cfg)
    sampling = SamplingSettings.from_config(cfg.sampling)
    precision = resolve_precision(cfg.device, cfg.dtype)
    torch.manual_seed(cfg.seed)
    from_dataset = cfg.mode == "offline" and cfg.offline.source == "dataset"
    if from_dataset:
        demonstrations, data_sha256 = load_demonstrations(cfg.data)
        records = [demonstration.record for demonstration in demonstrations]
    else:
        records, data_sha256 = load_agent_records(cfg.data)
    student, tokenizer = load_model(cfg.student, role="student")
    teacher, teacher_tokenizer = load_model(cfg.teacher, role="teacher")
    check_same_tokenizer(teacher_tokenizer, tokenizer)
    check_pair(teacher, student, cfg.max_total_len)
    limits = RolloutLimits(cfg.max_turns, cfg.max_gen_len, cfg.max_total_len)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.open_thinking)
    if from_dataset:  # every fixed sequence is built (and checked) before any compute
        fixed = [demonstration_episode(d, chat_format, limits.max_total_len) for d in demonstrations]
    else:
        for record in records:  # fail before any compute if one prompt cannot fit
            chat_format.prompt_ids(record, limits.max_total_len)
    student.to(precision.device)
    freeze(teacher).to(precision.device)
    plan = plan_steps(cfg, len(records))
    signature = run_signature(cfg, teacher=teacher, student=student, tokenizer=tokenizer, data_sha256=data_sha256,
                              sampling=sampling, schedule_steps=plan.schedule_steps, precision=precision)
    sampler = None
    if cfg.mode == "on_policy":
        sampler = TokenSampler(sampling, precision.device, cfg.seed)
        rollout = AgentRollout(student, chat_format, sampler, limits, autocast=precision.autocast)

        def fetch(batch: list[int]):
            return rollout.run([records[i] for i in batch])
    else:
        if not from_dataset:
            cache = TeacherRolloutCache(cfg.offline.cache_dir, cfg.data,
                                        rollout_cache_key(signature, sampling, limits, precision.device))
            fixed = teacher_episodes(cache, records, plan.record_indices(DataCursor(), plan.total_steps),
                                     teacher=teacher, chat_format=chat_format, sampling=sampling, seed=cfg.seed,
                                     limits=limits, batch_size=cfg.batch_size, device=precision.device,
                                     autocast=precision.autocast)

        def fetch(batch: list[int]):
            return [fixed[i] for i in batch]
    update = partial(distill_update, student=student, teacher=teacher,
                     settings=DistillSettings(cfg.distill_temperature, cfg.kl_direction, cfg.grad_clip),
                     precision=precision, pad_token_id=tokenizer.pad_token_id)
    return run_updates(cfg, model=student, plan=plan, signature=signature, fetch=fetch, update=update,
                       precision=precision, sampler=sampler,
                       fetch_key="rollout_s" if cfg.mode == "on_policy" else "data_s")
