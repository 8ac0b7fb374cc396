"""``concurrency=auto`` on vLLM's real ``/metrics`` pages (``tests/fixtures/vllm/``, recorded by ``make test-vllm``):
with two data-parallel ranks vLLM's API servers declare the scheduler gauges without values until the engines
report, which is "read again", not "no metrics"; a fallback to the throughput rule is announced and recorded
with its reason; a reading that fails in any way (values that overflow when summed) is skipped and counted,
and the steering goes on."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from common.endpoints.address import parse_endpoint
from common.endpoints.endpoint_pool import EndpointPool
from regen.endpoints.inflight_control import EMPTY_READINGS_ALLOWED, steer
from regen.endpoints.vllm_metrics import MetricsNotYet, ServerLoad, parse_load
from standins.vllm_server import Reply, StandinServer
from tests.helpers.regen_support import EOS, ok
from tests.vllm_live.support import FIXTURES

DP1 = (FIXTURES / "metrics_dp1.txt").read_text()
DP2_UNFILLED = (FIXTURES / "metrics_dp2_unfilled.txt").read_text()
DP2_LOADED = (FIXTURES / "metrics_dp2_loaded.txt").read_text()
OVERFLOWING = DP1 + ('vllm:num_requests_running{engine="7",model_name="tiny-qwen3"} 1e308\n'
                     'vllm:num_requests_running{engine="8",model_name="tiny-qwen3"} 1e308\n')  # finite, their sum not


def samples(page: str, name: str) -> list[float]:
    return [float(line.split()[-1]) for line in page.splitlines() if line.startswith(name + "{")]


def test_the_recorded_pages_read_as_vllm_wrote_them():
    load = parse_load(DP1)
    assert load.running == sum(samples(DP1, "vllm:num_requests_running")) > 0
    two = parse_load(DP2_LOADED)
    assert len(samples(DP2_LOADED, "vllm:num_requests_running")) == 2  # one series per engine
    assert two == ServerLoad(running=round(sum(samples(DP2_LOADED, "vllm:num_requests_running"))),
                             waiting=round(sum(samples(DP2_LOADED, "vllm:num_requests_waiting"))),
                             kv_usage=sum(samples(DP2_LOADED, "vllm:kv_cache_usage_perc")) / 2,
                             preemptions=round(sum(samples(DP2_LOADED, "vllm:num_preemptions_total"))))
    assert "# TYPE vllm:num_requests_running gauge" in DP2_UNFILLED
    with pytest.raises(MetricsNotYet, match="declares vllm:num_requests_running without values"):
        parse_load(DP2_UNFILLED)
    with pytest.raises(ValueError, match="vllm:num_requests_running sums to inf"):
        parse_load(OVERFLOWING)


class Pages:
    """``/metrics``: ``first`` for the first ``count`` readings, then ``then``; counts the readings."""

    def __init__(self, first: str, count: int, then: str):
        self.first, self.count, self.then, self.readings = first, count, then, 0

    def __call__(self) -> str:
        self.readings += 1
        return self.first if self.readings <= self.count else self.then


def slow_answers(payload):
    return Reply(ok("fine", [1, 5, 6], [7, 8, EOS]).body, delay_s=0.5)


def test_gauges_declared_without_values_are_read_again_until_the_engines_report(serve, regen, capfd):
    pages = Pages(DP2_UNFILLED, 3, DP2_LOADED)
    server = serve(slow_answers, metrics=pages)
    summary, out, _ = regen([server.url], [{"id": f"c{i}", "prompt": f"q{i}"} for i in range(4)],
                            "concurrency=auto", "concurrency_interval_s=0.05")
    (endpoint,) = summary["endpoints"].values()
    assert pages.readings > 3 and len(out) == 4
    assert endpoint["concurrency_control"] == "metrics" and endpoint["concurrency_control_reason"] is None
    assert endpoint["metrics_readings_failed"] == 0 and "no usable vLLM metrics" not in capfd.readouterr().err


def test_a_fallback_to_throughput_is_announced_and_recorded_with_its_reason(serve, regen, capfd):
    server = serve(slow_answers)  # no /metrics route: HTTP 404
    summary, _, _ = regen([server.url], [{"id": "a", "prompt": "q"}], "concurrency=auto", "concurrency_interval_s=0.05")
    (endpoint,) = summary["endpoints"].values()
    assert endpoint["concurrency_control"] == "throughput"
    assert endpoint["concurrency_control_reason"] == "GET /metrics answered HTTP 404"
    said = " ".join(capfd.readouterr().err.split())
    assert (f"warning: concurrency=auto on {server.chat_url}: no usable vLLM metrics (GET /metrics answered HTTP "
            "404); its limit now follows the measured tokens/s instead") in said
    assert "concurrency=auto fell back to throughput: GET /metrics answered HTTP 404" in said


async def steer_until(pages: Pages, readings: int, *, answered: bool = True):
    """Run ``steer`` on a server serving ``pages`` until it has read ``readings`` of them (or given up on
    them); returns the endpoint and what it announced."""
    server = StandinServer(metrics=pages)
    url = await server.start()
    pool = EndpointPool([parse_endpoint(url)], concurrency=None, start_limit=4)
    endpoint = pool.endpoints[0]
    endpoint.completion_tokens = 10 if answered else 0
    said: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(steer(session, pool, endpoint, 64, 0.01, said.append))
            while pages.readings < readings and endpoint.control != "throughput" and not task.done():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the last reading is handled
            assert not task.done(), task.exception() if task.done() else None  # the steering goes on
            task.cancel()
    finally:
        await server.stop()
    return endpoint, said


@pytest.mark.asyncio
async def test_readings_that_fail_are_skipped_counted_and_the_steering_goes_on():
    pages = Pages(OVERFLOWING, 2, DP1)
    endpoint, said = await steer_until(pages, 4)
    assert endpoint.metrics_failures == 2 and endpoint.control == "metrics"
    assert endpoint.metrics_last_failure == (
        "ValueError: vllm:num_requests_running sums to inf over its "
        f"{len(samples(OVERFLOWING, 'vllm:num_requests_running'))} series")
    assert len(said) == 1 and "a /metrics reading failed" in said[0] and "skipped" in said[0]
    assert endpoint.counts()["metrics_readings_failed"] == 2


@pytest.mark.asyncio
async def test_gauges_that_never_get_values_after_answers_fall_back_with_the_reason():
    pages = Pages(DP2_UNFILLED, 10_000, DP2_UNFILLED)
    endpoint, said = await steer_until(pages, EMPTY_READINGS_ALLOWED + 2)
    assert endpoint.control == "throughput"
    assert endpoint.control_reason.startswith("/metrics declares vllm:num_requests_running without values")
    assert f"{EMPTY_READINGS_ALLOWED} readings after it answered requests" in endpoint.control_reason
    assert len(said) == 1 and "no usable vLLM metrics" in said[0]


@pytest.mark.asyncio
async def test_gauges_without_values_before_any_answer_never_end_the_metrics_rule():
    pages = Pages(DP2_UNFILLED, 10_000, DP2_UNFILLED)
    endpoint, said = await steer_until(pages, EMPTY_READINGS_ALLOWED + 5, answered=False)
    assert endpoint.control == "pending" and endpoint.control_reason is None and said == []
