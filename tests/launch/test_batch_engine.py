"""The batch engine: batched greedy output equals unbatched output and transformers' generate, forward passes
are shared, limits and stop conditions hold, seeded sampling does not depend on the batch, and a request that
fails inside a shared step (sampling, prefill or decode forward) fails alone while the rest complete."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import Qwen3ForCausalLM

from launch.batch_engine import BatchEngine, SamplingParams
from tests.helpers.generation_support import random_prompts, small_random_model

EOS = 2
PROMPT_LENGTHS = (3, 17, 9, 30, 5, 12, 1, 22)


@pytest.fixture(scope="module")
def model():
    return small_random_model()


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(PROMPT_LENGTHS)


@pytest.fixture
def engine(model):
    engines = []

    def make(**options):
        options.setdefault("max_model_len", 512)
        engines.append(BatchEngine(model, eos_token_ids={EOS}, **options).start())
        return engines[-1]

    yield make
    for e in engines:
        e.stop()


def greedy(n: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **extra)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_sequential_requests_match_transformers_generate_and_count_passes(model, prompts, engine):
    e = engine()
    outputs = [e.submit(p, greedy(12)).result(timeout=60) for p in prompts]
    assert [o.token_ids for o in outputs] == [hf_greedy(model, p, 12) for p in prompts]
    assert all(o.finish_reason == "length" for o in outputs)
    stats = e.stats()
    # one request at a time: 1 prefill + 11 decode passes each
    assert (stats["forward_passes"], stats["prefill_passes"], stats["decode_passes"]) == (96, 8, 88)
    assert stats["generated_tokens"] == 96 and stats["prompt_tokens"] == sum(PROMPT_LENGTHS)


def test_concurrent_requests_share_passes_and_give_the_same_tokens(prompts, engine):
    alone = engine()
    expected = [alone.submit(p, greedy(6 + i)).result(timeout=60).token_ids for i, p in enumerate(prompts)]
    e = engine()
    futures = []
    for i, prompt in enumerate(prompts):  # staggered arrivals: joins into a running batch of other widths
        futures.append(e.submit(prompt, greedy(6 + i)))
        time.sleep(0.002 * (i % 3))
    assert [f.result(timeout=60).token_ids for f in futures] == expected
    stats = e.stats()
    sequential_passes = sum(6 + i for i in range(8))  # 76: each request alone needs max_tokens passes
    assert stats["forward_passes"] < sequential_passes
    assert stats["peak_running"] >= 2


def test_requests_waiting_together_take_one_prefill_and_the_longest_decode(model, prompts):
    e = BatchEngine(model, eos_token_ids={EOS}, max_model_len=512)
    futures = [e.submit(p, greedy(6 + i)) for i, p in enumerate(prompts)]  # queued before the worker starts
    e.start()
    try:
        lengths = [len(f.result(timeout=60).token_ids) for f in futures]
    finally:
        e.stop()
    assert lengths == [6 + i for i in range(8)]
    stats = e.stats()
    # one prefill for all eight, then decode steps until the longest (13 tokens) is done: 1 + 12 passes,
    # against 76 when they run one after another
    assert (stats["forward_passes"], stats["prefill_passes"], stats["decode_passes"]) == (13, 1, 12)
    assert stats["peak_running"] == 8


def test_max_batch_size_caps_running_sequences(prompts, engine):
    e = engine(max_batch_size=3)
    futures = [e.submit(p, greedy(5)) for p in prompts]
    assert all(len(f.result(timeout=60).token_ids) == 5 for f in futures)
    assert e.stats()["peak_running"] == 3


def test_prefill_token_budget_splits_prefill_passes(prompts, engine):
    e = engine(max_prefill_tokens=30)  # the 30-token prompt fills a pass alone; 17 + 9 padded to 17 = 34 > 30
    futures = [e.submit(p, greedy(1)) for p in prompts]
    for f in futures:
        f.result(timeout=60)
    stats = e.stats()
    assert stats["prefill_passes"] == stats["forward_passes"]  # max_tokens=1: the prefill pass yields the token
    # no pass holds more than 30 padded tokens: FIFO gives [3] [17] [9] [30] [5, 12] [1] [22] when all wait
    # together, one pass each when they trickle in
    assert stats["prefill_passes"] in (7, 8)


def test_eos_and_stop_token_ids_stop_and_ignore_eos_continues(prompts, engine):
    e = engine()
    free = e.submit(prompts[1], greedy(10)).result(timeout=60).token_ids
    stop_at = free[3]
    first = free.index(stop_at)
    by_stop_id = e.submit(prompts[1], greedy(10, stop_token_ids=(stop_at,))).result(timeout=60)
    assert by_stop_id.token_ids == free[: first + 1]
    assert (by_stop_id.finish_reason, by_stop_id.stop_token_id, by_stop_id.stopped_by_eos) == ("stop", stop_at, False)
    as_eos = BatchEngine(e.model, eos_token_ids={stop_at}, max_model_len=512).start()
    try:
        stopped = as_eos.submit(prompts[1], SamplingParams(max_tokens=10, temperature=0.0)).result(timeout=60)
        ignored = as_eos.submit(prompts[1], greedy(10)).result(timeout=60)
    finally:
        as_eos.stop()
    assert stopped.token_ids == free[: first + 1] and stopped.stopped_by_eos and stopped.finish_reason == "stop"
    assert ignored.token_ids == free and ignored.finish_reason == "length"


def test_model_length_caps_generation(prompts, engine):
    e = engine(max_model_len=20)
    result = e.submit(prompts[1], greedy(100)).result(timeout=60)  # 17 prompt tokens leave 3
    assert len(result.token_ids) == 3 and result.finish_reason == "length"
    with pytest.raises(ValueError, match="no room"):
        e.submit(list(range(3, 23)), greedy(5))


def test_seeded_sampling_does_not_depend_on_the_batch(prompts, engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    e = engine()
    alone = e.submit(prompts[2], params).result(timeout=60).token_ids
    crowd = [e.submit(p, SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)) for p in prompts]
    with_others = e.submit(prompts[2], params).result(timeout=60).token_ids
    for f in crowd:
        f.result(timeout=60)
    assert with_others == alone
    other_seed = e.submit(prompts[2], SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=99,
                                                     ignore_eos=True)).result(timeout=60).token_ids
    assert other_seed != alone


def test_top_k_1_is_greedy_and_penalties_change_greedy_choice(model, prompts, engine):
    e = engine()
    reference = e.submit(prompts[0], greedy(12)).result(timeout=60).token_ids
    top1 = e.submit(prompts[0], SamplingParams(max_tokens=12, temperature=1.5, top_k=1, ignore_eos=True))
    assert top1.result(timeout=60).token_ids == reference
    repeated = [t for t in reference if reference.count(t) > 1]
    assert repeated, "the random model repeats itself under greedy decoding"
    penalized = e.submit(prompts[0], greedy(12, frequency_penalty=2.0)).result(timeout=60).token_ids
    assert penalized != reference


def test_cancelled_requests_are_dropped(prompts, engine):
    e = engine()
    doomed = e.submit(prompts[0], greedy(400))
    kept = e.submit(prompts[1], greedy(30))
    time.sleep(0.05)
    doomed.cancel()
    assert len(kept.result(timeout=60).token_ids) == 30
    deadline = time.monotonic() + 10
    while e.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = e.stats()
    assert stats["cancelled_requests"] == 1 and stats["running"] == 0 and stats["finished_requests"] == 1
    assert stats["generated_tokens"] < 400 + 30


POISON_POSITION = 100  # beyond every clean prompt + 12 tokens


class PoisonedAtPosition(Qwen3ForCausalLM):
    """A real (random) Qwen3 whose body fails whenever any row reaches position POISON_POSITION."""

    def __init__(self, config):
        super().__init__(config)
        self.model.register_forward_pre_hook(self._poison, with_kwargs=True)

    @staticmethod
    def _poison(module, args, kwargs):
        if (kwargs["position_ids"] == POISON_POSITION).any():
            raise RuntimeError(f"poisoned position {POISON_POSITION}")


@pytest.fixture(scope="module")
def poisoned(model):
    twin = PoisonedAtPosition(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_request_failing_inside_a_shared_forward_fails_alone(model, poisoned, prompts, where):
    # prefill: a 105-token prompt holds the poisoned position; decode: a 98-token prompt reaches it at its third step
    culprit = list(range(100, 205 if where == "prefill" else 198))
    batch = [*prompts[:3], culprit, *prompts[3:7]]
    clean = BatchEngine(model, eos_token_ids={EOS}, max_model_len=512).start()
    try:
        expected = [clean.submit(p, greedy(12)).result(timeout=60).token_ids for p in prompts[:7]]
    finally:
        clean.stop()
    engine = BatchEngine(poisoned, eos_token_ids={EOS}, max_model_len=512)
    futures = [engine.submit(p, greedy(12)) for p in batch]  # all wait together: one shared prefill
    engine.start()
    try:
        with pytest.raises(RuntimeError, match="poisoned position"):
            futures[3].result(timeout=60)
        assert [f.result(timeout=60).token_ids for i, f in enumerate(futures) if i != 3] == expected
        stats = engine.stats()
    finally:
        engine.stop()
    assert stats["failed_requests"] == 1 and stats["finished_requests"] == 7


def test_a_request_whose_sampling_fails_fails_alone(prompts, engine):
    e = engine()
    params = [greedy(10) for _ in prompts]
    params[2] = SamplingParams(max_tokens=10, temperature=1.0, presence_penalty=float("nan"), ignore_eos=True)
    expected = [e.submit(p, greedy(10)).result(timeout=60).token_ids for p in prompts]
    futures = [e.submit(p, q) for p, q in zip(prompts, params, strict=True)]
    with pytest.raises(ValueError, match="not finite or sum to 0"):  # the sampler's own check (common/generation)
        futures[2].result(timeout=60)
    assert [f.result(timeout=60).token_ids for i, f in enumerate(futures) if i != 2] == expected[:2] + expected[3:]
    assert e.stats()["failed_requests"] == 1
