"""Episodes: targets are exactly the generated tokens; the shared prompt prefix stops before every target."""

from __future__ import annotations

from opd.episodes.episode import Episode, shared_prefix_length
from tests.helpers.opd_support import agent_record


def test_shared_prefix_length_stops_before_every_target():
    record = agent_record("p.jsonl:1", "q")

    def episode(ids, prompt_length):
        return Episode(record, prompt_length, ids)

    common = list(range(100, 140))
    assert shared_prefix_length([episode(common + [1, 2], 42), episode(common + [3], 41)]) == 40
    assert shared_prefix_length([episode(common + [1, 2], 42), episode(common + [1, 2, 5], 42)]) == 41
    assert shared_prefix_length([episode(common[:35] + [1] * 10, 45), episode(common, 40)]) == 35
    assert shared_prefix_length([episode(common[:20] + [1] * 20, 40), episode(common, 40)]) == 0
    assert shared_prefix_length([episode(common, 40)]) == 0
