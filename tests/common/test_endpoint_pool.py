"""Endpoints: the three ways to write one, spreading and sticking, an endpoint that dies mid-run (a real process
exit), every endpoint dying, the probe that puts one back."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
from collections import Counter

import pytest

import common.endpoints.endpoint_pool as endpoint_pool
from common.endpoints.address import parse_endpoint
from common.endpoints.endpoint_pool import Affinity, EndpointPool, NoLiveEndpointError
from regen.job import RunStoppedError, run
from tests.helpers.paths import REPO_ROOT
from tests.helpers.regen_support import read_jsonl, regen_config, write_jsonl
from tests.helpers.standin_vllm_cli import free_port

A, B = "http://a/v1/chat/completions", "http://b/v1/chat/completions"


@pytest.mark.parametrize("written", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1",
                                     "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"])
def test_every_way_to_write_an_endpoint_names_the_same_server(written):
    address = parse_endpoint(written)
    assert (address.base, address.chat_url) == ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/chat/completions")
    assert parse_endpoint("https://gw.example/team/v1").chat_url == "https://gw.example/team/v1/chat/completions"


def test_credentials_in_an_endpoint_are_auth_not_part_of_its_name():
    address = parse_endpoint("http://alice:s3cret@127.0.0.1:8000/v1")
    assert address.chat_url == "http://127.0.0.1:8000/v1/chat/completions"
    assert address.auth_headers() == {"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()}
    assert "s3cret" not in repr(address)
    for bad, message in [("ftp://h", "is not an http"), ("h:80", "is not an http"), ("http://h:1/v1?x=1", "query"),
                         ("http://alice:s3cret@/v1", "not a URL")]:
        with pytest.raises(ValueError, match=message) as caught:
            parse_endpoint(bad)
        assert "s3cret" not in str(caught.value)


def test_pool_spreads_sticks_and_moves_off_a_dead_endpoint():
    pool = EndpointPool([parse_endpoint("http://a"), parse_endpoint("http://b")], max_failures=2)
    conversations = [Affinity() for _ in range(4)]
    picked = [pool.pick(c).url for c in conversations]
    assert sorted(picked) == [A, A, B, B]
    assert pool.pick(conversations[0]).url == picked[0]  # sticky
    a = pool.endpoints[0]
    pool.record_failure(a, "refused", unreachable=True)
    assert a.live
    pool.record_failure(a, "HTTP 503", unreachable=False)  # a server answering with 5xx is not dead
    pool.record_failure(a, "refused", unreachable=True)
    assert not a.live and a.taken_out == 1
    moved = [c for c, url in zip(conversations, picked, strict=True) if url == A]
    assert {pool.pick(c).url for c in moved} == {B}
    assert pool.counts()[B]["conversations"] == 4 and pool.counts()[A]["failures"] == 3
    pool.record_failure(pool.endpoints[1], "reset", unreachable=True)
    pool.record_failure(pool.endpoints[1], "reset", unreachable=True)
    with pytest.raises(NoLiveEndpointError, match="no endpoint left"):
        pool.pick(Affinity())
    pool.put_back(a)
    assert pool.pick(Affinity()).url == A


class ServerProcess:
    """``python -m standins.vllm_server`` in its own process (so it can crash like a real server)."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "standins.vllm_server", "--max-lifetime-s", "120", *args],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("READY "), line
        self.url = line.split()[1]
        self.chat = f"{self.url}/v1/chat/completions"  # how rows and the summary name it

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self.process.stdout.close()


@pytest.fixture
def processes():
    started = []

    def start(*args: str) -> ServerProcess:
        started.append(ServerProcess(*args))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def two_turn_rows(count: int) -> list[dict]:
    return [{"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "user", "content": f"again {i}"}]}
            for i in range(count)]


def test_a_conversation_moves_to_the_other_endpoint_when_its_own_dies(processes, tmp_path, tokenizer_path):
    dying, steady = processes("--die-after", "3"), processes()
    data = write_jsonl(tmp_path / "rows.jsonl", two_turn_rows(6))
    summary = run(regen_config(tmp_path, [dying.chat, steady.chat], data, tokenizer_path, "concurrency=1",
                               "max_retries=4", "endpoint_reprobe_s=5"))
    out = read_jsonl(tmp_path / "out.jsonl")
    # Sequential and deterministic: c0 (2 requests) and c2's first turn on the dying server, then it exits.
    by_conversation = {}
    for row in out:
        by_conversation.setdefault(row["primary_id"], []).append(row["metadata"]["endpoint"])
    assert by_conversation == {
        "c0": [dying.chat] * 2, "c1": [steady.chat] * 2, "c2": [dying.chat, steady.chat],
        "c3": [steady.chat] * 2, "c4": [steady.chat] * 2, "c5": [steady.chat] * 2}
    assert read_jsonl(tmp_path / "out.errors.jsonl") == []
    counts = summary["endpoints"]
    assert counts[dying.chat]["live"] is False and counts[dying.chat]["taken_out"] == 1
    assert counts[dying.chat]["requests"] == 3 + counts[dying.chat]["failures"]
    assert counts[steady.chat]["conversations"] == 5 and counts[dying.chat]["conversations"] == 2
    assert counts[steady.chat]["failures"] == 0


def test_one_endpoint_killed_mid_run_every_conversation_ends_once(processes, tmp_path, tokenizer_path):
    dying, steady = processes("--die-after", "15", "--latency-ms", "20"), processes("--latency-ms", "20")
    data = write_jsonl(tmp_path / "rows.jsonl", two_turn_rows(40))
    summary = run(regen_config(tmp_path, [dying.chat, steady.chat], data, tokenizer_path, "concurrency=8",
                               "max_retries=4", "endpoint_reprobe_s=5"))
    out, errors = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")
    rows_per_conversation = Counter(row["primary_id"] for row in out)
    assert set(rows_per_conversation) | {e["id"] for e in errors} == {f"c{i}" for i in range(40)}
    assert not set(rows_per_conversation) & {e["id"] for e in errors}
    assert set(rows_per_conversation.values()) == {2}  # no conversation written twice or in part
    assert sorted(r["id"] for r in out) == sorted(f"{key}_gen{k}" for key in rows_per_conversation for k in (0, 1))
    assert summary["conversations_done"] + summary["conversations_failed"] == 40
    assert summary["endpoints"][dying.chat]["live"] is False
    assert summary["endpoints"][dying.chat]["requests"] >= 15 and summary["endpoints"][steady.chat]["requests"] > 15


def test_all_endpoints_down_ends_in_the_error_file_and_stops(processes, tmp_path, tokenizer_path):
    first, second = processes("--die-after", "2"), processes("--die-after", "2")
    data = write_jsonl(tmp_path / "rows.jsonl", two_turn_rows(30))
    with pytest.raises(RunStoppedError, match="every endpoint is down"):
        run(regen_config(tmp_path, [first.url, second.url], data, tokenizer_path, "concurrency=2",
                         "all_endpoints_down_wait_s=0.3"))
    out, errors = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")
    written = {row["primary_id"] for row in out}
    failed = [e["id"] for e in errors]
    assert len(failed) == len(set(failed)) and not written & set(failed)
    assert all("no endpoint left" in e["metadata"]["error"] or "gave up" in e["metadata"]["error"] for e in errors)
    assert len(written) + len(failed) < 30  # unread rows are left for resume, not dumped into the error file
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: RunStoppedError: regen stopped early: every endpoint is down")
    assert summary["conversations_failed"] == len(failed)


def test_a_taken_out_endpoint_is_probed_and_put_back(tmp_path, tokenizer_path):
    port = free_port()
    first = ServerProcess("--port", str(port), "--die-after", "2")
    revived = []

    def revive() -> None:  # the server comes back on the same port after it crashed
        first.process.wait(timeout=60)
        revived.append(ServerProcess("--port", str(port)))

    reviver = threading.Thread(target=revive)
    reviver.start()
    try:
        data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(5)])
        summary = run(regen_config(tmp_path, [first.url], data, tokenizer_path, "concurrency=1", "max_retries=1",
                                   "endpoint_max_failures=1", "endpoint_reprobe_s=0.2", "all_endpoints_down_wait_s=60"))
    finally:
        reviver.join(timeout=60)
        for server in [first, *revived]:
            server.stop()
    assert sorted(r["primary_id"] for r in read_jsonl(tmp_path / "out.jsonl")) == [f"p{i}" for i in range(5)]
    counts = summary["endpoints"][first.chat]
    assert (counts["live"], counts["taken_out"], counts["reinstated"]) == (True, 1, 1)


def test_auto_mode_sends_a_new_conversation_where_most_slots_are_free_and_waits_when_none_are():
    async def go():
        pool = EndpointPool([parse_endpoint("http://a"), parse_endpoint("http://b")], concurrency=None, start_limit=1)
        a, b = pool.endpoints
        pool.set_limit(a, 10)
        pool.set_limit(b, 2)
        first = [await pool.claim() for _ in range(4)]
        assert [c.endpoint.url for c in first] == [A, A, A, A]  # a has more free slots though more in flight
        assert (a.active, b.active, a.free, b.free) == (4, 0, 6, 2)
        more = [await pool.claim() for _ in range(8)]
        assert (a.active, b.active) == (10, 2) and {c.endpoint.url for c in more} == {A, B}
        waiting = asyncio.create_task(pool.claim())
        await asyncio.sleep(0)
        assert not waiting.done()  # every slot taken: the next conversation waits
        pool.release(next(c for c in more if c.endpoint is b))
        assert (await waiting).endpoint is b and pool.in_flight == 12
        pool.set_limit(b, 3)
        assert (await pool.claim()).endpoint is b

    asyncio.run(go())


def test_an_endpoints_figures_start_with_its_first_conversation_not_the_servers_start_up(monkeypatch):
    """Made at t=0, the server takes 100 s to start, then one conversation runs 10 s and gets 1,000 tokens:
    1.0 in flight and 100 tok/s (counted from t=0: 0.09 and 9.1). A fake clock, no waiting."""
    now = [0.0]
    monkeypatch.setattr(endpoint_pool.time, "monotonic", lambda: now[0])
    pool = EndpointPool([parse_endpoint("http://a")], max_failures=2, concurrency=None, start_limit=4)
    [endpoint] = pool.endpoints
    assert (endpoint.generation_rate(), endpoint.mean_in_flight()) == (0.0, 0.0)
    now[0] = 100.0
    conversation = Affinity()
    pool.pick(conversation)
    now[0] = 110.0
    pool.record_success(endpoint, 1000)
    counts = pool.counts()[A]
    assert (counts["generation_tokens_per_s"], counts["in_flight_mean"], counts["in_flight_limit_mean"]) == \
        (100.0, 1.0, 4.0)
