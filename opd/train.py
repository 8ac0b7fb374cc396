"""On-policy distillation of a MiniMind student from a frozen MiniMind teacher over tool-use episodes.

    python opd/train.py teacher=agent_768 student=full_sft_768 data=agent_rl.jsonl tokenizer=PATH
    python opd/train.py ... mode=offline      # the fixed-data baseline: same loss, data order and steps

A recipe of ``opd.training.loop``; settings in ``configs/opd.yaml``, reference in ``opd/README.md``.
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the command's start-up (opd.commands)
    try:
        from opd.commands import run
    except ModuleNotFoundError:  # a Python without the project (not the venv's): one line, no traceback
        raise SystemExit("error: this Python has no onpolicy-research: use the venv's (make setup, then source .venv/bin/activate)") from None

    run("train")
    raise SystemExit

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.chat_records import AgentRecord
from common.generation.sampler import TokenSampler
from opd.config import OPDConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import fitting_episodes, load_records, tokenizing_processes
from opd.episodes.episode import Episode
from opd.episodes.token_rows import load_token_rows
from opd.rollouts.guidance import Guide
from opd.rollouts.rollout import AgentRollout
from opd.rollouts.teacher_rollouts import cached_teacher_episodes
from opd.training.checkpoints import file_fingerprint, vocabulary_fingerprint
from opd.training.data_order import Window, teacher_count
from opd.training.distributed import Ranks
from opd.training.loop import Recipe, TrainingRun
from opd.training.loss import distill_loss_step
from opd.training.model_loading import load_student_and_teacher
from opd.training.served_teacher import ServedTeacher
from opd.training.train_log import BrokenTurnWatch


def train(cfg: OPDConfig) -> dict:
    """Distil the teacher into the student as configured (continuing ``cfg.resume``); returns the run summary. Under
    torchrun each rank rolls out and scores its share; the update is what one process makes on the global batch."""
    run = TrainingRun(cfg)
    torch.manual_seed(cfg.seed)
    # --- data and models, checked before any compute
    demonstrated = cfg.demonstrated  # the data file's own demonstrations
    if not cfg.token_rows:  # regen's rows are read below, checked against the student's vocabulary
        records, data_sha256, demonstrations = load_records(cfg.data, demonstrated=demonstrated)
    student, teacher, tokenizer = load_student_and_teacher(cfg)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.rollout.open_thinking)
    # record index -> its fixed episode (the dataset's demonstration, regen's row, or the teacher's cached rollout)
    fixed = {}
    if cfg.token_rows:
        episodes, data_sha256 = load_token_rows(
            cfg.data, vocab=student.get_output_embeddings().weight.shape[0], max_total_len=cfg.rollout.max_total_len,
            drop_too_long=cfg.offline.drop_too_long, with_logprobs=cfg.offline.row_logprobs)
        records, fixed = [episode.record for episode in episodes], dict(enumerate(episodes))
    if demonstrated:
        demonstrations, episodes = fitting_episodes(
            demonstrations, chat_format, cfg.rollout.max_total_len, drop_too_long=cfg.offline.drop_too_long,
            shown=run.ranks.is_main, processes=tokenizing_processes(cfg.offline.dataset_num_proc))
        records, fixed = [demonstration.record for demonstration in demonstrations], dict(enumerate(episodes))
    for record in records if not cfg.token_rows else ():
        chat_format.prompt_ids(record, cfg.rollout.max_total_len)
    order = run.data_order(len(records))
    on_policy = cfg.mode == "on_policy"
    fingerprints = {"data.sha256": data_sha256, "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer)}
    if cfg.local_teacher:
        fingerprints["teacher.checkpoint_sha256"] = file_fingerprint(cfg.teacher.checkpoint)
    scorer = ServedTeacher(cfg.teacher_server, max_total_len=cfg.rollout.max_total_len,
                           vocab=student.get_output_embeddings().weight.shape[0]) if cfg.teacher_server.active else None
    if scorer is not None:  # the model the servers answer with, whatever teacher_server.model named (null: the one)
        fingerprints["teacher_server.served_model"] = scorer.model
    signature = run.signature(order, cfg.recipe_settings(), fingerprints=fingerprints, models={
        "student": student, **({"teacher": teacher} if cfg.local_teacher else {})})
    run.claim(student, "agent_opd", signature)
    if teacher is not None:
        teacher.to(run.device).eval().requires_grad_(False)
    sampler = TokenSampler(cfg.sampling, run.device, run.ranks.seed(cfg.sampling.seed_or(cfg.seed)))
    guide = Guide(teacher, cfg.guidance, sampler, cfg.seed, run.schedule_steps(order)) if (
        on_policy and cfg.guidance.active) else None
    share = cfg.mixture.teacher_share if on_policy else 1.0  # the batch share the teacher's episodes take
    if share > 0 and not fixed:
        needed = [i for window in order.windows() for batch in window.batches for i in batch[:teacher_count(batch, share)]]
        fixed = cached_teacher_episodes(cfg, records, needed, teacher, chat_format, signature, run.ranks, run.device)
    rollout = AgentRollout(student, chat_format, sampler, cfg.rollout, autocast=cfg.precision.autocast)
    recipe = Distillation(cfg, run.ranks, records, fixed=fixed, share=share, rollout=rollout, guide=guide,
                          teacher=teacher, served=scorer)
    try:
        return run.fit(student, order, recipe)
    finally:
        if scorer is not None:
            scorer.close()


@dataclass
class Distillation(Recipe):
    """OPD's step: the first ``share`` of each micro-batch are fixed episodes (cached teacher rollouts, or all of the
    baseline's), the rest the student's rollouts (guided when ``guide`` is set); the teacher scores them all."""

    name = "opd"
    loss_name = "kl"
    cfg: OPDConfig
    ranks: Ranks
    records: list[AgentRecord]
    fixed: dict[int, Episode]
    share: float
    rollout: AgentRollout
    guide: Guide | None
    teacher: torch.nn.Module | None  # None: the served teacher scores every episode
    served: ServedTeacher | None

    def __post_init__(self) -> None:
        on_policy = self.cfg.mode == "on_policy"
        self.chat_format, self.collect_time = self.rollout.chat_format, "rollout_s" if on_policy else "data_s"
        self.sampler = self.rollout.sampler if on_policy else None  # the baseline's resume files keep no sampler
        loss = self.cfg.loss
        watched = on_policy and loss.kl_direction == "forward_kl" and not loss.mask_broken_turns
        self.watch = BrokenTurnWatch() if watched else None
        self.topk_mass: list[torch.Tensor] = []

    def collect(self, window: Window, stop: Callable[[], bool]) -> list[list[Episode]]:
        micro_batches = []
        for index, batch in enumerate(window.batches):
            taken = teacher_count(batch, self.share)
            mine = self.ranks.share(list(range(len(batch))))  # this rank's positions in the global micro-batch
            episodes = [self.fixed[batch[p]] for p in mine if p < taken]
            rolled_out = [p for p in mine if p >= taken]
            if rolled_out:
                policy = self.guide.policy(window.step, index, rolled_out) if self.guide else None
                episodes += self.rollout.run([self.records[batch[p]] for p in rolled_out], policy)
            if self.cfg.loss.mask_broken_turns:
                episodes = [episode.without_broken_turns() for episode in episodes]
            micro_batches.append(episodes)
        if self.served is not None:  # every micro-batch's episodes in one concurrent round of requests
            scored = iter(self.served.score([episode for episodes in micro_batches for episode in episodes], stop))
            micro_batches = [[next(scored) for _ in episodes] for episodes in micro_batches]
        self.topk_mass = [episode.teacher_top.mass() for episodes in micro_batches for episode in episodes
                          if episode.teacher_top is not None]
        return micro_batches

    def loss(self, forward: torch.nn.Module, episodes: list[Episode], batch):
        return distill_loss_step(forward, self.teacher, episodes, batch, self.cfg.loss, self.cfg.precision,
                                 share_prefix=not self.cfg.gradient_checkpointing)

    def metrics(self, step: int) -> dict:
        figures = {}
        if self.topk_mass:  # a top-k teacher (served, or stored in the rows), this rank's targets: its top-k's mass
            masses = torch.cat(self.topk_mass)
            figures["teacher_topk_mass"] = masses.mean().item() if masses.numel() else float("nan")
        if self.guide is not None and self.cfg.guidance.turn_share is not None:
            figures["turn_share"] = self.guide.turn_share(step)  # Guided-OPD's scheduled turn share
        return figures

    def warning(self, metrics: dict) -> str | None:
        return self.watch.check(metrics["step"], metrics["broken_target_share"]) if self.watch else None

