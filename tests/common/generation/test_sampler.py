"""The shared sampler: filtered distributions against hand calculation, greedy below vLLM's threshold, one generator
or one per row (a row's tokens independent of its batch-mates), and the server's penalties."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from common.generation.sampler import DRAW_BLOCK, GREEDY_EPS, Penalties, TokenSampler, draw


def settings(**options) -> SimpleNamespace:
    """Sampling settings: the model's own distribution unless ``options`` say otherwise."""
    return SimpleNamespace(**{"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, **options})


def test_sampling_distribution_against_hand_calculation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    base = torch.softmax(logits / 2, dim=-1)[0].tolist()  # temperature 2

    def probs(**options):
        return TokenSampler(settings(**options), "cpu", seed=0).probabilities(logits)[0]

    torch.testing.assert_close(probs(temperature=2.0), torch.tensor(base))
    top2 = torch.tensor([base[0], base[1], 0, 0]) / (base[0] + base[1])
    torch.testing.assert_close(probs(temperature=2.0, top_k=2), top2)
    torch.testing.assert_close(probs(temperature=2.0, top_k=-1), torch.tensor(base))  # vLLM's "off"
    # top_p keeps the smallest prefix whose mass reaches top_p: base[0] < 0.5 <= base[0] + base[1]
    assert base[0] < 0.5 <= base[0] + base[1]
    torch.testing.assert_close(probs(temperature=2.0, top_p=0.5), torch.tensor([base[0], base[1], 0, 0]))
    torch.testing.assert_close(probs(temperature=2.0, min_p=base[2] / base[0] + 1e-6),
                               torch.tensor([base[0], base[1], 0, 0]))
    sampler = TokenSampler(settings(temperature=2.0, top_k=2), "cpu", seed=0)
    drawn = torch.cat([sampler(logits.expand(500, 4)) for _ in range(4)])
    assert set(drawn.tolist()) == {0, 1} and 0.55 < (drawn == 0).float().mean() < 0.70  # p0 = 0.6225


def test_a_top_p_that_fp32_reads_as_zero_keeps_the_most_likely_token():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probabilities = TokenSampler(settings(top_p=1e-300), "cpu", seed=0).probabilities(logits)[0]
    assert probabilities[0] > 0 and probabilities[1:].tolist() == [0.0, 0.0, 0.0]


def test_logits_a_penalty_divided_into_infinity_still_give_a_distribution():
    """Repetition penalty 1e-40 divides positive logits into inf: they tie at the largest finite value."""
    logits = Penalties(repetition=1e-40).apply(torch.tensor([[2.0, 1.0, -3.0, 0.5]]), [0, 1], [2])
    assert torch.isinf(logits[0, :2]).all()
    probabilities = TokenSampler(settings(temperature=0.5), "cpu", seed=0).probabilities(logits)[0]
    torch.testing.assert_close(probabilities, torch.tensor([0.5, 0.5, 0.0, 0.0]))


def test_draw_finds_each_uniform_in_the_cumulative_mass():
    probabilities = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(5, 5)  # exact in binary
    largest_below_one = 1 - 2.0 ** -53
    uniform = torch.tensor([[0.0], [0.249], [0.25], [0.999], [largest_below_one]], dtype=torch.float64)
    # [0, 0.25) -> token 1, [0.25, 1) -> token 3: the zero-probability tokens at either end and between are never drawn
    assert draw(probabilities, uniform).tolist() == [1, 1, 3, 3, 3]
    unnormalized = torch.tensor([[2.0, 0.0, 6.0]])  # after top-p / min-p cuts: the total is 8, not 1
    assert [draw(unnormalized, torch.tensor([[u]], dtype=torch.float64)).item() for u in (0.2, 0.25, 0.9)] == [0, 2, 2]


def test_draw_across_blocks_matches_one_full_cumulative_sum():
    generator = torch.Generator().manual_seed(0)
    vocab = 6 * DRAW_BLOCK + 37  # not a whole number of blocks
    probabilities = torch.rand(8, vocab, generator=generator) ** 8
    probabilities[:, DRAW_BLOCK:2 * DRAW_BLOCK] = 0  # a block with no mass
    probabilities[:, DRAW_BLOCK - 1] = probabilities[:, 2 * DRAW_BLOCK] = probabilities[:, -1] = 0  # zeros at edges
    cumulative = torch.cumsum(probabilities, dim=-1, dtype=torch.float64)
    for _ in range(50):
        uniform = torch.rand(8, 1, generator=generator, dtype=torch.float64)
        tokens = draw(probabilities, uniform)
        expected = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True).squeeze(1)
        assert tokens.tolist() == expected.tolist()
        assert bool((probabilities.gather(1, tokens[:, None]) > 0).all())
    two = torch.zeros(1, vocab)
    two[0, 10], two[0, 3 * DRAW_BLOCK + 5] = 0.25, 0.75  # in different blocks, exact in binary
    uniforms = (0.0, 0.2499, 0.25, 1 - 2.0 ** -53)
    drawn = [draw(two, torch.tensor([[u]], dtype=torch.float64)).item() for u in uniforms]
    assert drawn == [10, 10, 3 * DRAW_BLOCK + 5, 3 * DRAW_BLOCK + 5]


@pytest.mark.parametrize("row", [[0.0, 0.0, 0.0], [float("nan"), 0.5, 0.5], [float("inf"), 0.0, 1.0]])
def test_draw_refuses_a_row_with_no_finite_mass(row):
    with pytest.raises(ValueError, match="not finite or sum to 0"):
        draw(torch.tensor([[0.2, 0.3, 0.5], row]), torch.full((2, 1), 0.5, dtype=torch.float64))


def test_drawn_frequencies_match_the_distribution():
    probabilities = torch.tensor([0.5, 0.25, 0.125, 0.0, 0.125])
    sampler = TokenSampler(settings(), "cpu", seed=1)
    drawn = sampler(probabilities.log().expand(8000, 5))
    counts = torch.bincount(drawn, minlength=5).double() / 8000
    assert counts[3] == 0
    # 8,000 draws: each frequency's SE is at most 0.0056; 4 SE
    assert (counts - probabilities.double()).abs().max() < 0.023


@pytest.mark.parametrize("temperature", [0.0, GREEDY_EPS / 2])
def test_a_temperature_below_the_threshold_is_argmax_and_draws_nothing(temperature):
    sampler = TokenSampler(settings(temperature=temperature), "cpu", 0)
    state = sampler.get_state()
    assert sampler(torch.tensor([[0.1, 3.0, 2.0], [5.0, 0.0, 1.0]])).tolist() == [1, 0]
    assert torch.equal(sampler.get_state(), state)


def test_the_shared_generator_continues_from_a_saved_state():
    logits = torch.zeros(4, 50)
    sampler = TokenSampler(settings(), "cpu", seed=3)
    sampler(logits)
    state = sampler.get_state()
    expected = sampler(logits).tolist()
    resumed = TokenSampler(settings(), "cpu", seed=99)
    resumed.set_state(state)
    assert resumed(logits).tolist() == expected


def test_per_row_generators_make_a_row_independent_of_its_batch():
    logits = torch.zeros(3, 50)
    rows = [("r", 0), ("r", 1), ("r", 2)]
    seeds = {"r0": 11, "r1": 12, "r2": 13}

    def sampler(seeds):
        return TokenSampler.per_row(settings(), "cpu", seeds, key=lambda row: f"{row[0]}{row[1]}")

    together = [sampler(seeds)(logits, rows).tolist() for _ in range(2)]
    assert together[0] == together[1]
    alone = [sampler(seeds)(logits[:1], [row]).item() for row in rows]
    assert together[0] == alone
    reversed_rows = sampler(seeds)(logits, rows[::-1]).tolist()
    assert reversed_rows == alone[::-1]
    assert sampler({name: seed + 10 for name, seed in seeds.items()})(logits, rows).tolist() != together[0]
    assert TokenSampler.per_row(settings(), "cpu", {"a": 1})(logits[:1], ["a"]).shape == (1,)  # rows named by key


def test_penalties_against_hand_calculation():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    assert not Penalties().active and Penalties().apply(logits, [0, 1], [2]) is logits
    repeated = Penalties(repetition=2.0).apply(logits, [1], [0])  # seen: 0 (positive: halved), 1 (negative: doubled)
    torch.testing.assert_close(repeated, torch.tensor([[1.0, -2.0, 0.5, 1.0]]))
    counted = Penalties(presence=0.5, frequency=0.25).apply(logits, [3, 3], [2, 2, 0])  # the prompt does not count
    torch.testing.assert_close(counted, torch.tensor([[2.0 - 0.75, -1.0, 0.5 - 1.0, 1.0]]))
    assert Penalties(presence=0.5).apply(logits, [0], []) is logits  # nothing generated yet
