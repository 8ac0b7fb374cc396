"""Computing a prompt prefix that every row of a batch shares only once.

Agent records usually repeat one system prompt and tool list. When all rows of a batch start with the same
ids, the prefix is run as one ``[1, P]`` forward into a KV cache whose rows are then repeated, and only
the rest of each row is computed on top. The math is the same as the full forward (under autograd too:
the repeated cache sums the rows' gradients back into the one prefix computation); the prefix never
reaches a target position, so its logits are not needed.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from opd.episodes import Episode
from opd.minimind.model import cache_keyword

MIN_SHARED_PREFIX = 32  # shorter shared prefixes are not worth a second forward call


def shared_prefix_length(episodes: list[Episode]) -> int:
    """Leading ids all episodes share, capped one short of the shortest prompt; 0 when not worth sharing."""
    if len(episodes) < 2:
        return 0
    first = episodes[0].ids
    limit = min(episode.prompt_length for episode in episodes) - 1
    length = 0
    while length < limit and all(episode.ids[length] == first[length] for episode in episodes):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


def prefill_shared_prefix(model: torch.nn.Module, prefix_ids: list[int], rows: int) -> DynamicCache:
    """A cache holding ``prefix_ids`` for ``rows`` identical rows, from one single-row forward."""
    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    model(input_ids=torch.tensor([prefix_ids], device=device), use_cache=True, logits_to_keep=1,
          **{cache_keyword(model): cache})
    cache.batch_repeat_interleave(rows)
    return cache
