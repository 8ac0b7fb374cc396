"""Several endpoints behind one client: spreading work, sticking to an endpoint, taking dead ones out.

:meth:`EndpointPool.claim` waits for room: ``concurrency`` over all endpoints, or per-endpoint limits
(``concurrency=auto``). Work sticks to its endpoint (prefix cache) until it is taken out (``max_failures``
connection failures in a row, never a slow reply) or times out there; a background probe puts endpoints back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from common.endpoints.address import COMPLETIONS_PATH, EndpointAddress


class NoLiveEndpointError(RuntimeError):
    """Every endpoint has been taken out."""


@dataclass
class Endpoint:
    """One server (named by its chat-completions URL) and its counters."""

    address: EndpointAddress
    live: bool = True
    consecutive_failures: int = 0
    requests: int = 0
    failures: int = 0
    conversations: int = 0
    taken_out: int = 0
    reinstated: int = 0
    active: int = 0
    last_error: str | None = None
    limit: int | None = None  # conversations allowed in flight here (concurrency=auto); None: fixed
    control: str = "fixed"  # what sets the limit: fixed, metrics or throughput (regen.endpoints.inflight_control)
    control_reason: str | None = None  # why auto fell back to throughput
    metrics_failures: int = 0  # /metrics readings skipped because they failed
    metrics_last_failure: str | None = None
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        self.url = self.address.chat_url
        self.chat_target = URL(self.url)  # parsed once, not per request
        self.completions_target = URL(self.address.base + COMPLETIONS_PATH)
        self.headers = self.address.auth_headers()
        self.request_headers = {"Content-Type": "application/json", **self.headers}
        # The figures' clock (the means, the generation rate) starts when the endpoint takes its first conversation,
        # just before its first request: a server's start-up, or a wait for /v1/models, is not the endpoint's work.
        self.started: float | None = None
        self._since = time.monotonic()
        self._active_area = self._limit_area = 0.0  # integrals over time, for the means
        self.conversation_s: deque[float] = deque(maxlen=256)  # how long recent conversations stayed here

    @property
    def free(self) -> int:
        """Conversations this endpoint can still take (auto mode)."""
        return (self.limit or 0) - self.active

    def _advance(self) -> None:
        now = time.monotonic()
        if self.started is not None:
            self._active_area += self.active * (now - self._since)
            self._limit_area += (self.limit or 0) * (now - self._since)
        self._since = now

    def change_active(self, delta: int) -> None:
        self._advance()
        if self.started is None and delta > 0:
            self.started = self._since
        self.active += delta

    def set_limit(self, limit: int) -> None:
        self._advance()
        self.limit = limit

    def _elapsed(self) -> float:
        """Seconds since the figures' clock started (0 before the first conversation)."""
        self._advance()
        return 0.0 if self.started is None else self._since - self.started

    def mean_in_flight(self) -> float:
        elapsed = self._elapsed()
        return self._active_area / elapsed if elapsed > 0 else float(self.active)

    def mean_limit(self) -> float | None:
        if self.limit is None:
            return None
        elapsed = self._elapsed()
        return self._limit_area / elapsed if elapsed > 0 else float(self.limit)

    def mean_conversation_s(self) -> float | None:
        """The mean time recent conversations stayed on this endpoint (None before one finished)."""
        return sum(self.conversation_s) / len(self.conversation_s) if self.conversation_s else None

    def generation_rate(self) -> float:
        """Completion tokens per second since the endpoint took its first conversation."""
        elapsed = self._elapsed()
        return self.completion_tokens / elapsed if elapsed > 0 else 0.0

    def counts(self) -> dict:
        counts = {
            "requests": self.requests, "failures": self.failures, "conversations": self.conversations,
            "live": self.live, "taken_out": self.taken_out, "reinstated": self.reinstated,
            "last_error": self.last_error, "completion_tokens": self.completion_tokens,
            "generation_tokens_per_s": round(self.generation_rate(), 1), "concurrency_control": self.control,
            "in_flight": self.active, "in_flight_mean": round(self.mean_in_flight(), 1),
        }
        if self.limit is not None:
            counts |= {"in_flight_limit": self.limit, "in_flight_limit_mean": round(self.mean_limit(), 1),
                       "concurrency_control_reason": self.control_reason,
                       "metrics_readings_failed": self.metrics_failures,
                       "metrics_last_failure": self.metrics_last_failure}
        return counts


@dataclass
class Affinity:
    """The endpoint a conversation is currently on (``None`` before its first request)."""

    endpoint: Endpoint | None = None
    used: set[str] = field(default_factory=set)
    since: float = field(default_factory=time.monotonic)  # when it arrived on its endpoint


class EndpointPool:
    """Live/dead bookkeeping and in-flight room for one run's endpoints; ``concurrency`` None: per-endpoint limits
    starting at ``start_limit``."""

    def __init__(self, addresses: list[EndpointAddress], max_failures: int = 3, concurrency: int | None = 64,
                 start_limit: int = 16):
        self.endpoints = [Endpoint(address) for address in addresses]
        self.max_failures = max_failures
        self.concurrency = concurrency
        if concurrency is None:
            for endpoint in self.endpoints:
                endpoint.limit = start_limit
        self.in_flight = 0  # conversations claimed and not released
        self._changed = asyncio.Event()  # room may have appeared
        self._tie_break = itertools.count()
        self.all_down_since: float | None = None  # time.monotonic() when the last live endpoint went

    def _least_loaded(self, live: list[Endpoint]) -> Endpoint:
        turn = next(self._tie_break)
        if self.concurrency is None:
            return max(live, key=lambda e: (e.free, -((self.endpoints.index(e) - turn) % len(self.endpoints))))
        return min(live, key=lambda e: (e.active, (self.endpoints.index(e) - turn) % len(self.endpoints)))

    def _bind(self, affinity: Affinity, endpoint: Endpoint) -> None:
        if affinity.endpoint is not None:
            self._leave(affinity)
        endpoint.change_active(1)
        affinity.endpoint, affinity.since = endpoint, time.monotonic()
        if endpoint.url not in affinity.used:
            affinity.used.add(endpoint.url)
            endpoint.conversations += 1

    def _leave(self, affinity: Affinity) -> None:
        endpoint = affinity.endpoint
        endpoint.change_active(-1)
        endpoint.conversation_s.append(time.monotonic() - affinity.since)
        affinity.endpoint = None
        self._changed.set()

    def _claim_now(self) -> Affinity | None:
        live = [endpoint for endpoint in self.endpoints if endpoint.live]
        if self.concurrency is not None:
            room = self.in_flight < self.concurrency
        elif live:
            room = any(endpoint.free > 0 for endpoint in live)
        else:  # every endpoint is out: the conversation waits for one in ApiClient, bounded by the limits
            room = self.in_flight < sum(endpoint.limit for endpoint in self.endpoints)
        if not room:
            return None
        affinity = Affinity()
        self.in_flight += 1
        if live:
            self._bind(affinity, self._least_loaded(live))
        return affinity

    async def claim(self) -> Affinity:
        """Wait for room for one more conversation; returns its :class:`Affinity` (bound to an endpoint
        unless every endpoint is out). Pair it with :meth:`release`."""
        while (affinity := self._claim_now()) is None:
            self._changed.clear()
            await self._changed.wait()
        return affinity

    def set_limit(self, endpoint: Endpoint, limit: int) -> None:
        """A new in-flight limit for ``endpoint`` (auto mode); room it makes is used at once."""
        endpoint.set_limit(limit)
        self._changed.set()

    def down_for_s(self) -> float:
        """How long every endpoint has been out (0 while one is live)."""
        return 0.0 if self.all_down_since is None else time.monotonic() - self.all_down_since

    def move_away(self, affinity: Affinity, endpoint: Endpoint) -> bool:
        """Move the conversation off ``endpoint`` (one of its requests timed out there) to the live endpoint with
        the fewest active conversations (fixed) or the most free slots (auto) among the others; False when there
        is no other live endpoint."""
        others = [other for other in self.endpoints if other.live and other is not endpoint]
        if not others:
            return False
        self._bind(affinity, self._least_loaded(others))
        return True

    def pick(self, affinity: Affinity) -> Endpoint:
        """The endpoint for this conversation's next request; raises :class:`NoLiveEndpointError`."""
        current = affinity.endpoint
        if current is not None and current.live:
            return current
        live = [endpoint for endpoint in self.endpoints if endpoint.live]
        if not live:
            raise NoLiveEndpointError("no endpoint left: " + "; ".join(
                f"{e.url} taken out after {e.failures} failures (last: {e.last_error})" for e in self.endpoints))
        chosen = self._least_loaded(live)
        self._bind(affinity, chosen)
        return chosen

    def release(self, affinity: Affinity) -> None:
        """The conversation is finished: it no longer loads its endpoint, and its room is free."""
        if affinity.endpoint is not None:
            self._leave(affinity)
        self.in_flight -= 1
        self._changed.set()

    def record_success(self, endpoint: Endpoint, completion_tokens: int = 0) -> None:
        endpoint.requests += 1
        endpoint.consecutive_failures = 0
        endpoint.completion_tokens += completion_tokens

    def record_failure(self, endpoint: Endpoint, error: str, *, unreachable: bool) -> None:
        """Count a failed request; ``unreachable`` (connection refused/reset, timeout) may take it out."""
        endpoint.requests += 1
        endpoint.failures += 1
        endpoint.last_error = error
        if not unreachable:
            return
        endpoint.consecutive_failures += 1
        if endpoint.live and endpoint.consecutive_failures >= self.max_failures:
            self.take_out(endpoint)

    def take_out(self, endpoint: Endpoint) -> None:
        endpoint.live = False
        endpoint.taken_out += 1
        if not any(e.live for e in self.endpoints):
            self.all_down_since = time.monotonic()
        self._changed.set()

    def put_back(self, endpoint: Endpoint) -> None:
        self.all_down_since = None
        endpoint.live = True
        endpoint.consecutive_failures = 0
        endpoint.reinstated += 1
        self._changed.set()

    async def probe_dead(self, session: aiohttp.ClientSession, interval_s: float) -> None:
        """Forever: every ``interval_s``, put back taken-out endpoints that answer ``/health`` and ``/v1/models``."""
        timeout = aiohttp.ClientTimeout(total=min(10.0, interval_s))
        while True:
            await asyncio.sleep(interval_s)
            for endpoint in self.endpoints:
                if not endpoint.live and await answers(session, endpoint, timeout):
                    self.put_back(endpoint)

    def counts(self) -> dict[str, dict]:
        return {endpoint.url: endpoint.counts() for endpoint in self.endpoints}


async def answers(session: aiohttp.ClientSession, endpoint: Endpoint, timeout: aiohttp.ClientTimeout) -> bool:
    """``/health`` and then ``/v1/models`` answer 200 (the session's API key is sent; vLLM ignores it on
    /health). A server without a /health route (404) is judged by /v1/models alone."""
    base = endpoint.address.base
    try:
        async with session.get(base + "/health", headers=endpoint.headers, timeout=timeout) as reply:
            if reply.status not in (200, 404):
                return False
        async with session.get(base + "/v1/models", headers=endpoint.headers, timeout=timeout) as reply:
            return reply.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False
