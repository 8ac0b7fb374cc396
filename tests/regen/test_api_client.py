"""The chat client: retries (which statuses, how long, how often), what counts against an endpoint, timeouts
that are slow rather than dead, running out of file descriptors; over real HTTP to a scripted server."""

from __future__ import annotations

import asyncio
import errno
import json
import random
import resource
import subprocess
import sys
from datetime import datetime, timezone
from email.utils import format_datetime

import pytest

from common.endpoints.api_client import OutOfFileDescriptorsError, RetryPolicy, parse_retry_after
from standins.vllm_server import Reply
from tests.helpers.paths import REPO_ROOT
from tests.helpers.regen_support import EOS, Script, ok, write_jsonl


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    assert parse_retry_after(format_datetime(datetime(2026, 1, 1, 12, 0, 7, tzinfo=timezone.utc), usegmt=True), now) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now) == 0.0  # in the past: retry now
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_backoff_doubles_with_jitter_and_follows_retry_after():
    policy = RetryPolicy(max_retries=6, backoff_s=1.0, max_backoff_s=10.0)
    rng = random.Random(0)
    for retry, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (6, 10.0)]:
        delays = [policy.delay(retry, None, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) == 50  # jittered
    assert policy.delay(1, 7.0, rng) == 7.0
    assert policy.delay(1, 99.0, rng) == 10.0  # capped by max_backoff_s



def _fails_then(reply_first: Reply, times: int = 1):
    return [reply_first] * times + [ok("fine", [1, 5], [6, EOS])]


@pytest.mark.parametrize("first", [
    Reply({"error": {"message": "overloaded"}}, status=503),
    Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"}),
    Reply(drop=True),
    Reply(raw=b'{"choices": [tru'),
], ids=["503", "429-retry-after", "dropped-connection", "malformed-json"])
def test_transient_failures_are_retried(serve, regen, first):
    server = serve(Script({"Hi": _fails_then(first)}))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "Hi"}])
    assert [r["id"] for r in out] == ["A_gen0"] and errors == []
    assert (summary["retries"], len(server.requests)) == (1, 2)


def test_retry_after_is_honoured(serve, regen):
    server = serve(Script({"Hi": _fails_then(Reply({"error": {"message": "busy"}}, status=429, headers={"Retry-After": "1"}))}))
    summary, out, _ = regen([server.url], [{"id": "A", "prompt": "Hi"}], "retry_backoff_s=0.001", "max_backoff_s=5")
    assert [r["id"] for r in out] == ["A_gen0"]
    assert (summary["retries"], summary["retry_wait_s"]) == (1, 1.0)  # the server's wait, not the 1 ms backoff


def test_retries_are_bounded(serve, regen_failing):
    server = serve(Script({"Hi": [Reply(raw=b"<html>oops</html>")] * 10}))
    summary, out, errors = regen_failing([server.url], [{"id": "A", "prompt": "Hi"}], "max_retries=2")
    assert out == [] and len(server.requests) == 3
    assert errors[0]["id"] == "A" and "gave up after 3 attempts" in errors[0]["metadata"]["error"]
    assert "is not JSON" in errors[0]["metadata"]["error"]


@pytest.mark.parametrize("reply,message", [
    (Reply({"error": {"message": "tool_choice auto needs --enable-auto-tool-choice"}}, status=400),
     "HTTP 400 from {url}/v1/chat/completions: tool_choice auto needs --enable-auto-tool-choice"),
    (Reply({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}),
     "no prompt_token_ids: the endpoint must support return_token_ids"),
    (ok("", [1, 2], [EOS]), "empty generation"),
], ids=["400", "missing-token-ids", "empty-generation"])
def test_permanent_failures_fail_at_once_with_an_error_row(serve, regen_failing, reply, message):
    server = serve(Script({"Hi": [reply] * 3}))
    summary, out, errors = regen_failing([server.url], [{"id": "A", "prompt": "Hi"}, {"id": "B", "prompt": "Hi"}], "concurrency=1")
    assert out == [] and len(server.requests) == 2  # one request per conversation: no retries
    assert [e["id"] for e in errors] == ["A", "B"]
    meta = errors[0]["metadata"]
    assert message.format(url=server.url) in meta["error"]
    assert (meta["idx"], meta["generations_completed"], meta["endpoint"], meta["stage"]) == (0, 0, server.chat_url,
                                                                                             "generation")
    assert summary["conversations_failed"] == 2 and summary["errors_file_rows"] == 2
    assert summary["status"].startswith("failed: NothingSucceededError: no conversation succeeded: 2 failed")
    assert summary["first_failure"].endswith(meta["error"])



def test_a_slow_reply_is_retried_and_never_takes_the_endpoint_out(serve, regen):
    server = serve(Script({"Hi": [Reply(ok("late", [1, 5], [6, EOS]).body, delay_s=1.5), ok("fine", [1, 5], [7, EOS])]}))
    summary, out, errors = regen([server.url], [{"id": "A", "prompt": "Hi"}], "request_timeout_s=0.3",
                                 "endpoint_max_failures=1", "all_endpoints_down_wait_s=0")
    assert [r["input_ids"] for r in out] == [[1, 5, 7, EOS]] and errors == []
    counts = summary["endpoints"][server.chat_url]
    assert (counts["live"], counts["taken_out"], counts["failures"], summary["retries"]) == (True, 0, 1, 1)
    assert "no complete reply within request_timeout_s=0.3 s" in counts["last_error"]


def test_out_of_file_descriptors_is_a_client_error_with_a_hint(serve, tmp_path, tokenizer_path):
    async def hold(payload):
        await asyncio.sleep(2)  # long enough for the client to open every connection it can
        return ok("x", [1, 5], [6, EOS])

    server = serve(hold)
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(200)])

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    result = subprocess.run(
        [sys.executable, "regen/main.py", "dataset=local", f"dataset.path={data}", "server=external",
         f"server.endpoints=[{server.url}]", f"tokenizer={tokenizer_path}", f"output={tmp_path / 'out.jsonl'}",
         "concurrency=100", "endpoint_max_failures=1", f"hydra.run.dir={tmp_path / 'h'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, preexec_fn=few_files)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines[0].startswith("error: this process ran out of file descriptors (ulimit -n is 48)")
    assert lines[1] == "error: raise the limit (e.g. ulimit -n 65536) or lower concurrency="
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: OutOfFileDescriptorsError")
    assert summary["endpoints"][server.chat_url]["live"] is True  # the endpoint was never blamed


def test_a_retry_after_a_timeout_goes_to_another_live_endpoint(serve, regen):
    """A hung endpoint keeps no conversation: each one there moves on after one timeout, without a backoff, where
    it used to retry there (7 attempts x 1800 s with the defaults) while the healthy endpoint sat idle."""
    hung = serve(lambda payload: Reply(ok("late", [1, 5], [6, EOS]).body, delay_s=3))
    healthy = serve(lambda payload: ok("fine", [1, 5], [7, EOS]))
    rows = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(4)]
    summary, out, errors = regen([hung.url, healthy.url], rows, "request_timeout_s=0.5", "max_retries=1",
                                 "concurrency=2", "retry_backoff_s=30", "max_backoff_s=30")
    assert sorted(r["id"] for r in out) == [f"r{i}_gen0" for i in range(4)] and errors == []
    assert {r["metadata"]["endpoint"] for r in out} == {healthy.chat_url}
    counts = summary["endpoints"]
    assert counts[hung.chat_url]["failures"] == len(hung.requests) == summary["retries"] >= 1
    assert counts[hung.chat_url]["live"] and summary["retry_wait_s"] == 0  # moved at once, never taken out
    assert summary["elapsed_s"] < 20


def test_no_file_descriptor_left_anywhere_in_a_run_is_the_same_error(serve, regen, tmp_path, monkeypatch, caplog):
    """Not only while connecting: out of descriptors while reading the source (or writing) is the same two lines,
    never an OSError traceback; and asyncio's report of such an error that no task awaited prints nothing (the
    run says it already), while any other such report is still printed."""
    from regen.job import unless_out_of_descriptors
    from regen.pipeline import SourceRows

    def exhausted(self, stats):
        yield from ()
        raise OSError(errno.EMFILE, "Too many open files")

    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    monkeypatch.setattr(SourceRows, "eligible", exhausted)
    with pytest.raises(OutOfFileDescriptorsError, match="ran out of file descriptors .* while regenerating conversations"):
        regen([server.url], [{"id": "a", "prompt": "Hi"}])
    assert json.loads((tmp_path / "out.summary.json").read_text())["status"].startswith("failed: OutOfFileDescriptorsError")
    loop = asyncio.new_event_loop()
    try:
        unless_out_of_descriptors(loop, {"message": "Task exception was never retrieved",
                                         "exception": OSError(errno.EMFILE, "Too many open files")})
        assert caplog.records == []
        unless_out_of_descriptors(loop, {"message": "Task exception was never retrieved", "exception": KeyError("x")})
        assert [record.getMessage() for record in caplog.records] == ["Task exception was never retrieved"]
    finally:
        loop.close()


@pytest.mark.parametrize("huge", [
    ok("x" * (3 << 20), [1, 5], [6, EOS]),  # 3 MiB with Content-Length: refused before reading
    Reply(stream_bytes=200 << 20),  # 200 MiB streamed without Content-Length: reading stops at the limit
], ids=["content-length", "streamed"])
def test_a_reply_over_the_limit_fails_its_request_without_being_read_whole(serve, regen, huge):
    """max_reply_mib=1: the conversation fails at once (not retried: the server would send it again), the other
    one is done, and the streaming server could write little more than the limit before the client hung up."""
    server = serve(Script({"huge": [huge], "small": [ok("fine", [1, 5], [6, EOS])]}))
    summary, out, errors = regen([server.url], [{"id": "H", "prompt": "huge"}, {"id": "S", "prompt": "small"}],
                                 "max_reply_mib=1")
    assert [r["id"] for r in out] == ["S_gen0"] and summary["retries"] == 0
    [error] = errors
    assert error["id"] == "H" and "the 1 MiB this run reads (max_reply_mib" in error["metadata"]["error"]
    assert server.server.streamed_bytes < 64 << 20  # the limit plus what the sockets' buffers took


def test_the_default_reply_limit_follows_max_tokens():
    from regen.settings import RegenSettings
    from tests.helpers.configs import compose_config

    def limit(*overrides):
        return RegenSettings.from_config(compose_config("regen", ["dataset=sample", "server.model=m", *overrides])
                                         ).max_reply_bytes

    assert limit() == (8 << 20) + 512 * 8192
    assert limit("max_tokens=100000") == (8 << 20) + 512 * 100000
    assert limit("max_reply_mib=64") == 64 << 20
