"""The modelled vLLM scheduler (pure, simulated time): its limits, preemption, prefix caching, step cost, and the
rise, plateau and fall of tokens/s over fixed client concurrency."""

from __future__ import annotations

from standins.scheduler_model import (
    Request,
    SchedulerModel,
    SchedulerSettings,
    Workload,
    fixed_concurrency_rate,
)


def run_to_end(model: SchedulerModel) -> list[Request]:
    finished = []
    while model.running or model.waiting:
        finished += model.step()[1]
    return finished


def test_at_most_max_num_seqs_run_and_the_rest_wait():
    model = SchedulerModel(SchedulerSettings(max_num_seqs=4, kv_cache_tokens=4096, block_size=16))
    for index in range(10):
        model.submit(Request(list(range(index, index + 40)), 30, 16))
    model.step()
    assert (len(model.running), len(model.waiting)) == (4, 6)
    assert len(run_to_end(model)) == 10 and model.generation_tokens == 100 and model.preemptions == 0


def test_running_out_of_kv_preempts_the_newest_request_which_is_recomputed_later():
    settings = SchedulerSettings(max_num_seqs=8, kv_cache_tokens=64, block_size=8, prefix_caching=False)
    model = SchedulerModel(settings)
    first, second = Request(list(range(100, 140)), 16, 8), Request(list(range(200, 240)), 16, 8)
    model.submit(first)
    model.submit(second)
    model.step()
    assert model.running == [first, second] and model.kv_usage == 0.5
    while model.preemptions == 0:
        model.step()
    assert model.running == [first] and list(model.waiting) == [second] and second.computed == 0
    assert run_to_end(model) == [first, second]
    assert model.generation_tokens == 48  # every token generated once: recomputation is prompt work
    assert model.prompt_tokens > 32 and model.kv_usage == 0.0


def test_a_next_turn_reuses_the_cached_prefix_of_the_previous_one():
    model = SchedulerModel(SchedulerSettings(kv_cache_tokens=4096, block_size=16))
    turn_one = Request(list(range(1000, 1100)), 80, 16)  # 80 prompt tokens, 20 generated
    model.submit(turn_one)
    run_to_end(model)
    computed = model.prompt_tokens
    model.submit(Request(turn_one.token_ids + list(range(5000, 5030)), 110, 16))
    run_to_end(model)
    assert model.prefix_cache_hits == 96  # the first 6 full blocks of the 100 tokens the turns share
    assert model.prompt_tokens - computed == 110 - 96


def test_a_step_costs_more_the_more_it_computes():
    settings = SchedulerSettings(step_base_s=0.01, step_per_token_s=0.001, step_per_context_token_s=0.0)
    one, eight = SchedulerModel(settings), SchedulerModel(settings)
    one.submit(Request([1, 2, 3, 4, 5], 4, 16))
    for index in range(8):
        eight.submit(Request([index, 2, 3, 4, 5], 4, 16))
    assert one.step()[0] == 0.01 + 0.004 and eight.step()[0] == 0.01 + 0.032


def test_tokens_per_second_rise_plateau_and_fall_with_client_concurrency():
    settings = SchedulerSettings(max_num_seqs=24, kv_cache_tokens=8000, block_size=8, max_num_batched_tokens=1024)
    workload = Workload(turns=3, first_prompt_tokens=(100, 300), answer_tokens=(16, 48), follow_up_tokens=(4, 8))
    rate = {c: fixed_concurrency_rate(settings, c, workload, simulated_s=40, warm_up_s=10) for c in (4, 16, 24, 28, 64)}
    assert rate[4] < rate[16] < rate[24]  # rises while the batch grows
    assert abs(rate[28] - rate[24]) < 0.05 * rate[24]  # plateaus: max_num_seqs run, a few wait
    assert rate[64] < 0.85 * rate[24]  # falls: waiting turns lose their cached prefixes and recompute them
