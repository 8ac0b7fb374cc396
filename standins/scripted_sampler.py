"""A sampler that emits scripted turns, so tests and benchmarks can force exact episode shapes."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from opd.episodes.episode import Episode


class ScriptedSampler:
    """Emits fixed turns instead of sampling: ``scripts[record.source]`` lists each turn's generated ids.

    The model still runs its forward on every step, so tests can force exact episode shapes and the
    benchmark can time real compute with fixed turn lengths.
    """

    def __init__(self, scripts: Mapping[str, list[list[int]]]) -> None:
        self.scripts = scripts

    def __call__(self, logits: torch.Tensor, episodes: list[Episode]) -> torch.Tensor:
        tokens = []
        for episode in episodes:
            turn_index, turn = len(episode.turns) - 1, episode.turns[-1]
            position = turn.end - turn.start
            script = self.scripts[episode.record.source]
            if turn_index >= len(script) or position >= len(script[turn_index]):
                raise ValueError(f"{episode.record.source}: the script has no token for turn {turn_index} "
                                 f"position {position}")
            tokens.append(script[turn_index][position])
        return torch.tensor(tokens, dtype=torch.long, device=logits.device)
