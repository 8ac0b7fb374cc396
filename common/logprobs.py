"""What makes a list of top-k log-probabilities a teacher's (vLLM's replies, regen's rows, opd's scores): each id
once, each value a finite float32 at most 0, and together no more than all of the probability mass."""

from __future__ import annotations

import math

FLOAT32_MAX = 3.4028234663852886e38  # beyond it a log-probability becomes -inf in a float32 loss
MASS_TOLERANCE = 1e-3  # a server's fp32 rounding over k entries


def distribution_problem(ids, logprobs) -> str | None:
    """Why one position's ids and log-probabilities cannot be a model's top-k, or None."""
    ids = list(ids)
    if len(set(ids)) != len(ids):
        return f"id {next(i for i in ids if ids.count(i) > 1)} appears twice"
    bad = next((x for x in logprobs if not -FLOAT32_MAX <= x <= 1e-4), None)
    if bad is not None:
        return f"log-probability {bad!r} is not a finite float32 at most 0"
    total = math.fsum(math.exp(x) for x in logprobs)
    return f"its probabilities sum to {total:.4g}, more than 1" if total > 1 + MASS_TOLERANCE else None
