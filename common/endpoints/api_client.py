"""POSTing requests (chat completions, or completions) with retries, over the endpoints of an :class:`EndpointPool`.

Retried with jittered backoff or ``Retry-After`` (capped at ``max_backoff_s``): HTTP 408/409/425/429/5xx, connection
errors, timeouts, a non-JSON body. Only connection failures count towards taking an endpoint out; a retry after a
timeout moves at once to another live endpoint. Server text is redacted by ``Secrets``.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import json
import os
import random
import resource
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from common.endpoints.endpoint_pool import Affinity, Endpoint, EndpointPool, NoLiveEndpointError
from common.endpoints.reply_bodies import BodyTooLarge, read_body, read_head
from common.endpoints.secrets import Secrets
from common.user_errors import UserError

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
CONNECT_TIMEOUT_S = 30.0
# No connection within CONNECT_TIMEOUT_S (aiohttp < 3.10 raises its parent class for it).
ConnectTimeout = getattr(aiohttp, "ConnectionTimeoutError", aiohttp.ServerTimeoutError)


class OutOfFileDescriptorsError(UserError):
    """The client process hit its open-files limit: a local limit, not a failing endpoint."""

    def __init__(self, doing: str):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        super().__init__(f"this process ran out of file descriptors (ulimit -n is {soft}) while {doing}",
                         "raise the limit (e.g. ulimit -n 65536) or lower concurrency=")


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is EMFILE / ENFILE."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "errno", None) in (errno.EMFILE, errno.ENFILE):
            return True
        error = getattr(error, "os_error", None) or error.__cause__ or error.__context__
    return False


@dataclass(frozen=True)
class Retries:
    """What retrying one request took: the attempts sent again and the seconds spent backing off before them."""

    count: int = 0
    wait_s: float = 0.0

    def __add__(self, other: Retries) -> Retries:
        return Retries(self.count + other.count, self.wait_s + other.wait_s)


class RequestFailedError(RuntimeError):
    """A request without a usable reply; ``endpoint`` took the last attempt, ``retries`` is what retrying took."""

    def __init__(self, message: str, endpoint: str | None = None, retries: Retries | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.retries = retries or Retries()


@dataclass(frozen=True)
class Reply:
    """What one request came to: the decoded JSON reply, the endpoint URL that gave it, and its retries."""

    data: Any
    endpoint: str
    retries: Retries


class _Retryable(Exception):
    def __init__(self, message: str, retry_after_s: float | None = None, unreachable: bool = False,
                 timed_out: bool = False):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.unreachable = unreachable
        self.timed_out = timed_out


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date), ``None`` if absent/unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: ``max_retries`` after the first attempt, exponential backoff with jitter."""

    max_retries: int = 6
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0

    def delay(self, retry_number: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds before retry ``retry_number`` (1-based): jittered exponential, or the server's Retry-After."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (retry_number - 1))
        backoff = ceiling / 2 + rng.uniform(0, ceiling / 2)
        return backoff if retry_after_s is None else min(self.max_backoff_s, retry_after_s)


def _server_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text[:500]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])[:500]
    return text[:500]


def _completion_tokens(data: Any) -> int:
    """The reply's ``usage.completion_tokens`` (0 if absent), for its endpoint's generation rate."""
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


def client_session(api_key_env: str | None) -> aiohttp.ClientSession:
    """One HTTP session for a run's requests: no connection limit (the pool bounds them), the API key as bearer."""
    headers = {"Authorization": f"Bearer {os.environ[api_key_env]}"} if api_key_env else {}
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), headers=headers)


class ApiClient:
    """Sends requests to the pool's endpoints, keeping the endpoints' counts in the pool; each request ends in a
    :class:`Reply` or :class:`RequestFailedError`, its retries included."""

    def __init__(self, session: aiohttp.ClientSession, pool: EndpointPool, policy: RetryPolicy,
                 request_timeout_s: float, all_down_wait_s: float, *, max_reply_bytes: int, secrets: Secrets,
                 limit_hint: str = "max_reply_mib; by default 8 MiB + 512 bytes per max_tokens",
                 rng: random.Random | None = None):
        self.session = session
        self.limit_hint = limit_hint  # the setting that raises max_reply_bytes, named when a reply passes it
        self.secrets = secrets
        self.max_reply_bytes = max_reply_bytes
        self.pool = pool
        self.policy = policy
        self.all_down_wait_s = all_down_wait_s
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s,
                                             sock_connect=min(CONNECT_TIMEOUT_S, request_timeout_s))
        self.rng = rng or random.Random()

    async def _attempt(self, endpoint: Endpoint, body: bytes, completions: bool) -> Any:
        target = endpoint.completions_target if completions else endpoint.chat_target
        where = str(target)  # the route asked (chat or completions), named in every message
        try:
            async with self.session.post(target, data=body, headers=endpoint.request_headers,
                                         timeout=self.timeout) as reply:
                status = reply.status
                retry_after = reply.headers.get("Retry-After")
                body = await (read_body(reply, self.max_reply_bytes) if status == 200 else read_head(reply))
        except BodyTooLarge as error:
            raise RequestFailedError(f"reply from {where} refused: {error} ({self.limit_hint})",
                                     endpoint.url) from None
        except ConnectTimeout as error:
            raise _Retryable(f"no connection within {self.timeout.sock_connect:g} s ({type(error).__name__})",
                             unreachable=True, timed_out=True) from None
        except asyncio.TimeoutError:  # slow, not dead: a loaded server answers late
            raise _Retryable(f"no complete reply within request_timeout_s={self.timeout.total:g} s",
                             timed_out=True) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as error:
            if out_of_descriptors(error):
                raise OutOfFileDescriptorsError(f"connecting to {where}") from None
            raise _Retryable(self.secrets.redact(f"{type(error).__name__}: {error}".rstrip(": ")),
                             unreachable=True) from None
        if status != 200:
            message = f"HTTP {status} from {where}: {self.secrets.redact(_server_message(body))}"
            if status >= 500 or status in RETRYABLE_STATUSES:
                raise _Retryable(message, parse_retry_after(retry_after))
            raise RequestFailedError(message, endpoint.url)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise _Retryable(f"reply from {where} is not JSON: {self.secrets.redact(repr(body[:200]))}") from None

    @property
    def gave_up_on_endpoints(self) -> bool:
        """Every endpoint has been out for longer than ``all_down_wait_s``."""
        return self.pool.all_down_since is not None and self.pool.down_for_s() >= self.all_down_wait_s

    async def _live_endpoint(self, affinity: Affinity, retries: Retries) -> Endpoint:
        """The endpoint for the next attempt, waiting up to ``all_down_wait_s`` for one to come back."""
        while True:
            try:
                return self.pool.pick(affinity)
            except NoLiveEndpointError as error:
                if self.gave_up_on_endpoints:
                    raise RequestFailedError(f"{error} (waited {self.all_down_wait_s:g} s)", retries=retries) from None
            await asyncio.sleep(min(1.0, max(0.01, self.all_down_wait_s - self.pool.down_for_s())))

    async def complete(self, payload: dict[str, Any], affinity: Affinity, *, completions: bool = False) -> Reply:
        """The :class:`Reply` to ``payload``, sent on the endpoint ``affinity`` holds, to its chat-completions route
        (or with ``completions`` its completions route); raises :class:`RequestFailedError`."""
        try:
            body = orjson.dumps(payload)
        except TypeError as error:  # settings and rows are checked before: a last guard, one error row
            raise RequestFailedError(f"the request cannot be sent as JSON: {error}") from None
        retries = Retries()
        while True:
            endpoint = await self._live_endpoint(affinity, retries)
            try:
                data = await self._attempt(endpoint, body, completions)
            except RequestFailedError as error:
                self.pool.record_failure(endpoint, str(error), unreachable=False)
                error.retries = retries
                raise
            except _Retryable as error:
                self.pool.record_failure(endpoint, str(error), unreachable=error.unreachable)
                if retries.count >= self.policy.max_retries:
                    raise RequestFailedError(f"gave up after {retries.count + 1} attempts: {error}", endpoint.url,
                                        retries) from None
                # taken out, or timed out with another endpoint live: go to another endpoint now, no wait
                moved = not endpoint.live or (error.timed_out and self.pool.move_away(affinity, endpoint))
                wait = 0.0 if moved else self.policy.delay(retries.count + 1, error.retry_after_s, self.rng)
                retries += Retries(1, wait)
                if not moved:
                    await asyncio.sleep(wait)
                continue
            self.pool.record_success(endpoint, _completion_tokens(data))
            return Reply(data, endpoint.url, retries)
