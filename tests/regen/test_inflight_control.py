"""``concurrency=auto``: its rules on scripted readings -- when they raise, hold and lower (pure: no server, no
clock) --, the metrics rule steering the capacity model of vLLM's scheduler in simulated time (slow), and whole
runs on scripted servers on 127.0.0.1: one without /metrics, a stalled endpoint beside a healthy one."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from regen.endpoints.inflight_control import KV_TARGET, MetricsRule, Observation, ThroughputRule
from regen.endpoints.vllm_metrics import ServerLoad
from standins.scheduler_model import Request, SchedulerModel, SchedulerSettings
from tests.helpers.regen_support import EOS, first_user, ok


def load(kv: float, running: int = 0, waiting: int = 0, preemptions: int = 0) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv, preemptions=preemptions)


def reading(rule: MetricsRule, now_s: float, server: ServerLoad, in_flight: int | None = None,
            settle_s: float | None = 10.0, per_conversation: float | None = None) -> int:
    """One reading with the limit in use (``in_flight`` = the limit unless given)."""
    in_flight = rule.limit if in_flight is None else in_flight
    return rule.update(Observation(now_s, in_flight, settle_s, 0, server, per_conversation))


def test_probing_doubles_at_four_readings_an_interval_while_nothing_waits_and_kv_has_room():
    rule = MetricsRule(start=64, maximum=1024, interval_s=2.0)
    assert rule.reading_interval_s == 0.5
    assert [reading(rule, t, load(0.02, running=r)) for t, r in ((0.5, 64), (1.0, 128), (1.5, 256))] == [128, 256, 512]
    assert reading(rule, 2.0, load(0.30, running=400, waiting=100)) == 512  # the last raise's prefills queue: hold
    assert reading(rule, 2.5, load(0.32, running=512, waiting=40)) == 512  # a queue for less than an interval
    assert reading(rule, 3.0, load(0.32, running=512)) == 640  # doubling would pass PROBE_KV: x1.25 instead
    assert rule.probing and reading(rule, 3.5, load(0.45, running=640)) == 640  # past PROBE_KV: wait until settled
    assert rule.reading_interval_s == 0.5  # (still probing until the next step)
    assert reading(rule, 5.0, load(0.45, running=640), settle_s=2.0) == 853  # settled: x sqrt(0.80 / 0.45)
    assert not rule.probing and rule.reading_interval_s == 0.5  # still climbing: readings at the fast pace
    assert reading(rule, 7.0, load(0.60, running=850), settle_s=3.0) == 853  # 2 s since the change: not settled
    assert reading(rule, 9.0, load(0.60, running=853), settle_s=3.0) == 984  # x sqrt(0.80 / 0.60) = x1.155
    assert reading(rule, 13.0, load(0.72, running=984), settle_s=3.0) == 984  # +20 % since the last reading: rising
    assert reading(rule, 13.5, load(0.73, running=984), settle_s=3.0) == 1024  # x1.10 would pass concurrency_max


def test_the_climb_ends_near_the_kv_target_or_at_an_overload_then_readings_come_every_interval():
    rule = MetricsRule(start=300, maximum=1024, interval_s=2.0)
    assert reading(rule, 0.5, load(0.78, 300)) == 300 and (rule.climbing, rule.reading_interval_s) == (False, 2.0)
    rule = MetricsRule(start=300, maximum=1024, interval_s=2.0)
    assert reading(rule, 0.5, load(0.50, 300, preemptions=3)) == 300  # the first reading sets the baseline
    assert reading(rule, 1.0, load(0.50, 300, preemptions=4)) == 270 and rule.reading_interval_s == 2.0


def test_conversations_of_one_request_have_a_higher_kv_target():
    """No earlier turns to keep cached: 0.86 instead of 0.80, for the steps up and for the lowering."""
    for per_conversation, expected in ((1.0, 586), (1.2, 586), (1.3, 565), (2.5, 565), (None, 565)):
        rule = MetricsRule(start=400, maximum=1024)
        rule.probing = False
        reading(rule, 0, load(0.39, 400))  # the start counts as a change
        assert reading(rule, 20, load(0.40, 400), per_conversation=per_conversation) == expected, per_conversation
    rule = MetricsRule(start=400, maximum=1024)
    rule.probing = False
    assert reading(rule, 0, load(0.78, 400), per_conversation=1.0) == 400
    assert reading(rule, 20, load(0.78, 400), per_conversation=1.0) == 441  # 0.78 < 0.86 - 0.05: x0.86 / 0.78
    assert reading(rule, 40, load(0.78, 441), per_conversation=2.0) == 441  # near 0.80: hold


def test_a_step_up_waits_until_kv_use_stops_rising():
    """The settle time comes from the conversations finished so far, the short ones early in a run."""
    rule = MetricsRule(start=400, maximum=1024)
    rule.probing = False
    reading(rule, 0, load(0.30, 400))
    assert reading(rule, 20, load(0.40, 400)) == 400  # +33 % since the last reading: still rising
    assert reading(rule, 22, load(0.41, 400)) == 558  # +2.5 %: settled, x sqrt(0.80 / 0.41)


def test_the_limit_is_in_use_when_nine_tenths_of_it_are_in_flight():
    """Conversations end and the next ones start between readings: a limit of 300 with 280 in flight is in use."""
    rule = MetricsRule(start=300, maximum=1024)
    assert reading(rule, 0.5, load(0.05, 260), in_flight=269) == 300  # under 270: the source does not fill it
    assert reading(rule, 1.0, load(0.05, 270), in_flight=270) == 600


def test_the_start_counts_as_a_change_so_a_first_reading_past_the_probe_does_not_step_up():
    """A server whose best is below the start (speculators' 64): the first conversations' KV still grows."""
    rule = MetricsRule(start=64, maximum=1024)
    assert reading(rule, 0.5, load(0.61, running=64), settle_s=None) == 64
    assert reading(rule, 1.0, load(0.61, running=64), settle_s=20.0) == 64  # not settled: 0.5 s since the start
    assert reading(rule, 21.0, load(0.61, running=64), settle_s=20.0) == 73


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
    rule = MetricsRule(start=300, maximum=1024)  # probing: readings 0.5 s apart; a queue lowers once it lasted 2 s
    assert [reading(rule, t, load(0.30, 256, waiting=44)) for t in (0.5, 1.0, 1.5, 2.0, 2.5)] == [300] * 4 + [261]


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


# -- the metrics rule against standins.scheduler_model, in simulated time (no HTTP): a closed loop --

def closed_loop(settings: SchedulerSettings, limit: int | str, *, conversations: int, turns: int,
                prompt: tuple[int, int], answer: tuple[int, int], follow_up: tuple[int, int] = (20, 60),
                horizon_s: float | None = None, window_from_s: float = 0.0, start: int = 64,
                interval_s: float = 2.0, seed: int = 0) -> dict:
    """A client keeping ``limit`` conversations in flight (``"auto"``: as :class:`MetricsRule` says, read every
    ``rule.reading_interval_s``) until ``conversations`` are done or ``horizon_s``; generated tokens per simulated
    second from ``window_from_s`` on, preemptions in that window, the limits the rule chose."""
    rng = random.Random(seed)
    model = SchedulerModel(settings)
    rule = MetricsRule(start, 1024, interval_s) if limit == "auto" else None
    current = rule.limit if rule else int(limit)
    active: dict[int, tuple[Request, int, float]] = {}  # id -> (request, turns left, conversation start)
    started, lifetimes, limits, requests = 0, [], [], 0
    next_reading_s = rule.reading_interval_s if rule else float("inf")
    window = None

    def submit(history: list[int], turns_left: int, began_s: float) -> None:
        request = Request(history + [rng.randrange(1, 50000) for _ in range(rng.randint(*answer))], len(history),
                          settings.block_size)
        active[id(request)] = (request, turns_left, began_s)
        model.submit(request)

    while True:
        while started < conversations and len(active) < current:
            submit([rng.randrange(1, 50000) for _ in range(rng.randint(*prompt))], turns - 1, model.clock_s)
            started += 1
        if window is None and model.clock_s >= window_from_s:
            window = (model.clock_s, model.generation_tokens, model.preemptions)
        duration, finished = model.step()
        if not duration or (horizon_s and model.clock_s >= horizon_s):
            break
        requests += len(finished)
        for request in finished:  # read before the next ones start: the limit is seldom full at a reading
            _, turns_left, began_s = active.pop(id(request))
            if turns_left:
                submit(request.token_ids + [rng.randrange(1, 50000) for _ in range(rng.randint(*follow_up))],
                       turns_left - 1, began_s)
            else:
                lifetimes.append(model.clock_s - began_s)
        if rule and model.clock_s >= next_reading_s:
            recent = lifetimes[-200:]
            load = ServerLoad(len(model.running), len(model.waiting), model.kv_usage, model.preemptions)
            current = rule.update(Observation(model.clock_s, len(active), sum(recent) / len(recent) / 2 if recent
                                              else None, 0, load, requests / len(lifetimes) if lifetimes else None))
            limits.append(current)
            next_reading_s = model.clock_s + rule.reading_interval_s
    start_s, start_tokens, start_preemptions = window
    return {"tokens_per_s": (model.generation_tokens - start_tokens) / (model.clock_s - start_s),
            "preemptions": model.preemptions - start_preemptions, "limits": limits, "simulated_s": model.clock_s}


# make bench-concurrency's short workload: room for about 700 of these requests, a run of about 45 simulated s
SHORT_SERVER = SchedulerSettings(max_num_seqs=1024, kv_cache_tokens=160_000, step_base_s=0.008,
                                 step_per_token_s=0.00002)
SHORT_RUN = {"conversations": 6000, "turns": 1, "prompt": (115, 141), "answer": (64, 192)}


@pytest.mark.slow
def test_a_short_run_loses_less_than_5_percent_to_the_best_fixed_concurrency():
    """6,000 one-turn prompts of ~128 tokens (about 45 simulated seconds) on a server with room for about 700
    (fixed 768 is the best: 16,814 tokens/s): auto makes 0.96x. The rule before (a reading every interval, x2 per
    reading, "in use" only with every slot taken, x1.15 steps) made 0.71x from 16 and 0.80x from 64."""
    fixed = {c: closed_loop(SHORT_SERVER, c, **SHORT_RUN)["tokens_per_s"] for c in (512, 768, 1024)}
    auto = closed_loop(SHORT_SERVER, "auto", **SHORT_RUN)
    assert auto["tokens_per_s"] >= 0.95 * max(fixed.values()), (auto["tokens_per_s"], fixed)
    assert auto["preemptions"] == 0 and 512 <= auto["limits"][-1] <= 800
    assert auto["limits"][:2] == [128, 256]  # x2 at readings 0.5 s apart


@pytest.mark.slow
def test_long_runs_settle_without_preemptions_on_a_small_server():
    """3-turn conversations (a KV footprint that grows over the turns) on the low server of make
    bench-concurrency (256 sequences, 50,000 tokens: best near 50): starting above its best at 64, the rule comes
    down and holds, without preemptions after the first minute."""
    low = SchedulerSettings(max_num_seqs=256, kv_cache_tokens=50_000)
    auto = closed_loop(low, "auto", conversations=10**6, turns=3, prompt=(200, 600), answer=(128, 384),
                       horizon_s=240, window_from_s=60)
    fixed_48 = closed_loop(low, 48, conversations=10**6, turns=3, prompt=(200, 600), answer=(128, 384),
                           horizon_s=240, window_from_s=60)
    assert auto["preemptions"] == 0 and 35 <= auto["limits"][-1] <= 64
    assert auto["tokens_per_s"] >= 0.95 * fixed_48["tokens_per_s"]
