"""Several endpoints: spreading, an endpoint that dies mid-run (a real process exit), every endpoint dying."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from regen.job import run
from tests.conftest import REPO_ROOT
from tests.regen_helpers import read_jsonl, regen_config, write_jsonl


class ServerProcess:
    """``python -m regen.standin_server`` in its own process (so it can crash like a real server)."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "regen.standin_server", "--port", "0", "--max-lifetime-s", "120", *args],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("READY "), line
        self.url = line.split()[1]

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
    summary = run(regen_config(tmp_path, [dying.url, steady.url], data, tokenizer_path, "concurrency=1",
                               "max_retries=4", "endpoint_reprobe_s=5"))
    out = read_jsonl(tmp_path / "out.jsonl")
    # Sequential and deterministic: c0 (2 requests) and c2's first turn on the dying server, then it exits.
    by_conversation = {}
    for row in out:
        by_conversation.setdefault(row["primary_id"], []).append(row["metadata"]["endpoint"])
    assert by_conversation == {
        "c0": [dying.url] * 2, "c1": [steady.url] * 2, "c2": [dying.url, steady.url],
        "c3": [steady.url] * 2, "c4": [steady.url] * 2, "c5": [steady.url] * 2}
    assert read_jsonl(tmp_path / "out.errors.jsonl") == []
    counts = summary["endpoints"]
    assert counts[dying.url]["live"] is False and counts[dying.url]["taken_out"] == 1
    assert counts[dying.url]["requests"] == 3 + counts[dying.url]["failures"]
    assert counts[steady.url]["conversations"] == 5 and counts[dying.url]["conversations"] == 2
    assert counts[steady.url]["failures"] == 0


def test_one_endpoint_killed_mid_run_every_conversation_ends_once(processes, tmp_path, tokenizer_path):
    dying, steady = processes("--die-after", "15", "--latency-ms", "20"), processes("--latency-ms", "20")
    data = write_jsonl(tmp_path / "rows.jsonl", two_turn_rows(40))
    summary = run(regen_config(tmp_path, [dying.url, steady.url], data, tokenizer_path, "concurrency=8",
                               "max_retries=4", "endpoint_reprobe_s=5"))
    out, errors = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")
    rows_per_conversation = Counter(row["primary_id"] for row in out)
    assert set(rows_per_conversation) | {e["id"] for e in errors} == {f"c{i}" for i in range(40)}
    assert not set(rows_per_conversation) & {e["id"] for e in errors}
    assert set(rows_per_conversation.values()) == {2}  # no conversation written twice or in part
    assert sorted(r["id"] for r in out) == sorted(f"{key}_gen{k}" for key in rows_per_conversation for k in (0, 1))
    assert summary["conversations_done"] + summary["conversations_failed"] == 40
    assert summary["endpoints"][dying.url]["live"] is False
    assert summary["endpoints"][dying.url]["requests"] >= 15 and summary["endpoints"][steady.url]["requests"] > 15


def test_all_endpoints_down_ends_in_the_error_file_and_stops(processes, tmp_path, tokenizer_path):
    first, second = processes("--die-after", "2"), processes("--die-after", "2")
    data = write_jsonl(tmp_path / "rows.jsonl", two_turn_rows(30))
    with pytest.raises(RuntimeError, match="every endpoint is down"):
        run(regen_config(tmp_path, [first.url, second.url], data, tokenizer_path, "concurrency=2",
                         "all_endpoints_down_wait_s=0.3"))
    out, errors = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")
    written = {row["primary_id"] for row in out}
    failed = [e["id"] for e in errors]
    assert len(failed) == len(set(failed)) and not written & set(failed)
    assert all("no endpoint left" in e["metadata"]["error"] or "gave up" in e["metadata"]["error"] for e in errors)
    assert len(written) + len(failed) < 30  # unread rows are left for resume, not dumped into the error file
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: RuntimeError: regen stopped early: every endpoint is down")
    assert summary["conversations_failed"] == len(failed)
