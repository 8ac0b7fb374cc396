"""The sampling/extra parameters merged into every chat request, and per-conversation draws.

``sampling`` (null keys omitted) and ``extra_request_params`` are sent as given. Optional weighted
mixes of ``reasoning_effort`` and ``temperature`` are drawn once per conversation from a generator
seeded by ``(mix_seed, primary_id)``, so a conversation gets the same draw however the run is ordered,
limited or resumed. Regen's own request keys can never be overridden.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

OWN_KEYS = frozenset({"model", "messages", "max_tokens", "return_token_ids", "tools", "tool_choice"})


def _weights(name: str, value: Mapping | None, parse) -> tuple[list, list[float]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name} must be a mapping of value -> weight, e.g. {{low: 0.3, high: 0.7}}")
    options, weights = [], []
    for option, weight in value.items():
        try:
            options.append(parse(option))
        except ValueError:
            raise ValueError(f"{name}: {option!r} is not a valid value") from None
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"{name}: the weight of {option!r} must be a number >= 0")
        weights.append(float(weight))
    if sum(weights) <= 0:
        raise ValueError(f"{name}: weights must not all be 0")
    return options, weights


class RequestParams:
    """What each request carries besides regen's own keys, and what rows record as ``sampling_params``."""

    def __init__(self, sampling: Mapping, extra: Mapping | None = None,
                 reasoning_effort_weights: Mapping | None = None,
                 temperature_weights: Mapping | None = None, mix_seed: int = 0):
        extra = dict(extra or {})
        clash = sorted(OWN_KEYS & set(extra))
        if clash:
            raise ValueError(f"extra_request_params may not set {clash}: regen owns those request keys")
        self.base: dict[str, Any] = {key: value for key, value in sampling.items() if value is not None}
        self.base.update(extra)
        self.reasoning_effort = _weights("reasoning_effort_weights", reasoning_effort_weights, str)
        self.temperature = _weights("temperature_weights", temperature_weights, float)
        self.mix_seed = mix_seed

    def for_conversation(self, primary_id: str) -> dict[str, Any]:
        """The parameters for every request of this conversation."""
        if self.reasoning_effort is None and self.temperature is None:
            return self.base
        rng = random.Random(f"{self.mix_seed}:{primary_id}")
        params = dict(self.base)
        for key, mix in (("reasoning_effort", self.reasoning_effort), ("temperature", self.temperature)):
            if mix is not None:
                params[key] = rng.choices(mix[0], weights=mix[1])[0]
        return params
