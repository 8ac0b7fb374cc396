"""Reading a vLLM server's load from its Prometheus ``/metrics`` (text format, one sample per line).

Per engine vLLM exports ``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc`` (older:
``gpu_cache_usage_perc``) and ``vllm:num_preemptions_total``; a :class:`ServerLoad` sums the counts and averages the
KV use. With several API-server processes the gauges are declared without values until an engine first reports:
:func:`parse_load` tells that (:class:`MetricsNotYet`) from a page without vLLM's gauges (:class:`MetricsMissing`).
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
    """The :class:`ServerLoad` in a ``/metrics`` body; raises :class:`MetricsMissing`, :class:`MetricsNotYet`, or
    ``ValueError`` for values that do not add up (a negative or non-finite gauge included)."""
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
    """The server's load now; ``None`` when it did not answer this time. Raises :class:`MetricsMissing` when it
    answers without vLLM metrics (404 included), and what :func:`parse_load` raises."""
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
