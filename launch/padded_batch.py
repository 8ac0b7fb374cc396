"""The tensors of a left-padded decode batch: one KV cache, its attention mask, per-row positions.

Rows are right-aligned: every row's newest token sits in the last cache column and shorter rows are
padded on the left (masked out, zero K/V). Each row keeps its own RoPE positions, so a row computes what
it would compute alone. Rows join by merging a freshly prefilled group (the shorter side gets more left
padding) and leave by row selection, after which columns that are padding in every row are cut off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _rebuild(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    return DynamicCache(layers)


def _pad_left(tensor: torch.Tensor, columns: int, dim: int) -> torch.Tensor:
    if columns == 0:
        return tensor
    pad = [0, 0] * (tensor.ndim - 1 - dim) + [columns, 0]
    return F.pad(tensor, pad)


def prefill_inputs(prompts: list[list[int]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``/``attention_mask``/``position_ids`` for prefilling ``prompts`` together."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


class PaddedBatch:
    """The sequences being decoded together, as one right-aligned KV cache."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Drop every row."""
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)  # [rows, columns]; 1 = real token in the cache
        self.lengths = torch.zeros(0, dtype=torch.long)  # real tokens per row in the cache (= next position)
        self.last_tokens = torch.zeros(0, dtype=torch.long)  # sampled, not yet fed to the model

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def add(self, cache: DynamicCache, mask: torch.Tensor, last_tokens: torch.Tensor) -> None:
        """Append prefilled rows (their cache, mask and first sampled tokens) below the current rows."""
        lengths = mask.sum(-1)
        if self.cache is None or len(self) == 0:
            self.cache, self.mask, self.lengths, self.last_tokens = cache, mask, lengths, last_tokens
            return
        width = max(self.columns, int(mask.shape[1]))
        mine, theirs = width - self.columns, width - int(mask.shape[1])
        self.cache = _rebuild([
            (torch.cat([_pad_left(k1, mine, 2), _pad_left(k2, theirs, 2)]),
             torch.cat([_pad_left(v1, mine, 2), _pad_left(v2, theirs, 2)]))
            for (k1, v1), (k2, v2) in zip(_layers(self.cache), _layers(cache), strict=True)
        ])
        self.mask = torch.cat([_pad_left(self.mask, mine, 1), _pad_left(mask, theirs, 1)])
        self.lengths = torch.cat([self.lengths, lengths])
        self.last_tokens = torch.cat([self.last_tokens, last_tokens])

    def decode_inputs(self) -> dict[str, torch.Tensor]:
        """Inputs for one decode step: each row's last sampled token at its own next position."""
        return {
            "input_ids": self.last_tokens.unsqueeze(1),
            "attention_mask": torch.cat([self.mask, torch.ones((len(self), 1), dtype=torch.long)], dim=1),
            "position_ids": self.lengths.unsqueeze(1),
        }

    def advance(self, next_tokens: torch.Tensor) -> None:
        """Record that the decode step stored every row's last token in the cache and sampled ``next_tokens``."""
        self.mask = torch.cat([self.mask, torch.ones((len(self), 1), dtype=torch.long)], dim=1)
        self.lengths = self.lengths + 1
        self.last_tokens = next_tokens

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order) and cut the columns that are now padding in every row."""
        if len(rows) == len(self) and rows == list(range(len(self))):
            return
        if not rows:
            self.clear()
            return
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(0).to(torch.long).argmax())
        self.cache = _rebuild([
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in _layers(self.cache)
        ])
        self.mask = mask[:, start:]
        self.lengths = self.lengths.index_select(0, index)
        self.last_tokens = self.last_tokens.index_select(0, index)
