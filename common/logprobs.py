"""What makes a list of top-k log-probabilities a teacher's (vLLM's replies, regen's rows, opd's scores): each id
once, each value a finite float32 at most 0, and together no more than all of the probability mass."""

from __future__ import annotations

import math

FLOAT32_MAX = 3.4028234663852886e38  # beyond it a log-probability becomes -inf in a float32 loss
MASS_TOLERANCE = 1e-3  # a server's fp32 rounding over k entries
SAME_TOLERANCE = 1e-3  # one id's log-probability given twice (the sampled id's, and its top-k entry)


def distribution_problem(ids, logprobs, token: int | None = None, logprob: float | None = None) -> str | None:
    """Why one position's ids and log-probabilities cannot be a model's top-k, or None; with the sampled ``token``
    and its ``logprob``, also when its entry among them says otherwise."""
    ids = list(ids)
    if len(set(ids)) != len(ids):
        return f"id {next(i for i in ids if ids.count(i) > 1)} appears twice"
    bad = next((x for x in logprobs if not -FLOAT32_MAX <= x <= 1e-4), None)
    if bad is not None:
        return f"log-probability {bad!r} is not a finite float32 at most 0"
    total = math.fsum(math.exp(x) for x in logprobs)
    if total > 1 + MASS_TOLERANCE:
        return f"its probabilities sum to {total:.4g}, more than 1"
    listed = dict(zip(ids, logprobs, strict=True)).get(token)
    if listed is not None and logprob is not None and abs(listed - logprob) > SAME_TOLERANCE:
        return f"the sampled id {token} has log-probability {logprob!r}, but {listed!r} in the top-k"
    return None
