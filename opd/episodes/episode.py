"""Finished agent episodes (token ids, which tokens are distillation targets, what each turn did) and batch packing.

Targets are exactly the generated tokens (every assistant turn's, each EOS included, whichever model wrote them);
the prompt, role markers and tool observations are context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from common.chat_records import AgentRecord
from tools.tool_environment import MALFORMED, NOT_A_CALL, OK, CallOutcome

# Why an episode stopped. Only ANSWER (a turn without tool calls) is a complete episode.
ANSWER = "answer"
MAX_GEN_LEN = "max_gen_len"  # a turn reached max_gen_len without EOS
MAX_TOTAL_LEN = "max_total_len"  # the context is full, or the observation would not fit
MAX_TURNS = "max_turns"  # the last allowed turn still asked for tools
STOP_REASONS = (ANSWER, MAX_GEN_LEN, MAX_TOTAL_LEN, MAX_TURNS)
UNREADABLE = (NOT_A_CALL, MALFORMED)  # call statuses of a block the tool world could not read as a call


@dataclass
class Turn:
    """One assistant turn: its generated span ``ids[start:end]`` and the outcome of each tool call in it."""

    start: int
    end: int
    calls: list[CallOutcome] = field(default_factory=list)
    observation_end: int | None = None  # end of the observation context appended after this turn, if any
    trained: bool = True  # its tokens are targets (a demonstration's assistant message with weight 0 is context)
    left_out: bool = False  # a broken turn that ``loss.mask_broken_turns`` keeps as context only


@dataclass(frozen=True)
class TopLogprobs:
    """A served teacher's log-probabilities at an episode's targets, one row per target in order: its top-k ids and
    log-probabilities (``[targets, width]``; unused slots have id -1) and that of the id that follows (``[targets]``)."""

    ids: torch.Tensor
    logprobs: torch.Tensor
    next_token: torch.Tensor

    @staticmethod
    def of_logits(logits: torch.Tensor, next_ids: torch.Tensor, k: int) -> TopLogprobs:
        """What vLLM's ``prompt_logprobs=k`` returns for these ``[targets, vocab]`` logits, the next id included in
        the row as the server adds it (``k`` of the vocabulary size or more: every id)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
        extra = (ids != next_ids[:, None]).all(-1)  # the next id when outside the top-k, else -1
        ids = torch.cat([ids, torch.where(extra, next_ids, -1)[:, None]], dim=-1)
        top = torch.cat([top, torch.where(extra, logprobs.gather(-1, next_ids[:, None])[:, 0], -math.inf)[:, None]], -1)
        return TopLogprobs(ids, top, logprobs.gather(-1, next_ids[:, None])[:, 0])

    @staticmethod
    def from_rows(ids: list[list[int]], logprobs: list[list[float]], next_token: list[float]) -> TopLogprobs:
        """Per-target lists of ids and their log-probabilities (of any lengths), padded to the widest row."""
        width = max((len(row) for row in ids), default=1)
        return TopLogprobs(
            torch.tensor([row + [-1] * (width - len(row)) for row in ids], dtype=torch.long).reshape(-1, width),
            torch.tensor([row + [-math.inf] * (width - len(row)) for row in logprobs],
                         dtype=torch.float32).reshape(-1, width),
            torch.tensor(next_token, dtype=torch.float32))

    def mass(self) -> torch.Tensor:
        """The teacher's probability mass inside each row's ids, ``[targets]``."""
        return self.logprobs.exp().sum(-1)

    def rows(self, keep: torch.Tensor) -> TopLogprobs:
        return TopLogprobs(self.ids[keep], self.logprobs[keep], self.next_token[keep])

    @staticmethod
    def cat(parts: list[TopLogprobs]) -> TopLogprobs:
        """One block of ``parts``' rows in order, the narrower ones padded (id -1)."""
        width = max(part.ids.shape[1] for part in parts)
        ids = [torch.nn.functional.pad(part.ids, (0, width - part.ids.shape[1]), value=-1) for part in parts]
        logprobs = [torch.nn.functional.pad(part.logprobs, (0, width - part.ids.shape[1]), value=-float("inf"))
                    for part in parts]
        return TopLogprobs(torch.cat(ids), torch.cat(logprobs), torch.cat([part.next_token for part in parts]))


@dataclass
class Episode:
    """A multi-turn rollout of one record: prompt ids, then generated turns and observations, in order."""

    record: AgentRecord
    prompt_length: int
    ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the rollout model's log-probability of each generated id
    stop_reason: str | None = None
    teacher_written: list[bool] = field(default_factory=list)  # per generated id: the teacher wrote it
    teacher_logits: torch.Tensor | None = None  # a guided rollout's fp32 teacher logits at the targets [targets, vocab]
    teacher_top: TopLogprobs | None = None  # a served teacher's scores of the targets

    @property
    def truncated(self) -> bool:
        return self.stop_reason != ANSWER

    @property
    def assistant_tokens(self) -> int:
        return sum(turn.end - turn.start for turn in self.turns)

    @property
    def teacher_tokens(self) -> int:
        return sum(self.teacher_written)

    @property
    def tool_calls(self) -> int:
        return sum(len(turn.calls) for turn in self.turns)

    @property
    def tool_errors(self) -> int:
        return sum(1 for turn in self.turns for call in turn.calls if call.status != OK)

    def broken(self, index: int) -> bool:
        """Whether turn ``index`` is broken: the tool world could not read one of its ``<tool_call>`` blocks (not a
        closed JSON object, or no usable name or arguments), or ``max_gen_len`` cut it before its EOS."""
        turn = self.turns[index]
        cut = self.stop_reason == MAX_GEN_LEN and index == len(self.turns) - 1
        return cut or any(call.status in UNREADABLE for call in turn.calls)

    def target_counts(self) -> tuple[int, int, int]:
        """(targets of trained turns, those inside broken turns, those left out of the loss as broken)."""
        targets = broken = left_out = 0
        for index, turn in enumerate(self.turns):
            if turn.trained:
                size = turn.end - turn.start
                targets += size
                broken += size if self.broken(index) else 0
                left_out += size if turn.left_out else 0
        return targets, broken, left_out

    def without_broken_turns(self) -> Episode:
        """This episode with its broken turns kept as context but left out of the loss (``loss.mask_broken_turns``),
        the kept teacher scores trimmed to match; itself when none is broken."""
        broken = [index for index, turn in enumerate(self.turns) if turn.trained and self.broken(index)]
        if not broken:
            return self
        turns = [replace(turn, left_out=True) if index in broken else turn for index, turn in enumerate(self.turns)]
        # teacher scores hold one row per target, in order: drop the rows of the turns now left out
        keep = torch.tensor([not new.left_out for turn, new in zip(self.turns, turns, strict=True)
                             if turn.trained and not turn.left_out for _ in range(turn.end - turn.start)], dtype=torch.bool)
        return replace(self, turns=turns,
                       teacher_logits=None if self.teacher_logits is None else self.teacher_logits[keep],
                       teacher_top=None if self.teacher_top is None else self.teacher_top.rows(keep))

    def target_mask(self) -> list[bool]:
        """One flag per id: True for generated (distillation target) tokens of trained turns not left out."""
        mask = [False] * len(self.ids)
        for turn in self.turns:
            if turn.trained and not turn.left_out:
                mask[turn.start:turn.end] = [True] * (turn.end - turn.start)
        return mask

    def turn_ids(self, index: int) -> list[int]:
        turn = self.turns[index]
        return self.ids[turn.start:turn.end]


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded ``[batch, length]`` ids and attention mask; ``target_mask[b, t]`` (``[batch, length - 1]``) says
    whether ``input_ids[b, t + 1]`` is a target, i.e. whether the logits at position ``t`` are trained."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_mask: torch.Tensor

    @property
    def target_count(self) -> int:
        return int(self.target_mask.sum())

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.target_mask)))


def pack_episodes(episodes: list[Episode], pad_token_id: int) -> PackedBatch:
    """Pack episodes into one right-padded batch (CPU tensors); padding is never a target."""
    if not episodes:
        raise ValueError("cannot pack an empty list of episodes")
    length = max(len(episode.ids) for episode in episodes)
    input_ids = torch.full((len(episodes), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(episodes), length), dtype=torch.long)
    targets = torch.zeros((len(episodes), length), dtype=torch.bool)
    for row, episode in enumerate(episodes):
        size = len(episode.ids)
        input_ids[row, :size] = torch.tensor(episode.ids, dtype=torch.long)
        attention_mask[row, :size] = 1
        targets[row, :size] = torch.tensor(episode.target_mask(), dtype=torch.bool)
    return PackedBatch(input_ids, attention_mask, targets[:, 1:])


MIN_SHARED_PREFIX = 32  # shorter shared prefixes are not worth a second forward call


def shared_prefix_length(episodes: list[Episode]) -> int:
    """Leading ids every episode shares, capped one short of the shortest prompt so the prefix never reaches a
    target; 0 for one episode or a prefix not worth sharing (forwards compute it once)."""
    if len(episodes) < 2:
        return 0
    first = episodes[0].ids
    limit = min(episode.prompt_length for episode in episodes) - 1
    length = 0
    while length < limit and all(episode.ids[length] == first[length] for episode in episodes):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0
