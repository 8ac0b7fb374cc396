"""Several chat endpoints behind one client: naming them, spreading conversations, taking dead ones out.

An endpoint may be written ``http://host:port``, ``.../v1`` or ``.../v1/chat/completions`` (speculators'
``--endpoint`` form); all name the same server, and rows record its chat-completions URL. Credentials in
the URL (``http://user:password@host``) are sent as basic auth and never appear in a name, a row or a
message. A conversation sticks to the endpoint it was given (prefix-cache friendly) until that endpoint
is taken out; then its next request goes to the live endpoint with the fewest active conversations. An
endpoint is taken out after ``max_failures`` connection-level failures in a row (refused, reset, no
connection within the connect timeout) or a failed probe, never for a slow reply; a background probe
(``/health``, then ``/v1/models``) puts it back when it answers again. ``all_down_since`` tells the
client how long there has been no endpoint at all.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class EndpointAddress:
    """Where a server answers: ``base`` (``scheme://host:port[/prefix]``, no credentials) and its credentials."""

    base: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def chat_url(self) -> str:
        return self.base + CHAT_PATH

    def auth_headers(self) -> dict[str, str]:
        """The basic-auth header for the URL's credentials ({} without)."""
        if self.user is None:
            return {}
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}


def parse_endpoint(text: str) -> EndpointAddress:
    """``http://host:port``, ``.../v1`` or ``.../v1/chat/completions`` as one :class:`EndpointAddress`."""
    try:
        url = URL(str(text).strip())
    except (TypeError, ValueError) as error:
        raise ValueError(f"not a URL ({error})") from None
    if not url.absolute or url.scheme not in ("http", "https") or not url.host:
        shown = url.with_user(None) if url.absolute else url
        raise ValueError(f"{str(shown)!r} is not an http(s)://host:port URL")
    if url.query_string or url.fragment:
        raise ValueError(f"{url.with_user(None).with_query(None).with_fragment(None)!s} must not carry "
                         "a query or fragment")
    path = url.path.rstrip("/")
    for suffix in (CHAT_PATH, "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    base = url.with_user(None).with_password(None).with_path(path or "/")
    return EndpointAddress(str(base).rstrip("/"), url.user, url.password)


class NoLiveEndpoint(RuntimeError):
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

    def __post_init__(self) -> None:
        self.url = self.address.chat_url
        self.chat_target = URL(self.url)  # parsed once, not per request
        self.headers = self.address.auth_headers()
        self.request_headers = {"Content-Type": "application/json", **self.headers}

    def counts(self) -> dict:
        return {
            "requests": self.requests, "failures": self.failures, "conversations": self.conversations,
            "live": self.live, "taken_out": self.taken_out, "reinstated": self.reinstated,
            "last_error": self.last_error,
        }


@dataclass
class Affinity:
    """The endpoint a conversation is currently on (``None`` before its first request)."""

    endpoint: Endpoint | None = None
    used: set[str] = field(default_factory=set)


class EndpointPool:
    """Live/dead bookkeeping for the endpoints of one run."""

    def __init__(self, addresses: list[EndpointAddress], max_failures: int = 3):
        self.endpoints = [Endpoint(address) for address in addresses]
        self.max_failures = max_failures
        self._tie_break = itertools.count()
        self.all_down_since: float | None = None  # time.monotonic() when the last live endpoint went

    def down_for_s(self) -> float:
        """How long every endpoint has been out (0 while one is live)."""
        return 0.0 if self.all_down_since is None else time.monotonic() - self.all_down_since

    def pick(self, affinity: Affinity) -> Endpoint:
        """The endpoint for this conversation's next request; raises :class:`NoLiveEndpoint`."""
        current = affinity.endpoint
        if current is not None and current.live:
            return current
        live = [endpoint for endpoint in self.endpoints if endpoint.live]
        if not live:
            raise NoLiveEndpoint("no endpoint left: " + "; ".join(
                f"{e.url} taken out after {e.failures} failures (last: {e.last_error})" for e in self.endpoints))
        turn = next(self._tie_break)
        chosen = min(live, key=lambda e: (e.active, (self.endpoints.index(e) - turn) % len(self.endpoints)))
        if current is not None:
            current.active -= 1
        chosen.active += 1
        affinity.endpoint = chosen
        if chosen.url not in affinity.used:
            affinity.used.add(chosen.url)
            chosen.conversations += 1
        return chosen

    def release(self, affinity: Affinity) -> None:
        """The conversation is finished: it no longer loads its endpoint."""
        if affinity.endpoint is not None:
            affinity.endpoint.active -= 1
            affinity.endpoint = None

    def record_success(self, endpoint: Endpoint) -> None:
        endpoint.requests += 1
        endpoint.consecutive_failures = 0

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

    def put_back(self, endpoint: Endpoint) -> None:
        self.all_down_since = None
        endpoint.live = True
        endpoint.consecutive_failures = 0
        endpoint.reinstated += 1

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
