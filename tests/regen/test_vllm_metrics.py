"""Reading vLLM's Prometheus exposition: today's and older metric names, one series per engine, and what a
server without vLLM metrics answers (a real server on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from regen.endpoints.vllm_metrics import MetricsMissing, ServerLoad, parse_load, read_load

# As vLLM V1 with two data-parallel engines writes it (prometheus_client: counters end in _total, with _created).
TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="org/Model {8B}",engine="0"} 120.0
vllm:num_requests_running{model_name="org/Model {8B}",engine="1"} 100.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="org/Model {8B}",engine="0"} 3.0
vllm:num_requests_waiting{model_name="org/Model {8B}",engine="1"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="org/Model {8B}",engine="0"} 0.9
vllm:kv_cache_usage_perc{model_name="org/Model {8B}",engine="1"} 0.7
# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="org/Model {8B}",engine="0"} 5.0
vllm:num_preemptions_created{model_name="org/Model {8B}",engine="0"} 1.76e+09
vllm:num_preemptions_total{model_name="org/Model {8B}",engine="1"} 2.0
vllm:num_preemptions_created{model_name="org/Model {8B}",engine="1"} 1.76e+09
python_gc_objects_collected_total{generation="0"} 1234.0
"""

OLDER = """\
vllm:num_requests_running{model_name="m"} 7.0 1760000000000
vllm:num_requests_waiting{model_name="m"} 1.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:num_preemptions_total{model_name="m"} 0.0
"""


def test_engines_are_summed_and_kv_usage_averaged():
    assert parse_load(TWO_ENGINES) == ServerLoad(running=220, waiting=3, kv_usage=0.8, preemptions=7)


def test_older_servers_name_the_kv_gauge_gpu_cache_usage_perc():
    assert parse_load(OLDER) == ServerLoad(running=7, waiting=1, kv_usage=0.25, preemptions=0)


def test_a_metrics_page_without_vllm_gauges_is_refused():
    with pytest.raises(MetricsMissing, match="no vllm:num_requests_running"):
        parse_load('# TYPE http_requests_total counter\nhttp_requests_total{code="200"} 3\n')


@pytest.mark.parametrize("bad", ["-3.0", "NaN", "+Inf"])
@pytest.mark.parametrize("gauge", ["vllm:num_requests_running", "vllm:num_requests_waiting",
                                   "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total"])
def test_a_negative_or_non_finite_gauge_value_is_a_failed_reading(gauge, bad):
    """Not skipped (the sum of the other engines would read as the load) and never taken as a count."""
    page = "".join(f"{line.rsplit(' ', 2)[0]} {bad}\n" if line.startswith(gauge) else line + "\n"
                   for line in OLDER.splitlines())
    with pytest.raises(ValueError, match=f"{gauge} is "):
        parse_load(page)


def test_read_load_over_http_tells_a_missing_route_from_a_failing_one():
    statuses = {"a": (200, OLDER), "b": (404, "Not Found"), "c": (503, "busy")}

    async def go():
        async def metrics(request):
            status, text = statuses[request.match_info["prefix"]]
            return web.Response(status=status, text=text)

        app = web.Application()
        app.router.add_get("/{prefix}/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with aiohttp.ClientSession() as session:
                found = await read_load(session, base + "/a", {}, 5)
                with pytest.raises(MetricsMissing, match="HTTP 404"):
                    await read_load(session, base + "/b", {}, 5)
                failing = await read_load(session, base + "/c", {}, 5)
                refused = await read_load(session, "http://127.0.0.1:9", {}, 5)
        finally:
            await runner.cleanup()
        return found, failing, refused

    found, failing, refused = asyncio.run(go())
    assert found == ServerLoad(7, 1, 0.25, 0) and failing is None and refused is None
