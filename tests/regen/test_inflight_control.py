"""``concurrency=auto``: its rules on scripted readings -- when they raise, hold and lower (pure: no server, no
clock) -- and whole runs on scripted servers on 127.0.0.1: one without /metrics, a stalled endpoint beside a
healthy one."""

from __future__ import annotations

import asyncio
import threading

from regen.inflight_control import KV_TARGET, MetricsRule, Observation, ThroughputRule
from regen.vllm_metrics import ServerLoad
from tests.helpers.regen_support import EOS, first_user, ok


def load(kv: float, running: int = 0, waiting: int = 0, preemptions: int = 0) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv, preemptions=preemptions)


def reading(rule: MetricsRule, now_s: float, server: ServerLoad, in_flight: int | None = None,
            settle_s: float | None = 10.0) -> int:
    """One reading with the limit in use (``in_flight`` = the limit unless given)."""
    in_flight = rule.limit if in_flight is None else in_flight
    return rule.update(Observation(now_s, in_flight, settle_s, 0, server))


def test_the_limit_doubles_while_the_server_has_room_then_steps_up_once_each_change_has_settled():
    rule = MetricsRule(start=16, maximum=1024)
    assert [reading(rule, t, load(0.02, running=r)) for t, r in ((2, 16), (4, 32), (6, 64))] == [32, 64, 128]
    assert reading(rule, 8, load(0.25, running=128)) == 204  # doubling would pass PROBE_KV: x1.6 instead
    assert reading(rule, 10, load(0.45, running=200)) == 204  # past PROBE_KV: wait until settled (10 s)
    assert reading(rule, 16, load(0.45, running=204)) == 204
    assert reading(rule, 18, load(0.45, running=204)) == 234  # settled: x1.15
    assert reading(rule, 20, load(0.50, running=230)) == 234
    assert reading(rule, 28, load(0.72, running=234)) == 260  # x1.15 would pass KV_TARGET: 0.80/0.72 = x1.11
    assert reading(rule, 50, load(0.74, running=260), settle_s=None) == 260  # no conversation finished yet


def test_the_limit_holds_near_the_target_with_a_short_queue_or_when_it_is_not_in_use():
    rule = MetricsRule(start=100, maximum=1024)
    rule.probing = False
    for now_s, server in enumerate([load(0.78, 100), load(0.90, 100), load(0.5, 100, waiting=9),
                                    load(0.78, 100, waiting=2)], start=1):
        assert reading(rule, 100 * now_s, server) == 100
    assert reading(rule, 1000, load(0.10, 60), in_flight=60) == 100  # the source does not fill it: no raise
    assert reading(rule, 1100, None) == 100  # /metrics did not answer this time


def test_the_limit_is_lowered_on_preemptions_a_full_cache_or_a_lasting_queue_and_not_twice_in_a_row():
    rule = MetricsRule(start=400, maximum=1024)
    rule.probing = False
    assert reading(rule, 2, load(0.85, 380, preemptions=7)) == 400  # the first reading sets the baseline
    assert reading(rule, 4, load(0.85, 390, preemptions=9)) == 360  # preempted: x0.9
    assert reading(rule, 6, load(0.97, 390, preemptions=9), in_flight=390) == 360  # still draining: wait
    assert reading(rule, 8, load(0.97, 360, preemptions=9), in_flight=360) == int(360 * KV_TARGET / 0.97)
    rule = MetricsRule(start=300, maximum=1024)
    assert reading(rule, 2, load(0.30, 256, waiting=44)) == 300  # one reading with a queue: hold
    assert reading(rule, 4, load(0.30, 256, waiting=44)) == 256 + 5  # two: what it runs plus the allowance
    assert not rule.probing


def test_the_limit_stays_within_one_and_concurrency_max():
    rule = MetricsRule(start=600, maximum=1000)
    assert reading(rule, 2, load(0.01, 600)) == 1000
    assert reading(rule, 4, load(0.01, 1000)) == 1000
    rule = MetricsRule(start=1, maximum=8)
    assert reading(rule, 2, load(1.0, 1, waiting=50)) == 1
    assert reading(rule, 4, load(1.0, 1, waiting=50)) == 1


def throughput_reading(rule: ThroughputRule, now_s: float, tokens: int, in_flight: int | None = None) -> int:
    in_flight = rule.limit if in_flight is None else in_flight
    return rule.update(Observation(now_s, in_flight, 10.0, tokens))


def test_without_metrics_the_limit_climbs_while_tokens_per_second_grow_and_returns_to_the_best_level():
    rule = ThroughputRule(start=16, maximum=1024, now_s=0, completion_tokens=0)
    assert throughput_reading(rule, 5, 500) == 16  # not settled yet
    assert throughput_reading(rule, 10, 1000) == 32  # 100 tok/s at 16: the first level measured
    assert throughput_reading(rule, 20, 2800) == 64  # 180 tok/s at 32: +80 % >= a quarter of +100 %
    assert throughput_reading(rule, 30, 4800) == 32  # 200 tok/s at 64: +11 % < 25 %: back to 32
    assert throughput_reading(rule, 40, 6600) == 36  # 32 measured again (180 tok/s): step up x1.15
    assert throughput_reading(rule, 50, 8200) == 32  # 160 tok/s at 36: worse, back
    assert throughput_reading(rule, 60, 9000, in_flight=10) == 32  # room not used: the window restarts
    assert throughput_reading(rule, 65, 9900) == 32
    assert throughput_reading(rule, 70, 10800) == 36  # 180 tok/s over 60..70 at 32
    assert rule.best == (32, 180.0)


def test_without_metrics_the_limit_never_goes_below_its_start():
    rule = ThroughputRule(start=16, maximum=1024, now_s=0, completion_tokens=0)
    assert throughput_reading(rule, 10, 1000) == 32
    assert throughput_reading(rule, 20, 1500) == 16  # slower at 32: back to 16
    assert throughput_reading(rule, 30, 1600) == 18  # 16 measured again, then a step up
    assert throughput_reading(rule, 40, 1610) == 16


def test_a_run_without_metrics_steers_by_throughput(serve, regen):
    server = serve(lambda payload: ok("fine", [1, 5, 6], [7, 8, EOS]))  # no /metrics route: HTTP 404
    rows = [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(30)]
    summary, out, errors = regen([server.url], rows, "concurrency=auto", "concurrency_start=2",
                                 "concurrency_interval_s=0.01")
    assert sorted(r["primary_id"] for r in out) == sorted(f"p{i}" for i in range(30)) and errors == []
    [endpoint] = summary["endpoints"].values()
    assert endpoint["concurrency_control"] == "throughput" and endpoint["in_flight_limit"] >= 2


def test_a_stalled_endpoint_does_not_pin_the_others(serve, regen):
    rows = [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(24)]
    stalled_on, released, served = [], threading.Event(), []

    async def stalled(payload):  # holds every request until the healthy endpoint has done all the rest
        stalled_on.append(first_user(payload))
        for _ in range(6000):
            if released.is_set():
                break
            await asyncio.sleep(0.01)
        # released inside the healthy endpoint's last request, before its reply is out: answer well after it,
        # or a loaded machine can write the stalled rows first (a race of the test, not of regen)
        await asyncio.sleep(0.5)
        return ok("late", [1, 5], [9, EOS])

    def healthy(payload):
        served.append(first_user(payload))
        if len(served) + len(stalled_on) == len(rows):
            released.set()
        return ok("on time", [1, 5], [6, EOS])

    stuck, steady = serve(stalled), serve(healthy)
    summary, out, errors = regen([stuck.url, steady.url], rows, "concurrency=auto", "concurrency_start=3",
                                 "request_timeout_s=120")
    assert released.is_set() and len(stalled_on) == 3  # released by the condition, not by the 60 s backstop
    assert sorted(served + stalled_on) == sorted(r["prompt"] for r in rows) and errors == []
    assert [r["metadata"]["endpoint"] for r in out[-3:]] == [stuck.chat_url] * 3  # the stalled ones end last
    assert summary["endpoints"][steady.chat_url]["conversations"] == 21
