"""On-policy distillation of a MiniMind student from a frozen MiniMind teacher over tool-use episodes.

    python opd/train.py teacher=agent_768 student=full_sft_768 data=agent_rl.jsonl tokenizer=PATH
    python opd/train.py ... mode=offline      # the fixed-data baseline: same loss, data order and steps

Each optimizer step (``train`` below) takes the next window of records; rolls every micro-batch out with
the current student (``mode=on_policy``: batched multi-turn episodes in MiniMind's tool world) or takes
its fixed sequences (``mode=offline``: the records' own demonstrations, or the teacher's rollouts generated
once and cached); runs the frozen teacher on exactly those token ids; and minimizes the T²-scaled
full-vocabulary KL between the two on every generated token, averaged over the window's targets (plus a
MoE student's router loss). Then it clips, steps, logs, and checkpoints every ``save_interval`` steps and
at the end. ``mixture.teacher_share`` (GKD's mixture) takes that share of every on-policy micro-batch from
the teacher's own cached rollouts instead; ``guidance`` lets the teacher steer the student's rollouts
(``opd.guidance``: teacher-written turns, a token mixture, or speculative top-k replacement), its logits kept
from the rollout for the loss. Settings: ``configs/opd.yaml`` (schema ``opd.config.OPDConfig``);
reference: ``opd/README.md``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from common.chat_records import AgentRecord, load_agent_records
from common.generation.sampler import TokenSampler
from common.minimind.model import enable_activation_checkpointing, load_model
from common.minimind.precision import Precision
from common.minimind.tokenizer import check_same_tokenizer
from common.package_files import CONFIG_DIR
from common.run_folders import checks_passed, discard_unless_checked
from common.user_errors import UserError, exit_on_user_error
from opd.chat_format import ChatFormat
from opd.checkpoints import (
    check_out_dir,
    checkpoint_stem,
    file_fingerprint,
    restore,
    rng_state,
    run_signature,
    save_checkpoint,
    vocabulary_fingerprint,
)
from opd.config import GuidanceConfig, LossConfig, OPDConfig, parse_config, register_model_groups
from opd.data_order import DataCursor, DataOrder, Window
from opd.demonstrations import Demonstration, demonstration_episode, load_demonstrations
from opd.distributed import (
    Ranks,
    check_batch_divides,
    data_parallel,
    gradient_sync,
    idle_loss,
    start,
    stop,
    unwrap,
)
from opd.episodes import Episode, PackedBatch, pack_episodes, shared_prefix_length
from opd.guidance import BehaviourPolicy, episode_seed, turn_share_at
from opd.loss import TargetLogits, logits_at_targets, router_aux_coef, router_loss, token_divergence
from opd.optimization import Optimization
from opd.out_dir import hold_out_dir
from opd.reporting import TrainLog, episode_counts, episode_figures, run_dir_of, run_summary
from opd.rollout import AgentRollout
from opd.teacher_rollouts import TeacherRolloutCache, rollout_cache_key, teacher_episodes

register_model_groups()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="opd")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error(), discard_unless_checked():  # stopped at its checks: no folder left behind
        settings = parse_config(OPDConfig, cfg)
        with hold_out_dir(settings.out_dir):  # one run per out_dir, checked writable before anything loads
            train(settings)


def train(cfg: OPDConfig) -> dict:
    """Distil the teacher into the student as configured (continuing ``cfg.resume``); returns the run summary.

    Under ``torchrun`` every process rolls out its share of each global micro-batch with its own sampler
    stream, scores it with its own frozen teacher, and the student is ``DistributedDataParallel``: the update
    is the one a single process makes on the whole global batch. Only rank 0 logs and writes files.
    """
    entered = time.perf_counter()  # metrics' elapsed_s: loading and cached teacher rollouts included
    precision = cfg.precision
    ranks = start(precision.device)
    device = ranks.device(precision.device)
    check_batch_divides(cfg.batch_size, ranks)
    torch.manual_seed(cfg.seed)
    # --- data and models, checked before any compute
    records, data_sha256, demonstrations = read_data(cfg)
    student, teacher, tokenizer = load_student_and_teacher(cfg)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.rollout.open_thinking)
    # record index -> its fixed episode (the dataset's demonstration, or the teacher's cached rollout below)
    fixed: dict[int, Episode] = {index: demonstration_episode(demonstration, chat_format, cfg.rollout.max_total_len)
                                 for index, demonstration in enumerate(demonstrations)}
    for record in records:
        chat_format.prompt_ids(record, cfg.rollout.max_total_len)
    order = DataOrder(len(records), batch_size=cfg.batch_size, accumulation_steps=cfg.accumulation_steps,
                      epochs=cfg.epochs, seed=cfg.seed, max_steps=cfg.max_steps)
    schedule_steps = cfg.optim.lr_schedule_steps or order.total_steps
    signature = opd_signature(cfg, teacher, student, tokenizer, data_sha256, schedule_steps, ranks.world_size)
    stem = checkpoint_stem(student, "agent_opd")
    check_out_dir(cfg.out_dir, stem, resume=cfg.resume, overwrite=cfg.overwrite)
    checks_passed()  # data, models and out_dir are checked: from here on a failure keeps the run's folders
    student.to(device)
    teacher.to(device).eval().requires_grad_(False)
    sampler = TokenSampler(cfg.sampling, device, ranks.seed(cfg.sampling.seed_or(cfg.seed)))
    rollout = AgentRollout(student, chat_format, sampler, cfg.rollout, autocast=precision.autocast)
    guide = Guide(teacher, cfg.guidance, sampler, cfg.seed, schedule_steps) if (
        cfg.mode == "on_policy" and cfg.guidance.active) else None
    share = cfg.mixture.teacher_share if cfg.mode == "on_policy" else 1.0  # the batch share the teacher's episodes take
    if share > 0 and not from_demonstrations(cfg):
        needed = [i for window in order.windows() for batch in window.batches for i in batch[:teacher_count(batch, share)]]
        fixed = cached_teacher_episodes(cfg, records, needed, teacher, chat_format, signature, ranks, device)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(student)
    student_forward = data_parallel(TargetLogits(student), ranks, device)
    optimization = Optimization(student, cfg.optim, schedule_steps, precision)
    step, cursor = 0, DataCursor()
    if cfg.resume:
        step, cursor = restore(cfg.resume, signature, model=student, optimization=optimization,
                               sampler=sampler if cfg.mode == "on_policy" else None, rank=ranks.rank)
    run_dir, start_step, paths, losses, tokens, rolled = run_dir_of(cfg.out_dir), step, (None, None), [], 0, 0
    started = time.perf_counter()
    with TrainLog(run_dir, cfg.logger, total_steps=order.total_steps, start_step=step, label="opd",
                  enabled=ranks.is_main, config=asdict(cfg)) as log:
        for window in order.windows(cursor, step):
            began = time.perf_counter()
            micro_batches = collect_episodes(window, records, fixed, share, rollout, guide, ranks)
            fetched = time.perf_counter()
            update = score_and_update(micro_batches, student_forward, teacher, optimization, cfg, precision, ranks,
                                      tokenizer.pad_token_id, device)
            step, cursor = window.step, window.next_cursor
            # --- log and save
            metrics = step_metrics(window, update, micro_batches, chat_format, ranks, mode=cfg.mode,
                                   times=(entered, began, fetched))
            if guide is not None and cfg.guidance.turn_share is not None:  # Guided-OPD's scheduled turn share
                metrics["turn_share"] = turn_share_at(cfg.guidance, step, schedule_steps)
            log.step(metrics)
            losses.append(metrics["loss"])
            tokens += metrics["assistant_tokens"]
            rolled += sum(len(episodes) for episodes in micro_batches)
            if step % cfg.save_interval == 0 or step == order.total_steps:
                rng_states = ranks.gather(rng_state(sampler if cfg.mode == "on_policy" else None))
                if ranks.is_main:
                    paths = save_checkpoint(cfg.out_dir, stem, student, optimization=optimization, step=step,
                                            cursor=cursor, rng_states=rng_states, signature=signature,
                                            keep_weights=cfg.keep_saved_weights)
    summary = run_summary(step=step, start_step=start_step, losses=losses, tokens=tokens,
                          wall=time.perf_counter() - started, precision=precision, paths=paths, run_dir=run_dir)
    summary.update(world_size=ranks.world_size, episodes_per_rank=ranks.gather(rolled))
    if ranks.is_main:
        log.summary(summary, [run_dir / "summary.json", Path(cfg.out_dir) / f"{stem}_summary.json"])
    del student_forward  # DDP's reducer before the process group (see distributed.stop)
    stop(ranks)
    return summary


@dataclass(frozen=True)
class Guide:
    """The behaviour policy of every guided rollout of a run (``opd.guidance``): the teacher steers as ``settings``
    say, its draws seeded per episode by (run seed, step, micro-batch, place in the global micro-batch)."""

    teacher: torch.nn.Module
    settings: GuidanceConfig
    sampler: TokenSampler
    seed: int
    schedule_steps: int

    def policy(self, step: int, micro_batch: int, positions: list[int]) -> BehaviourPolicy:
        """The policy of one rollout call: micro-batch ``micro_batch`` of step ``step``, the episodes at
        ``positions`` of the global micro-batch."""
        return BehaviourPolicy(self.teacher, self.settings, self.sampler,
                               [episode_seed(self.seed, step, micro_batch, position) for position in positions],
                               turn_share=turn_share_at(self.settings, step, self.schedule_steps))


def collect_episodes(window: Window, records: list[AgentRecord], fixed: dict[int, Episode], share: float,
                     rollout: AgentRollout, guide: Guide | None, ranks: Ranks) -> list[list[Episode]]:
    """This rank's episodes of each micro-batch of ``window``: of the positions it holds (``ranks.share``), the
    first ``share`` of the micro-batch are fixed episodes (the mixture's cached teacher rollouts, or every episode of
    the fixed-data baseline), and the rest are the current student's rollouts of their records, guided when
    ``guide`` is set."""
    micro_batches = []
    for index, batch in enumerate(window.batches):
        taken = teacher_count(batch, share)
        mine = ranks.share(list(range(len(batch))))  # this rank's positions in the global micro-batch
        episodes = [fixed[batch[p]] for p in mine if p < taken]
        rolled_out = [p for p in mine if p >= taken]
        if rolled_out:
            policy = guide.policy(window.step, index, rolled_out) if guide else None
            episodes += rollout.run([records[batch[p]] for p in rolled_out], policy)
        micro_batches.append(episodes)
    return micro_batches


@dataclass(frozen=True)
class Update:
    """What one optimizer step did: this rank's part of the window's mean divergence and router loss (the ranks'
    parts add up to the window's), the window's targets over every rank, the learning rate, the gradient norm."""

    kl: float
    aux: float
    targets: float
    lr: float
    grad_norm: float


def score_and_update(micro_batches: list[list[Episode]], student_forward: torch.nn.Module, teacher: torch.nn.Module,
                     optimization: Optimization, cfg: OPDConfig, precision: Precision, ranks: Ranks, pad_token_id: int,
                     device: torch.device) -> Update:
    """The teacher scores exactly each micro-batch's tokens; the gradient of the divergence averaged over every target
    of the global window accumulates over the micro-batches (``distill_loss_step``); then one clipped optimizer step."""
    packed = [pack_episodes(episodes, pad_token_id) if episodes else None for episodes in micro_batches]
    (targets,) = ranks.sum([sum(batch.target_count for batch in packed if batch is not None)])
    kl, aux = 0.0, 0.0
    unwrap(student_forward).train()
    for index, (batch_episodes, batch) in enumerate(zip(micro_batches, packed, strict=True)):
        with gradient_sync(student_forward, last=index == len(packed) - 1):
            if batch is None:  # this rank's share of a short micro-batch is empty: join the gradient sum
                optimization.backward(idle_loss(student_forward, pad_token_id, device))
                continue
            kl_sum, router = distill_loss_step(student_forward, teacher, batch_episodes, batch.to(device), cfg.loss,
                                               precision, share_prefix=not cfg.gradient_checkpointing)
            # DDP averages the ranks' gradients: scaled by the world size they add up to the window's mean
            loss = kl_sum / targets * ranks.world_size
            if router is not None:
                router = router * (batch.target_count / targets * ranks.world_size)
                loss, aux = loss + router, aux + router.item() / ranks.world_size
            optimization.backward(loss)
            kl += kl_sum.item() / targets
    lr = optimization.lr
    return Update(kl, aux, targets, lr, optimization.step())


def step_metrics(window: Window, update: Update, micro_batches: list[list[Episode]], chat_format: ChatFormat,
                 ranks: Ranks, *, mode: str, times: tuple[float, float, float]) -> dict:
    """The step's line of ``metrics.jsonl``, summed over every rank; ``times`` are when the run was entered, when the
    step began and when its episodes were collected (``time.perf_counter``)."""
    entered, began, fetched = times
    counts = episode_counts([episode for episodes in micro_batches for episode in episodes], chat_format)
    totals = dict(zip([*counts, "kl", "aux"], ranks.sum([*counts.values(), update.kl, update.aux]), strict=True))
    kl, aux, figures = totals.pop("kl"), totals.pop("aux"), episode_figures(totals)
    return {"step": window.step, "epoch": window.epoch, "loss": kl + aux, "kl": kl, "aux_loss": aux,
            "grad_norm": update.grad_norm, "target_tokens": int(update.targets), **figures,
            "tokens_per_s": figures["assistant_tokens"] / (time.perf_counter() - began), "lr": update.lr,
            "rollout_s" if mode == "on_policy" else "data_s": fetched - began,
            "update_s": time.perf_counter() - fetched, "elapsed_s": time.perf_counter() - entered}


def teacher_count(batch: list[int], share: float) -> int:
    """How many episodes of a micro-batch come from the teacher's rollouts: ``share`` of it, rounded down."""
    return math.floor(share * len(batch) + 1e-9)  # 0.29 * 100 is 28.999...: still 29


def from_demonstrations(cfg: OPDConfig) -> bool:
    """Whether the fixed episodes are the data file's own demonstrations (``offline.source=dataset``)."""
    return cfg.mode == "offline" and cfg.offline.source == "dataset"


def read_data(cfg: OPDConfig) -> tuple[list[AgentRecord], str, list[Demonstration]]:
    """The records, the data file's sha256, and their demonstrations (``offline.source=dataset``; otherwise none)."""
    if from_demonstrations(cfg):
        demonstrations, data_sha256 = load_demonstrations(cfg.data)
        return [demonstration.record for demonstration in demonstrations], data_sha256, demonstrations
    records, data_sha256 = load_agent_records(cfg.data)
    return records, data_sha256, []


def opd_signature(cfg: OPDConfig, teacher, student, tokenizer, data_sha256: str, schedule_steps: int,
                  world_size: int) -> dict:
    """What a resumed run must share with the one it continues (``max_steps``, ``epochs``, ``save_interval``,
    ``out_dir``, ``device`` and ``gradient_checkpointing`` may change; the schedule's span is compared
    resolved; the number of processes must stay, since each rank's sampler stream continues). Settings that are
    off (the mixture at 0, guidance, ``loss.jsd_beta`` without ``jsd``) are left out, so runs from before they
    existed still resume."""
    signature = run_signature(
        {"mode": cfg.mode, "seed": cfg.seed, "batch_size": cfg.batch_size, "accumulation_steps": cfg.accumulation_steps,
         "world_size": world_size,
         "dtype": cfg.precision.dtype_name, "lr_schedule_steps": schedule_steps, "optim": cfg.optim,
         "rollout": cfg.rollout, "loss": cfg.loss, "sampling": cfg.sampling,
         **({"offline.source": cfg.offline.source} if cfg.mode == "offline" else {}),
         **({"mixture.teacher_share": cfg.mixture.teacher_share} if cfg.mode == "on_policy" and cfg.mixture.teacher_share
            else {}),
         **({"guidance": cfg.guidance} if cfg.mode == "on_policy" and cfg.guidance.active else {})},
        models={"teacher": teacher, "student": student},
        fingerprints={"data.sha256": data_sha256, "teacher.checkpoint_sha256": file_fingerprint(cfg.teacher.checkpoint),
                      "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer)})
    signature.pop("optim.lr_schedule_steps")
    if cfg.loss.kl_direction != "jsd":
        signature.pop("loss.jsd_beta")
    return signature


def cached_teacher_episodes(cfg: OPDConfig, records: list[AgentRecord], needed: list[int], teacher, chat_format,
                            signature: dict, ranks, device: torch.device) -> dict[int, Episode]:
    """The baseline's teacher episodes of the ``needed`` records: rank 0 rolls out what the cache lacks and
    caches it, then every other rank reads the cache."""
    cache = TeacherRolloutCache(cfg.offline.cache_dir, cfg.data, rollout_cache_key(signature, device))

    def episodes() -> dict[int, Episode]:
        return teacher_episodes(cache, records, needed, teacher=teacher, chat_format=chat_format, sampling=cfg.sampling,
                                seed=cfg.seed, limits=cfg.rollout, batch_size=cfg.batch_size, device=device,
                                autocast=cfg.precision.autocast)

    result = episodes() if ranks.is_main else None
    ranks.barrier()
    return result if ranks.is_main else episodes()


def load_student_and_teacher(cfg: OPDConfig):
    """Both models and the shared tokenizer; they must agree on the vocabulary and fit ``max_total_len``."""
    student, tokenizer = load_model(cfg.student, role="student")
    teacher, teacher_tokenizer = load_model(cfg.teacher, role="teacher")
    check_same_tokenizer(teacher_tokenizer, tokenizer)
    sizes = [model.get_output_embeddings().weight.shape[0] for model in (teacher, student)]
    if sizes[0] != sizes[1]:
        raise UserError(f"teacher and student vocabulary sizes differ: {sizes[0]} vs {sizes[1]}")
    if cfg.guidance.top_k is not None and cfg.guidance.top_k > sizes[0]:
        raise UserError(f"guidance.top_k={cfg.guidance.top_k} exceeds the vocabulary ({sizes[0]} tokens)")
    for role, model in (("teacher", teacher), ("student", student)):
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and cfg.rollout.max_total_len > limit:
            raise UserError(f"rollout.max_total_len={cfg.rollout.max_total_len} exceeds the {role}'s {limit} positions")
    return student, teacher, tokenizer


def distill_loss_step(student_forward: torch.nn.Module, teacher: torch.nn.Module, episodes: list[Episode],
                      batch: PackedBatch, settings: LossConfig, precision: Precision, *, share_prefix: bool = True):
    """One micro-batch: fp32 logits of the frozen teacher and of the student (``student_forward``: its
    ``TargetLogits``, DDP-wrapped under torchrun) at exactly the episodes' target tokens; returns (the T²-scaled
    divergence summed over those targets, the student's weighted router loss or None).

    The teacher's logits are the ones its guided rollouts kept (``Episode.teacher_logits``, in the packed target
    order: row by row, position by position) when every episode has them; otherwise the teacher runs on the batch.
    A prompt prefix every episode shares runs once (for the student unless ``share_prefix`` is off, as under
    gradient checkpointing); a MoE student runs every token (its router loss averages over all of them).
    """
    student = unwrap(student_forward)
    prefix = shared_prefix_length(episodes)
    moe = router_aux_coef(student) is not None
    if all(episode.teacher_logits is not None for episode in episodes):
        teacher_logits = torch.cat([episode.teacher_logits for episode in episodes]).to(batch.input_ids.device)
    else:
        with torch.no_grad(), precision.autocast():
            teacher_logits, _ = logits_at_targets(teacher, batch, prefix)
    with precision.autocast():
        student_logits, output = student_forward(batch.input_ids, batch.attention_mask, batch.target_mask,
                                                 prefix if share_prefix and not moe else 0, router_logits=moe)
    divergence = token_divergence(student_logits, teacher_logits, settings).sum()
    return divergence, router_loss(student, output, batch.attention_mask) if moe else None


if __name__ == "__main__":
    from opd.commands import run

    run("train", main)
