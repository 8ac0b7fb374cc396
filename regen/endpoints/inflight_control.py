"""``concurrency=auto``: how many conversations each endpoint gets in flight, adjusted while the run goes.

One :func:`steer` loop per endpoint reads the server's ``/metrics`` every ``concurrency_interval_s`` and sets the
limit its rule gives, within 1..``concurrency_max``. A limit gates only new conversations (one in flight keeps its
endpoint), so a lower limit takes effect as conversations finish. Past the first probe a rule raises only once
"settled": half a conversation's mean stay since the last change (KV use grows over a conversation's turns).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from common.endpoints.endpoint_pool import Endpoint, EndpointPool
from regen.endpoints.vllm_metrics import MetricsMissing, MetricsNotYet, ServerLoad, read_load

KV_TARGET = 0.80
KV_TARGET_ONE_REQUEST = 0.86  # when the endpoint's conversations are one request each
KV_HIGH = 0.92
PROBE_KV = 0.40
PROBE_STEP = 2.0  # while probing: at most x2 per reading ...
PROBE_READINGS = 4  # ... and a reading every interval / 4
STEADY_STEP = 1.15
ONE_REQUEST = 1.2  # requests per conversation up to which conversations count as one request each
KV_RISING = 1.05  # KV use above 1.05x the previous reading's is still rising
IN_USE = 0.9  # the limit is in use when this share of it is in flight (conversations come and go between readings)


@dataclass(frozen=True)
class Observation:
    """What a rule sees at one reading of its endpoint."""

    now_s: float  # monotonic seconds
    in_flight: int  # conversations on the endpoint now
    settle_s: float | None  # half the mean time a conversation stays on it (None before one finished)
    completion_tokens: int  # generated so far on the endpoint, as regen counted them
    load: ServerLoad | None = None  # the server's /metrics (None when not read this time)
    requests_per_conversation: float | None = None  # requests answered per conversation finished on it


def waiting_allowance(running: int) -> int:
    """Requests that may wait without counting as overload: a few, so the batch refills between turns."""
    return max(2, running // 50)


class MetricsRule:
    """Keeps the endpoint's KV use near ``KV_TARGET`` (below 1: free blocks keep earlier turns' prefixes cached;
    ``KV_TARGET_ONE_REQUEST`` when conversations are one request) and its waiting queue short.

    Lower on overload (new preemptions, KV use at ``KV_HIGH``, a queue over ``waiting_allowance`` at readings an
    interval apart): the in-flight count scaled towards the target (at most x0.9), not again until in-flight has
    drained to the previous limit. Raise when KV use is below the target with the limit in use: first by probing (x2
    per reading, up to ``PROBE_KV``), then once settled and KV no longer rising, by sqrt(target / KV use), at least
    x1.15, never past the target. Reads every quarter interval until the first overload or KV use near the target.
    """

    mode = "metrics"

    def __init__(self, start: int, maximum: int, interval_s: float = 2.0):
        self.limit, self.maximum, self.interval_s = start, maximum, interval_s
        self.probing = True
        self.climbing = True  # until the first overload, or the first reading with KV use near the target
        self.changed_s: float | None = None  # the start counts as a change: the first reading sets it
        self._preemptions: int | None = None
        self._kv: float | None = None  # KV use at the previous reading
        self._waiting_since: float | None = None  # first reading of the current run of readings with a queue

    @property
    def reading_interval_s(self) -> float:
        """How long until the next reading: ``interval_s``, a quarter of it while climbing."""
        return self.interval_s / PROBE_READINGS if self.climbing else self.interval_s

    def _settled(self, observation: Observation, rising: bool) -> bool:
        """Half a conversation's stay since the last change, and KV use no longer rising (the first conversations to
        finish are the short ones)."""
        return (observation.settle_s is not None and observation.now_s - self.changed_s >= observation.settle_s
                and not rising)

    def update(self, observation: Observation) -> int:
        now_s = observation.now_s
        if self.changed_s is None:
            self.changed_s = now_s
        load = observation.load
        if load is None:
            return self.limit
        preempted = self._preemptions is not None and load.preemptions > self._preemptions
        self._preemptions = load.preemptions
        allowance = waiting_allowance(load.running)
        if load.waiting <= allowance:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now_s
        # a queue seen at readings an interval apart (two readings in a row at the normal pace); between probe
        # readings a queue is the last raise's requests waiting for their prefill, not yet an overload
        queued = self._waiting_since is not None and now_s - self._waiting_since >= 0.9 * self.interval_s
        in_flight = observation.in_flight
        kv = max(load.kv_usage, 1e-3)
        rising = self._kv is not None and load.kv_usage > self._kv * KV_RISING
        self._kv = load.kv_usage
        # no earlier turns to keep cached when every conversation is one request: the KV target is higher
        one_request = (observation.requests_per_conversation is not None
                       and observation.requests_per_conversation <= ONE_REQUEST)
        target = KV_TARGET_ONE_REQUEST if one_request else KV_TARGET
        if preempted or load.kv_usage >= KV_HIGH or queued:
            self.probing = self.climbing = False
            if in_flight <= self.limit:
                new = math.floor(min(self.limit, in_flight) * min(0.9, target / kv))
                if queued:
                    new = min(new, load.running + allowance)
                self._set(max(1, new), now_s)
        elif (load.kv_usage < target - 0.05 and load.waiting <= allowance and in_flight >= IN_USE * self.limit
              and self.limit < self.maximum):
            headroom = target / kv
            if self.probing and load.kv_usage < PROBE_KV:
                self._set(self.limit * min(PROBE_STEP, PROBE_KV / kv), now_s)
            elif self._settled(observation, rising):
                self.probing = False
                self._set(self.limit * min(headroom, max(STEADY_STEP, math.sqrt(headroom))), now_s)
        elif load.kv_usage >= target - 0.05:
            self.probing = self.climbing = False
        return self.limit

    def _set(self, limit: float, now_s: float) -> None:
        self.limit = min(self.maximum, max(self.limit + 1 if limit > self.limit else 1, math.floor(limit)))
        self.changed_s = now_s


class ThroughputRule:
    """Without ``/metrics``: hill climbing on the measured tokens/s. Once settled, a level at least a quarter of the
    proportional gain better than the best so far becomes the best and the limit steps up (x2, then x1.15); otherwise
    it goes back to the best level. Never below ``concurrency_start``."""

    mode = "throughput"

    def __init__(self, start: int, maximum: int, now_s: float, completion_tokens: int):
        self.limit, self.maximum, self.minimum = start, maximum, start
        self.probing = True
        self.best: tuple[int, float] | None = None  # (limit, tokens/s) of the best level measured
        self._window = (now_s, completion_tokens)

    def update(self, observation: Observation) -> int:
        started_s, started_tokens = self._window
        if observation.in_flight < self.limit:  # not using its room: this window says nothing about the level
            self._window = (observation.now_s, observation.completion_tokens)
            return self.limit
        elapsed = observation.now_s - started_s
        if observation.settle_s is None or elapsed < observation.settle_s:
            return self.limit
        rate = (observation.completion_tokens - started_tokens) / elapsed
        self._window = (observation.now_s, observation.completion_tokens)
        best = self.best
        if best is None or self.limit == best[0] or rate >= best[1] * (1 + 0.25 * (self.limit / best[0] - 1)):
            self.best = (self.limit, rate)
            step = 2.0 if self.probing else STEADY_STEP
            self.limit = min(self.maximum, max(self.limit + 1, math.floor(self.limit * step)))
        else:
            self.probing = False
            self.limit = max(self.minimum, best[0])
        return self.limit


EMPTY_READINGS_ALLOWED = 3  # readings of gauges without values, after requests were answered, before giving up


def _reading_failure(endpoint: Endpoint, error: Exception, warn: Callable[[str], None]) -> None:
    """Count a reading that failed (it is skipped); the first one is announced."""
    endpoint.metrics_failures += 1
    endpoint.metrics_last_failure = f"{type(error).__name__}: {error}"
    if endpoint.metrics_failures == 1:
        warn(f"concurrency=auto on {endpoint.url}: a /metrics reading failed ({endpoint.metrics_last_failure}); "
             "it is skipped, and so is any later one that fails (counted in the summary)")


async def steer(session: aiohttp.ClientSession, pool: EndpointPool, endpoint: Endpoint, maximum: int,
                interval_s: float, warn: Callable[[str], None]) -> None:
    """Forever: at each ``reading_interval_s`` read ``endpoint``'s load and set its limit in ``pool`` by its rule,
    switching to :class:`ThroughputRule` (announced through ``warn``) once the server shows no usable vLLM metrics.
    A failed reading is skipped and counted; gauges without values are read again, up to ``EMPTY_READINGS_ALLOWED``
    such readings after the endpoint answered requests."""
    rule: MetricsRule | ThroughputRule = MetricsRule(endpoint.limit, maximum, interval_s)
    endpoint.control = "pending"  # until the first reading tells metrics from throughput
    empty_readings = 0
    not_yet = False  # the last page declared the gauges without values: read it again at the normal pace
    while True:
        await asyncio.sleep(rule.reading_interval_s if isinstance(rule, MetricsRule) and not not_yet else interval_s)
        if not endpoint.live:
            continue
        load = None
        try:
            if isinstance(rule, MetricsRule):
                try:
                    not_yet = False
                    load = await read_load(session, endpoint.address.base, endpoint.headers,
                                           min(10.0, 2 * interval_s))
                    empty_readings = 0
                except MetricsNotYet as error:
                    not_yet = True
                    empty_readings += endpoint.completion_tokens > 0  # it has answered requests
                    if empty_readings < EMPTY_READINGS_ALLOWED:
                        continue
                    raise MetricsMissing(f"{error}, {empty_readings} readings after it answered requests "
                                         "(a server started with --disable-log-stats?)") from None
                if load is not None:
                    endpoint.control = rule.mode
            mean_s = endpoint.mean_conversation_s()
            finished = endpoint.conversations - endpoint.active
            observation = Observation(time.monotonic(), endpoint.active, None if mean_s is None else mean_s / 2,
                                      endpoint.completion_tokens, load,
                                      endpoint.requests / finished if finished > 0 else None)
            pool.set_limit(endpoint, rule.update(observation))
        except MetricsMissing as missing:
            rule = ThroughputRule(rule.limit, maximum, time.monotonic(), endpoint.completion_tokens)
            endpoint.control, endpoint.control_reason = rule.mode, str(missing)
            warn(f"concurrency=auto on {endpoint.url}: no usable vLLM metrics ({missing}); its limit now "
                 "follows the measured tokens/s instead")
        except Exception as error:  # noqa: BLE001 - a bad reading must never stop the steering
            _reading_failure(endpoint, error, warn)
