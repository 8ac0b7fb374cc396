"""Batched multi-turn tool-use rollouts of a causal LM on the shared generation engine.

All episodes of a batch are rows of one ``DecodeBatch`` (one carried KV cache). When a turn ends with EOS its tool
calls run and the observation is prefilled onto the row's cache; waiting observations are prefilled together once no
row decodes or half the live rows wait. Logits are fp32 even under autocast (the loss's log-probabilities). A guided
rollout runs the teacher on its own cache fed the same ids, and keeps its fp32 logits at every generated position
(``Episode.teacher_logits``) so the loss need not run it again.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from common.chat_records import AgentRecord
from common.generation.decode_batch import DecodeBatch
from opd.config import RolloutConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import (
    ANSWER,
    MAX_GEN_LEN,
    MAX_TOTAL_LEN,
    MAX_TURNS,
    Episode,
    Turn,
    shared_prefix_length,
)
from opd.rollouts.guidance import BehaviourPolicy
from tools.tool_calls import split_tool_calls
from tools.tool_environment import check_call, execute_call

Sampler = Callable[[torch.Tensor, list[Episode]], torch.Tensor]


@dataclass
class _Row:
    episode: Episode
    index: int  # the record's position in the rollout call
    pending: list[int] | None = None  # observation ids waiting to be prefilled
    teacher_turn: bool = False  # a guided rollout's current turn is the teacher's
    teacher_logits: list[torch.Tensor] | None = None  # a guided rollout's teacher logits, one per generated id

    @property
    def done(self) -> bool:
        return self.episode.stop_reason is not None


class AgentRollout:
    """Runs ``model`` on a batch of agent records and returns one ``Episode`` per record, in order;
    ``teacher_model``: ``model`` is the teacher, so its tokens are recorded as the teacher's."""

    def __init__(self, model: torch.nn.Module, chat_format: ChatFormat, sampler: Sampler, limits: RolloutConfig,
                 *, autocast: Callable[[], AbstractContextManager] = nullcontext, teacher_model: bool = False) -> None:
        self.model = model
        self.chat_format = chat_format
        self.sampler = sampler
        self.limits = limits
        self.autocast = autocast
        self.teacher_model = teacher_model

    def run(self, records: list[AgentRecord], policy: BehaviourPolicy | None = None) -> list[Episode]:
        """Roll out every record (guided by ``policy`` when given: ``opd.rollouts.guidance``); raises ``PromptTooLongError``
        (naming the record) before any compute."""
        prompts = [self.chat_format.prompt_ids(record, self.limits.max_total_len) for record in records]
        rows = [_Row(Episode(record, len(ids), list(ids), turns=[Turn(len(ids), len(ids))]), index,
                     teacher_logits=[] if policy else None)
                for index, (record, ids) in enumerate(zip(records, prompts, strict=True))]
        models = [self.model, *([policy.teacher] if policy else [])]
        was_training = [model.training for model in models]
        for model in models:
            model.eval()
        try:
            with torch.inference_mode(), self.autocast():
                for row in rows:
                    self._start_turn(row, policy)
                self._decode(list(rows), models, policy)
        finally:
            for model, mode in zip(models, was_training, strict=True):
                model.train(mode)
        if policy:  # stacked outside inference mode: the loss reads them (as constants)
            for row in rows:
                row.episode.teacher_logits = torch.stack(row.teacher_logits)
        return [row.episode for row in rows]

    @staticmethod
    def _start_turn(row: _Row, policy: BehaviourPolicy | None) -> None:
        row.teacher_turn = policy is not None and policy.teacher_writes_turn(row.index)

    def _decode(self, live: list[_Row], models: list[torch.nn.Module], policy: BehaviourPolicy | None) -> None:
        """The batched decode loop; ``models`` is the student, then (guided) the teacher, each on its own cache."""
        batch = DecodeBatch(models, len(live), self.chat_format.pad_token_id)
        prefix = shared_prefix_length([row.episode for row in live])
        if prefix:
            batch.prefill_shared_prefix(live[0].episode.ids[:prefix])
        while live:
            waiting = [row for row in live if row.pending is not None]
            if waiting and 2 * len(waiting) >= len(live):
                for row in waiting:
                    self._release(row)
                    self._start_turn(row, policy)
            feeds = [row.episode.ids[fed:] if row.pending is None else [] for row, fed in zip(live, batch.lengths,
                                                                                              strict=True)]
            student_logits, *teacher = batch.step(feeds)
            fed_rows = [index for index, feed in enumerate(feeds) if feed]
            episodes = [live[index].episode for index in fed_rows]
            if policy:
                teacher_logits = teacher[0]
                tokens, by_teacher = policy.choose(student_logits, teacher_logits, episodes,
                                                   [live[index].index for index in fed_rows],
                                                   [live[index].teacher_turn for index in fed_rows])
            else:
                tokens, by_teacher = self.sampler(student_logits, episodes), [self.teacher_model] * len(fed_rows)
            logprobs = torch.log_softmax(student_logits, dim=-1).gather(1, tokens[:, None])[:, 0]
            for n, (index, token, logprob) in enumerate(zip(fed_rows, tokens.tolist(), logprobs.tolist(), strict=True)):
                row = live[index]
                if policy:
                    row.teacher_logits.append(teacher_logits[n])
                self._append(row, token, logprob, by_teacher[n])
            keep = [index for index, row in enumerate(live) if not row.done]
            batch.keep(keep)
            live = [live[index] for index in keep]

    def _append(self, row: _Row, token: int, logprob: float, by_teacher: bool) -> None:
        episode, limits = row.episode, self.limits
        turn = episode.turns[-1]
        episode.ids.append(token)
        episode.logprobs.append(logprob)
        episode.teacher_written.append(by_teacher)
        turn.end += 1
        if token == self.chat_format.eos_token_id:
            self._end_turn(row)
        elif turn.end - turn.start >= limits.max_gen_len:
            episode.stop_reason = MAX_GEN_LEN
        elif len(episode.ids) >= limits.max_total_len:
            episode.stop_reason = MAX_TOTAL_LEN

    def _end_turn(self, row: _Row) -> None:
        episode, record = row.episode, row.episode.record
        turn = episode.turns[-1]
        _, blocks = split_tool_calls(self.chat_format.decode(episode.ids[turn.start:turn.end]))
        last_turn = len(episode.turns) >= self.limits.max_turns
        turn.calls = [(check_call if last_turn else execute_call)(block, record.declared_tools) for block in blocks]
        answered = [outcome for outcome in turn.calls if outcome.answered]
        if not answered:  # no calls (blocks that are not JSON objects are not calls, as in MiniMind)
            episode.stop_reason = ANSWER
            return
        if last_turn:
            episode.stop_reason = MAX_TURNS
            return
        observation = self.chat_format.observation_ids(record, [outcome.observation for outcome in answered])
        if len(episode.ids) + len(observation) >= self.limits.max_total_len:
            episode.stop_reason = MAX_TOTAL_LEN
            return
        row.pending = observation

    @staticmethod
    def _release(row: _Row) -> None:
        episode = row.episode
        episode.ids.extend(row.pending)
        episode.turns[-1].observation_end = len(episode.ids)
        episode.turns.append(Turn(len(episode.ids), len(episode.ids)))
        row.pending = None
