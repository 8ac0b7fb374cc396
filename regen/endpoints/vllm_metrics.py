"""Reading a vLLM server's load from its Prometheus endpoint (``GET /metrics``, text exposition format).

vLLM (V1) exports, per engine (labels ``model_name`` and ``engine``; a data-parallel server has one series
per engine): ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (gauges),
``vllm:kv_cache_usage_perc`` (gauge, 0..1; older servers: ``vllm:gpu_cache_usage_perc``) and the counter
``vllm:num_preemptions``, which Prometheus' client exposes as ``vllm:num_preemptions_total``. A
:class:`ServerLoad` sums the counts over engines and averages the KV usage. The format is simple enough
for the small parser here (one sample per line: ``name{label="value",...} value [timestamp]``).

With data parallelism vLLM starts several API-server processes by default (``--api-server-count`` defaults to
the data-parallel size), and each engine's scheduler statistics go to one of them at a time. ``/metrics`` then
comes from ``prometheus_client``'s multiprocess collector, and these gauges are declared with
``multiprocess_mode="mostrecent"``: per engine, the value most recently written by any API-server process. A
series no process has written yet has no sample at all, so until the engines first report (they do once they
run requests) the page declares the gauges (``# TYPE vllm:num_requests_running gauge``) without values.
:func:`parse_load` tells that (:class:`MetricsNotYet`, "read again later") from a page without vLLM's
gauges (:class:`MetricsMissing`).
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from dataclasses import dataclass

import aiohttp

from common.endpoints.reply_bodies import BodyTooLarge, read_body

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current name first
PREEMPTIONS = "vllm:num_preemptions_total"
MAX_PAGE_BYTES = 16 << 20  # a dp=8 server's page is about 200 KB


class MetricsMissing(Exception):
    """The endpoint has no vLLM metrics (no ``/metrics`` route, or one without vLLM's scheduler gauges)."""


class MetricsNotYet(Exception):
    """The page declares vLLM's scheduler gauges without values: no engine has reported to it yet."""


@dataclass(frozen=True)
class ServerLoad:
    """One reading of a server's scheduler: requests running and waiting, KV-cache use, preemptions so far."""

    running: int
    waiting: int
    kv_usage: float
    preemptions: int


def parse_sample(line: str) -> tuple[str, float] | None:
    """``(metric name, value)`` of one exposition line; ``None`` for comments, blank or unreadable lines."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    if brace == -1:
        name, _, rest = line.partition(" ")
    else:
        name, position, quoted = line[:brace], brace + 1, False
        while position < len(line) and (quoted or line[position] != "}"):  # a label value may hold "}"
            if line[position] == "\\":
                position += 1
            elif line[position] == '"':
                quoted = not quoted
            position += 1
        rest = line[position + 1:]
    fields = rest.split()
    try:
        return name.strip(), float(fields[0])
    except (IndexError, ValueError):
        return None


def _checked(values: list[float], name: str) -> list[float]:
    """``values``; a negative or non-finite one makes the whole reading fail (``ValueError``)."""
    for value in values:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} is {value} in /metrics: not a count or share (the reading is skipped)")
    return values


def _count(values: list[float], name: str) -> int:
    total = sum(_checked(values, name))
    if not math.isfinite(total):
        raise ValueError(f"{name} sums to {total} over its {len(values)} series")
    return round(total)


def parse_load(text: str) -> ServerLoad:
    """The :class:`ServerLoad` in a ``/metrics`` body. Raises :class:`MetricsMissing` without vLLM's gauges,
    :class:`MetricsNotYet` when they are declared without values, ``ValueError`` for values that do not add up
    to a count (a negative or non-finite value of a gauge it reads included: that reading fails)."""
    values: dict[str, list[float]] = defaultdict(list)
    declared = False
    for line in text.splitlines():
        sample = parse_sample(line)
        if sample is not None:
            values[sample[0]].append(sample[1])
        elif sample is None and line.startswith(f"# TYPE {RUNNING} "):
            declared = True
    kv_name = next((name for name in KV_USAGE if values.get(name)), None)
    if not values.get(RUNNING) or kv_name is None:
        if declared:
            raise MetricsNotYet(f"/metrics declares {RUNNING} without values (no engine has reported yet)")
        raise MetricsMissing(f"no {RUNNING} or {KV_USAGE[0]} in /metrics")
    kv = _checked(values[kv_name], kv_name)
    kv_usage = sum(kv) / len(kv)
    if not math.isfinite(kv_usage):
        raise ValueError(f"{KV_USAGE[0]} averages to {kv_usage}")
    return ServerLoad(running=_count(values[RUNNING], RUNNING), waiting=_count(values.get(WAITING, []), WAITING),
                      kv_usage=kv_usage, preemptions=_count(values.get(PREEMPTIONS, []), PREEMPTIONS))


async def read_load(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
                    timeout_s: float) -> ServerLoad | None:
    """The server's load now; ``None`` when it did not answer this time (slow, refused, 5xx). Raises
    :class:`MetricsMissing` when it answers without vLLM metrics (404 included), and what :func:`parse_load`
    raises for a page it cannot use this time."""
    try:
        async with session.get(base_url + "/metrics", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status >= 500:
                return None
            if reply.status != 200:
                raise MetricsMissing(f"GET /metrics answered HTTP {reply.status}")
            text = (await read_body(reply, MAX_PAGE_BYTES)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    except BodyTooLarge as error:
        raise ValueError(f"/metrics: {error}") from None
    return parse_load(text)
