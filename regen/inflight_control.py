"""``concurrency=auto``: how many conversations each endpoint gets in flight, adjusted while the run goes.

Every ``concurrency_interval_s`` one loop per endpoint (:func:`steer`) reads the server's ``/metrics``
(``regen.vllm_metrics``) and asks the endpoint's rule for its next limit, within 1..``concurrency_max``.
A limit only gates new conversations: one in flight keeps its endpoint to the end, so a lower limit takes
effect as conversations finish. Both rules wait for a change to show before the next step up: "settled"
means half the mean time a conversation stays on that endpoint has passed since the last change (a
conversation's KV footprint grows over its turns, so a raise shows in the server's KV use only that late).

:class:`MetricsRule` (the server has vLLM's ``/metrics``):

- lower when the server is overloaded: preemptions rose since the last reading, the KV cache is at least
  ``KV_HIGH`` full, or more than a few requests (``waiting_allowance``) waited at two readings in a row.
  The new limit is the in-flight count scaled to bring KV use back to ``KV_TARGET`` (at most x0.9), and
  no more than the requests the server actually runs plus that allowance when requests wait. It lowers
  again only once the in-flight count has come down to the previous limit (no compounding while the
  conversations already started drain);
- raise when there is room: KV use below ``KV_TARGET`` - 0.05, nothing beyond the allowance waiting, no
  new preemption, and the limit is in use (the source keeps up). At first it doubles (at most up to where
  KV use would reach ``PROBE_KV``) on every reading; after that, or after the first overload, it steps up
  by at most x1.15 (and no further than KV use scaled to ``KV_TARGET``), once per settle time;
- otherwise hold.

``KV_TARGET`` is below 1 on purpose: free KV blocks keep earlier turns' prefixes cached, and a server whose
cache is full recomputes every conversation's history.

:class:`ThroughputRule` (no ``/metrics``, e.g. another OpenAI-compatible server): hill climbing on the
endpoint's generation rate as regen measures it (completion tokens per second). Once settled, the rate
at the current limit is compared with the best level measured so far: if it is higher by at least a
quarter of the proportional gain (limit x2 must bring +25 %), the current level becomes the best and the
limit steps up (x2 at first, then x1.15); otherwise the limit goes back to the best level, whose rate is
measured again before the next step up. It never goes below ``concurrency_start``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from regen.endpoint_pool import Endpoint, EndpointPool
from regen.vllm_metrics import MetricsMissing, MetricsNotYet, ServerLoad, read_load

KV_TARGET = 0.80
KV_HIGH = 0.92
PROBE_KV = 0.40
STEADY_STEP = 1.15


@dataclass(frozen=True)
class Observation:
    """What a rule sees at one reading of its endpoint."""

    now_s: float  # monotonic seconds
    in_flight: int  # conversations on the endpoint now
    settle_s: float | None  # half the mean time a conversation stays on it (None before one finished)
    completion_tokens: int  # generated so far on the endpoint, as regen counted them
    load: ServerLoad | None = None  # the server's /metrics (None when not read this time)


def waiting_allowance(running: int) -> int:
    """Requests that may wait without counting as overload: a few, so the batch refills between turns."""
    return max(2, running // 50)


class MetricsRule:
    """Keeps the endpoint's KV use near ``KV_TARGET`` and its waiting queue short (see the module doc)."""

    mode = "metrics"

    def __init__(self, start: int, maximum: int):
        self.limit, self.maximum = start, maximum
        self.probing = True
        self.changed_s: float | None = None
        self._preemptions: int | None = None
        self._waiting_readings = 0

    def _settled(self, observation: Observation) -> bool:
        if self.changed_s is None:
            return True
        return observation.settle_s is not None and observation.now_s - self.changed_s >= observation.settle_s

    def update(self, observation: Observation) -> int:
        load = observation.load
        if load is None:
            return self.limit
        preempted = self._preemptions is not None and load.preemptions > self._preemptions
        self._preemptions = load.preemptions
        allowance = waiting_allowance(load.running)
        self._waiting_readings = self._waiting_readings + 1 if load.waiting > allowance else 0
        in_flight = observation.in_flight
        if preempted or load.kv_usage >= KV_HIGH or self._waiting_readings >= 2:
            self.probing = False
            if in_flight <= self.limit:
                new = math.floor(min(self.limit, in_flight) * min(0.9, KV_TARGET / max(load.kv_usage, 1e-3)))
                if self._waiting_readings >= 2:
                    new = min(new, load.running + allowance)
                self._set(max(1, new), observation.now_s)
        elif (load.kv_usage < KV_TARGET - 0.05 and load.waiting <= allowance and in_flight >= self.limit
              and self.limit < self.maximum):
            headroom = KV_TARGET / max(load.kv_usage, 1e-3)
            if self.probing and load.kv_usage < PROBE_KV:
                self._set(self.limit * min(2.0, PROBE_KV / max(load.kv_usage, 1e-3)), observation.now_s)
            elif self._settled(observation):
                self.probing = False
                self._set(self.limit * min(STEADY_STEP, headroom), observation.now_s)
        return self.limit

    def _set(self, limit: float, now_s: float) -> None:
        self.limit = min(self.maximum, max(self.limit + 1 if limit > self.limit else 1, math.floor(limit)))
        self.changed_s = now_s


class ThroughputRule:
    """Without ``/metrics``: climbs while more conversations in flight bring more tokens/s (module doc)."""

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
    """Forever: every ``interval_s``, read ``endpoint``'s load and set its limit in ``pool`` by its rule
    (:class:`MetricsRule`; :class:`ThroughputRule` once the server shows it has no usable vLLM metrics, which is
    announced through ``warn`` and recorded as ``endpoint.control_reason``). A reading that fails in any way is
    skipped and counted (``endpoint.metrics_failures``); gauges declared without values (several vLLM API
    servers before the engines report) are read again, until ``EMPTY_READINGS_ALLOWED`` such readings after
    the endpoint answered requests."""
    rule: MetricsRule | ThroughputRule = MetricsRule(endpoint.limit, maximum)
    endpoint.control = "pending"  # until the first reading tells metrics from throughput
    empty_readings = 0
    while True:
        await asyncio.sleep(interval_s)
        if not endpoint.live:
            continue
        load = None
        try:
            if isinstance(rule, MetricsRule):
                try:
                    load = await read_load(session, endpoint.address.base, endpoint.headers,
                                           min(10.0, 2 * interval_s))
                    empty_readings = 0
                except MetricsNotYet as error:
                    empty_readings += endpoint.completion_tokens > 0  # it has answered requests
                    if empty_readings < EMPTY_READINGS_ALLOWED:
                        continue
                    raise MetricsMissing(f"{error}, {empty_readings} readings after it answered requests "
                                         "(a server started with --disable-log-stats?)") from None
                if load is not None:
                    endpoint.control = rule.mode
            mean_s = endpoint.mean_conversation_s()
            observation = Observation(time.monotonic(), endpoint.active, None if mean_s is None else mean_s / 2,
                                      endpoint.completion_tokens, load)
            pool.set_limit(endpoint, rule.update(observation))
        except MetricsMissing as missing:
            rule = ThroughputRule(rule.limit, maximum, time.monotonic(), endpoint.completion_tokens)
            endpoint.control, endpoint.control_reason = rule.mode, str(missing)
            warn(f"concurrency=auto on {endpoint.url}: no usable vLLM metrics ({missing}); its limit now "
                 "follows the measured tokens/s instead")
        except Exception as error:  # noqa: BLE001 - a bad reading must never stop the steering
            _reading_failure(endpoint, error, warn)
