"""A teacher's top-k log-probabilities are checked to be one: ids once, finite float32 values at most 0, and no
more than all of the mass (issue 67: zeros, log 0.9 and duplicate ids trained on; -1e39 turned the loss into NaN)."""

from __future__ import annotations

import math

from common.logprobs import distribution_problem


def test_a_distribution_passes_and_each_way_of_not_being_one_is_named():
    assert distribution_problem([3, 4, 5], [math.log(0.5), math.log(0.25), math.log(0.25)]) is None
    assert distribution_problem([3, 4], [math.log(0.5005), math.log(0.5)]) is None  # fp32 rounding, within 1e-3
    assert distribution_problem([3, 4], [math.log(0.51), math.log(0.5)]) == "its probabilities sum to 1.01, more than 1"
    assert distribution_problem([1] * 20, [0.0] * 20) == "id 1 appears twice"
    assert distribution_problem(range(20), [math.log(0.9)] * 20) == "its probabilities sum to 18, more than 1"
    assert distribution_problem([7], [-1e39]) == "log-probability -1e+39 is not a finite float32 at most 0"
    assert distribution_problem([7], [float("nan")]) == "log-probability nan is not a finite float32 at most 0"
    assert distribution_problem([7], [-3e38]) is None  # still a float32


def test_the_sampled_ids_log_probability_must_match_its_top_k_entry():
    assert distribution_problem([3, 4], [-0.7, -1.2], 4, -1.2004) is None
    assert distribution_problem([3, 4], [-0.7, -1.2], 4, -0.1) == (
        "the sampled id 4 has log-probability -0.1, but -1.2 in the top-k")
    assert distribution_problem([3, 4], [-0.7, -1.2], 9, -5.0) is None  # outside the top-k: its own slot
