"""The shared generation engine: rows of one batch compute what each computes alone (token for token under greedy
decoding, logits to float tolerance), whatever their lengths, waits, departures, arrivals and shared prefix."""

from __future__ import annotations

import pytest
import torch

from common.generation.decode_batch import DecodeBatch
from common.generation.sampler import TokenSampler
from common.minimind.model import MiniMindArch, build_model
from tests.helpers.generation_support import random_prompts, small_random_model

PAD = 0


@pytest.fixture(scope="module")
def model():
    return small_random_model()


@pytest.fixture(scope="module")
def prompts():
    return random_prompts((3, 17, 9, 30, 1))


def full_forward_logits(model, ids: list[int]) -> torch.Tensor:
    """The next-token logits of ``ids`` from one plain forward without any cache."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    batch = DecodeBatch([model], 1, PAD)
    tokens, feed = [], prompt
    for _ in range(n):
        (logits,) = batch.step([feed])
        tokens.append(int(logits.argmax(-1)))
        feed = tokens[-1:]
    return tokens


@torch.inference_mode()
def test_batched_greedy_decode_equals_one_row_decode_token_for_token(model, prompts):
    alone = [greedy_alone(model, prompt, 12) for prompt in prompts]
    batch = DecodeBatch([model], len(prompts), PAD)
    (logits,) = batch.step(prompts)  # prompts of different lengths, right-aligned
    for prompt, row in zip(prompts, logits, strict=True):
        torch.testing.assert_close(row, full_forward_logits(model, prompt), atol=1e-4, rtol=0)
    tokens = [[int(token)] for token in logits.argmax(-1)]
    for _ in range(11):
        (logits,) = batch.step([row[-1:] for row in tokens])
        for row, token in zip(tokens, logits.argmax(-1).tolist(), strict=True):
            row.append(token)
    assert tokens == alone
    assert batch.lengths == [len(prompt) + 11 for prompt in prompts]


@torch.inference_mode()
def test_rows_that_wait_leave_and_join_compute_what_they_compute_alone(model, prompts):
    sequences = [list(prompt) for prompt in prompts]
    rows = [0, 1, 2]  # the sequence each row of the batch holds
    batch = DecodeBatch([model], len(rows), PAD)

    def step(waiting: int | None = None) -> None:
        feeds = [[] if i == waiting else sequences[i][batch.lengths[n]:] for n, i in enumerate(rows)]
        (logits,) = batch.step(feeds)
        fed = [i for i, feed in zip(rows, feeds, strict=True) if feed]
        assert logits.shape[0] == len(fed)
        for i, row in zip(fed, logits, strict=True):
            torch.testing.assert_close(row, full_forward_logits(model, sequences[i]), atol=1e-4, rtol=0)
            sequences[i].append(int(row.argmax(-1)))

    step()  # prompts of 3, 17 and 9 ids, right-aligned
    for observation in ([5, 6, 7], [8]):
        step(waiting=1)  # sequence 1 feeds nothing and gets no logits, while ids join it (a tool's observation)
        sequences[1] += observation
        step()  # then it feeds its last token and the observation at once
    columns = batch.columns
    batch.keep([2, 0])  # sequence 1, the longest, leaves and the order changes: its leading columns are cut
    rows = [2, 0]
    assert batch.columns == columns - (len(prompts[1]) - len(prompts[2]))
    step()
    joining = DecodeBatch([model], 2, PAD)  # sequences 3 (30 ids: more columns than the batch) and 4 (1 id) arrive
    (logits,) = joining.step([sequences[3], sequences[4]])
    for i, row in zip((3, 4), logits, strict=True):
        sequences[i].append(int(row.argmax(-1)))
    batch.extend(joining)
    rows += [3, 4]
    for _ in range(3):
        step()
    batch.keep([])
    assert len(batch) == 0 and batch.columns == 0


@torch.inference_mode()
def test_a_shared_prefix_computed_once_equals_feeding_it_to_every_row(model, prompts):
    prefix, tails = prompts[3], [prompts[0], prompts[2], prompts[4]]
    shared = DecodeBatch([model], len(tails), PAD)
    shared.prefill_shared_prefix(prefix)
    (logits,) = shared.step(tails)
    for tail, row in zip(tails, logits, strict=True):
        torch.testing.assert_close(row, full_forward_logits(model, prefix + tail), atol=1e-4, rtol=0)


@torch.inference_mode()
def test_models_in_lockstep_each_keep_their_own_cache(model, prompts):
    torch.manual_seed(5)
    other = build_model(MiniMindArch(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     num_key_value_heads=2)).eval()
    batch = DecodeBatch([model, other], 2, PAD)
    first, second = batch.step(prompts[:2])
    for prompt, a, b in zip(prompts[:2], first, second, strict=True):
        torch.testing.assert_close(a, full_forward_logits(model, prompt), atol=1e-4, rtol=0)
        torch.testing.assert_close(b, full_forward_logits(other, prompt), atol=1e-4, rtol=0)


@torch.inference_mode()
def test_seeded_rows_sample_the_same_tokens_in_any_batch(model, prompts):
    """Per-row generators: a row's samples do not depend on its batch-mates (which rows, how many, in which order)."""

    class Settings:
        temperature, top_p, top_k, min_p = 1.0, 0.9, 50, 0.0

    def sample(indices: list[int]) -> dict[int, list[int]]:
        sampler = TokenSampler.per_row(Settings(), "cpu", {i: 100 + i for i in indices})
        batch = DecodeBatch([model], len(indices), PAD)
        tokens = {i: [] for i in indices}
        feeds = [prompts[i] for i in indices]
        for _ in range(8):
            (logits,) = batch.step(feeds)
            for i, token in zip(indices, sampler(logits, indices).tolist(), strict=True):
                tokens[i].append(token)
            feeds = [tokens[i][-1:] for i in indices]
        return tokens

    everyone = sample([0, 1, 2, 3, 4])
    assert sample([2]) == {2: everyone[2]}
    assert sample([4, 0, 2]) == {i: everyone[i] for i in (4, 0, 2)}
