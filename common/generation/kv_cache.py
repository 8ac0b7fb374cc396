"""A KV cache for batched decoding that appends in place (spare capacity, doubled when full) instead of ``torch.cat``,
holding the same values as a ``DynamicLayer``. Without autograd only: later steps write into the buffer that earlier
steps' views read."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # columns first allocated per layer (prompt + first turn of a typical episode)


class GrowingKVLayer(DynamicLayer):
    """One layer's keys and values in buffers with spare columns; ``keys``/``values`` view the filled part."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._reallocate(key_states, value_states, max(end, 2 * self.length, MIN_CAPACITY))
        self._key_buffer[..., self.length:end, :] = key_states
        self._value_buffer[..., self.length:end, :] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        def grown(buffer: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            shape = (*like.shape[:-2], capacity, like.shape[-1])
            fresh = torch.empty(shape, dtype=like.dtype, device=like.device)
            if buffer is not None:
                fresh[..., :self.length, :] = buffer[..., :self.length, :]
            return fresh

        self._key_buffer = grown(self._key_buffer, key_states)
        self._value_buffer = grown(self._value_buffer, value_states)

    def _expose(self) -> None:
        self.keys = self._key_buffer[..., :self.length, :]
        self.values = self._value_buffer[..., :self.length, :]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._key_buffer = self._key_buffer[indices]
            self._value_buffer = self._value_buffer[indices]
            self._expose()

    def drop_leading_columns(self, columns: int) -> None:
        """Forget the first ``columns`` columns of every row (the rest keep their values)."""
        if columns:
            self._key_buffer = self._key_buffer[..., columns:, :]
            self._value_buffer = self._value_buffer[..., columns:, :]
            self.length -= columns
            self._expose()

    def extend_rows(self, other: GrowingKVLayer) -> None:
        """Append ``other``'s rows right-aligned; the shorter side gets zero columns that the mask must hide."""
        width = max(self.length, other.length)
        capacity = max(2 * width, MIN_CAPACITY)

        def stacked(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            rows = mine.shape[0]
            fresh = mine.new_zeros((rows + theirs.shape[0], *mine.shape[1:-2], capacity, mine.shape[-1]))
            fresh[:rows, ..., width - self.length:width, :] = mine[..., :self.length, :]
            fresh[rows:, ..., width - other.length:width, :] = theirs[..., :other.length, :]
            return fresh

        self._key_buffer = stacked(self._key_buffer, other._key_buffer)
        self._value_buffer = stacked(self._value_buffer, other._value_buffer)
        self.length = width
        self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("GrowingKVLayer is for forward-only decoding; it is never cropped")

    def reset(self) -> None:
        raise NotImplementedError("GrowingKVLayer is for forward-only decoding; build a new cache instead")


def decode_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose layers are ``GrowingKVLayer`` (full-attention models only)."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ValueError(f"decode_cache supports full-attention layers only, got "
                         f"{sorted({type(layer).__name__ for layer in cache.layers})}")
    cache.layers = [GrowingKVLayer() for _ in cache.layers]
    return cache
