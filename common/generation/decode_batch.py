"""The rows generated together: one or more models in lockstep, each on a carried KV cache.

Each ``step`` feeds every row its unfed ids right-aligned; holes have attention mask 0 and position ids count only
real tokens, so each row computes what a forward on its own unpadded sequence computes. Logits come from an fp32
output projection outside autocast, as opd's loss computes them. Decoding only (``torch.inference_mode()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common.generation.kv_cache import decode_cache
from common.minimind.model import cache_keyword, prefill_shared_prefix


def fp32_output_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The model's output projection of ``hidden`` in fp32, outside any autocast region."""
    with torch.autocast(hidden.device.type, enabled=False):
        return model.lm_head(hidden.float())


class DecodeBatch:
    """``rows`` sequences of causal LMs ``models`` (full-attention only), none fed yet; holes are ``pad_token_id``."""

    def __init__(self, models: list[torch.nn.Module], rows: int, pad_token_id: int) -> None:
        self.models = models
        self.pad_token_id = pad_token_id
        self.device = next(models[0].parameters()).device
        self.caches = [decode_cache(model.config) for model in models]
        self.keywords = [cache_keyword(model.model) for model in models]
        self.mask = torch.zeros((rows, 0), dtype=torch.long, device=self.device)  # 1 = a real token in the caches
        self.lengths = [0] * rows  # real tokens per row (= the position of its next id)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def prefill_shared_prefix(self, prefix_ids: list[int]) -> None:
        """Feed every row of a batch that has fed nothing ``prefix_ids``, computed once per model."""
        for model, cache in zip(self.models, self.caches, strict=True):
            prefill_shared_prefix(model, prefix_ids, len(self), cache)
        self.mask = torch.ones((len(self), len(prefix_ids)), dtype=torch.long, device=self.device)
        self.lengths = [len(prefix_ids)] * len(self)

    def step(self, feeds: list[list[int]]) -> list[torch.Tensor]:
        """Feed row ``i`` the ids ``feeds[i]`` (none for a row that waits), one forward per model; each model's fp32
        logits after the last id of every row that fed some, ``[those rows, vocab]``, in row order."""
        width = max(len(feed) for feed in feeds)
        block_ids, block_mask, positions = [], [], []
        for length, feed in zip(self.lengths, feeds, strict=True):
            holes = width - len(feed)
            block_ids.append([self.pad_token_id] * holes + feed)
            block_mask.append([0] * holes + [1] * len(feed))
            positions.append([length] * holes + list(range(length, length + len(feed))))
        attention = torch.cat([self.mask, torch.tensor(block_mask, device=self.device)], dim=1)
        block = {"input_ids": torch.tensor(block_ids, device=self.device), "attention_mask": attention,
                 "position_ids": torch.tensor(positions, device=self.device), "use_cache": True}
        fed = [row for row, feed in enumerate(feeds) if feed]
        every_row = len(fed) == len(feeds)
        logits = []
        for model, cache, keyword in zip(self.models, self.caches, self.keywords, strict=True):
            hidden = model.model(**block, **{keyword: cache}).last_hidden_state[:, -1]
            logits.append(fp32_output_logits(model, hidden if every_row else hidden[fed]))
        self.mask = attention
        self.lengths = [length + len(feed) for length, feed in zip(self.lengths, feeds, strict=True)]
        return logits

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows``, in this order, and cut the columns that are holes in every one of them."""
        if rows == list(range(len(self))):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(0)
        start = int(used.to(torch.long).argmax()) if bool(used.any()) else self.columns
        for cache in self.caches:
            for layer in cache.layers:
                layer.batch_select_indices(index)
                layer.drop_leading_columns(start)
        self.mask = mask[:, start:]
        self.lengths = [self.lengths[row] for row in rows]

    def extend(self, other: DecodeBatch) -> None:
        """Append ``other``'s rows (the same models, each row fed at least once) below these, right-aligned: the
        batch with fewer columns gets holes on the left."""
        if not len(self):
            self.caches, self.mask, self.lengths = other.caches, other.mask, other.lengths
            return
        for mine, theirs in zip(self.caches, other.caches, strict=True):
            for layer, joining in zip(mine.layers, theirs.layers, strict=True):
                layer.extend_rows(joining)
        width = max(self.columns, other.columns)
        self.mask = torch.cat([F.pad(self.mask, (width - self.columns, 0)), F.pad(other.mask, (width - other.columns, 0))])
        self.lengths = self.lengths + other.lengths
