"""The sampling/extra parameters merged into every chat request, and per-conversation draws.

``sampling`` (null keys omitted) and ``extra_request_params`` are sent as given (``regen.settings`` has
checked them). Optional weighted mixes of ``reasoning_effort`` and ``temperature`` are drawn once per
conversation from a generator seeded by ``(mix_seed, primary_id)``, so a conversation gets the same draw
however the run is ordered, limited or resumed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regen.settings import RegenSettings, WeightedChoice

class RequestParams:
    """What each request carries besides regen's own keys, and what rows record as ``sampling_params``."""

    def __init__(self, sampling: Mapping, extra: Mapping | None = None,
                 reasoning_effort: WeightedChoice | None = None, temperature: WeightedChoice | None = None,
                 mix_seed: int = 0):
        self.base: dict[str, Any] = {key: value for key, value in sampling.items() if value is not None}
        self.base.update(extra or {})
        self.reasoning_effort, self.temperature = reasoning_effort, temperature
        self.mix_seed = mix_seed

    @classmethod
    def from_settings(cls, settings: RegenSettings) -> RequestParams:
        return cls(settings.sampling, settings.extra_request_params, settings.reasoning_effort_weights,
                   settings.temperature_weights, settings.mix_seed)

    def for_conversation(self, primary_id: str) -> dict[str, Any]:
        """The parameters for every request of this conversation."""
        if self.reasoning_effort is None and self.temperature is None:
            return self.base
        rng = random.Random(f"{self.mix_seed}:{primary_id}")
        params = dict(self.base)
        for key, mix in (("reasoning_effort", self.reasoning_effort), ("temperature", self.temperature)):
            if mix is not None:
                params[key] = rng.choices(mix.options, weights=mix.weights)[0]
        return params
