"""Batched multi-turn tool-use rollouts of a causal LM on one carried KV cache.

All episodes of a batch share one KV cache (``opd.decode_cache``: appended in place). Every forward feeds each live row the ids it has not fed
yet, right-aligned in a ``[rows, width]`` block: a decoding row feeds its last sampled token, a row whose
turn just ended with tool calls feeds its observation (prefilled onto its own cache, never re-running the
prefix). Columns a row does not use are holes with attention mask 0, and explicit position ids count only
a row's real tokens, so every row computes exactly what a forward on its own unpadded sequence computes.

A row whose tools ran waits (feeding nothing) while others decode; waiting observations are prefilled
together once no row is decoding or at least half of the live rows wait. Finished rows leave the cache.
A prompt prefix every row shares (system prompt, tool list) is prefilled once (``prefill_shared_prefix``).

The model body may run under bf16/fp16 autocast; the output projection whose logits are sampled from (and
whose log-probabilities are kept) runs in fp32, as the loss's does (``opd.loss.logits_at_targets``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from opd.agent_records import AgentRecord
from opd.chat_format import ChatFormat
from opd.config import RolloutConfig
from opd.decode_cache import decode_cache
from opd.episodes import ANSWER, MAX_GEN_LEN, MAX_TOTAL_LEN, MAX_TURNS, Episode, Turn, shared_prefix_length
from opd.minimind.model import cache_keyword, prefill_shared_prefix
from tools.tool_calls import split_tool_calls
from tools.tool_environment import check_call, execute_call

Sampler = Callable[[torch.Tensor, list[Episode]], torch.Tensor]


@dataclass
class _Row:
    episode: Episode
    fed: int = 0  # ids already in the KV cache
    pending: list[int] | None = None  # observation ids waiting to be prefilled

    @property
    def done(self) -> bool:
        return self.episode.stop_reason is not None


def fp32_output_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The model's output projection of ``hidden`` in fp32, outside any autocast region."""
    with torch.autocast(hidden.device.type, enabled=False):
        return model.lm_head(hidden.float())


class AgentRollout:
    """Runs the student on a batch of agent records and returns one ``Episode`` per record, in order."""

    def __init__(self, model: torch.nn.Module, chat_format: ChatFormat, sampler: Sampler, limits: RolloutConfig,
                 *, autocast: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.model = model
        self.chat_format = chat_format
        self.sampler = sampler
        self.limits = limits
        self.autocast = autocast
        self._cache_keyword = cache_keyword(model.model)

    def run(self, records: list[AgentRecord]) -> list[Episode]:
        """Roll out every record; raises ``PromptTooLongError`` (naming the record) before any compute."""
        prompts = [self.chat_format.prompt_ids(record, self.limits.max_total_len) for record in records]
        rows = [_Row(Episode(record, len(ids), list(ids), turns=[Turn(len(ids), len(ids))]))
                for record, ids in zip(records, prompts, strict=True)]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), self.autocast():
                self._decode(list(rows))
        finally:
            self.model.train(was_training)
        return [row.episode for row in rows]

    def _decode(self, live: list[_Row]) -> None:
        device = next(self.model.parameters()).device
        prefix = shared_prefix_length([row.episode for row in live])
        cache = decode_cache(self.model.config)
        if prefix:
            prefill_shared_prefix(self.model, live[0].episode.ids[:prefix], len(live), cache)
            for row in live:
                row.fed = prefix
        attention = torch.ones((len(live), prefix), dtype=torch.long, device=device)
        while live:
            waiting = [row for row in live if row.pending is not None]
            if waiting and 2 * len(waiting) >= len(live):
                for row in waiting:
                    self._release(row)
            feeds = [row.episode.ids[row.fed:] if row.pending is None else [] for row in live]
            width = max(len(feed) for feed in feeds)
            block_ids, block_mask, positions = [], [], []
            for row, feed in zip(live, feeds, strict=True):
                holes = width - len(feed)
                block_ids.append([self.chat_format.pad_token_id] * holes + feed)
                block_mask.append([0] * holes + [1] * len(feed))
                positions.append([row.fed] * holes + list(range(row.fed, row.fed + len(feed))))
            attention = torch.cat([attention, torch.tensor(block_mask, device=device)], dim=1)
            hidden = self.model.model(
                input_ids=torch.tensor(block_ids, device=device), attention_mask=attention,
                position_ids=torch.tensor(positions, device=device), use_cache=True, **{self._cache_keyword: cache},
            ).last_hidden_state[:, -1]
            logits = fp32_output_logits(self.model, hidden)
            fed_rows = [index for index, feed in enumerate(feeds) if feed]
            row_logits = logits[fed_rows]
            episodes = [live[index].episode for index in fed_rows]
            tokens = self.sampler(row_logits, episodes)
            logprobs = torch.log_softmax(row_logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
            for index, token, logprob in zip(fed_rows, tokens.tolist(), logprobs.tolist(), strict=True):
                live[index].fed += len(feeds[index])
                self._append(live[index], token, logprob)
            keep = [index for index, row in enumerate(live) if not row.done]
            if len(keep) < len(live):
                if keep:
                    cache.batch_select_indices(torch.tensor(keep, device=device))
                    attention = attention[keep]
                live = [live[index] for index in keep]

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        episode, limits = row.episode, self.limits
        turn = episode.turns[-1]
        episode.ids.append(token)
        episode.logprobs.append(logprob)
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
