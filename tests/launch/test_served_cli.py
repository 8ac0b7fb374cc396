"""The embedded server as its command runs it (``python -m launch.chat_server``: aiohttp's ``run_app``), where the
in-process tests' ``TestServer`` cannot stand in: it cancels a handler whose client went away on its own."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from common.minimind.tiny import tiny_arch, write_tiny_checkpoints
from tests.helpers.paths import REPO_ROOT

MAX_CONNECTIONS = 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(base: str, path: str):
    with urllib.request.urlopen(f"{base}{path}", timeout=30) as response:
        return json.load(response) if path != "/health" else response.status


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer_path):
    """The tiny teacher served by the real command on a free port; its base URL."""
    folder = tmp_path_factory.mktemp("served")
    checkpoint = write_tiny_checkpoints(folder)["teacher"]
    arch = tiny_arch("teacher")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "launch.chat_server", "--checkpoint", str(checkpoint), "--tokenizer",
         str(tokenizer_path), "--hidden-size", str(arch.hidden_size), "--num-hidden-layers", str(arch.num_hidden_layers),
         "--num-attention-heads", str(arch.num_attention_heads), "--num-key-value-heads",
         str(arch.num_key_value_heads), "--port", str(port), "--max-model-len", "4096", "--threads", "1",
         "--max-connections", str(MAX_CONNECTIONS)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # bounded: 0.1 s a round while it imports torch and loads
        if process.poll() is not None:
            pytest.fail(f"the server exited: {process.stderr.read()[-2000:]}")
        try:
            if get(base, "/health") == 200:
                break
        except OSError:
            time.sleep(0.1)
    yield base
    process.terminate()
    process.wait(timeout=60)


def test_a_client_that_goes_away_takes_its_sequences_out_of_the_batch(served):
    """Before: requests whose sockets were closed kept running (cancelled_requests 0) for minutes, holding the
    batch: aiohttp does not cancel a handler when its client disconnects unless told to."""
    body = json.dumps({"messages": [{"role": "user", "content": "Count."}], "max_tokens": 4000,
                       "ignore_eos": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    port = int(served.rsplit(":", 1)[1])
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    for client in clients:
        client.sendall(request)
    for _ in range(600):  # bounded: until the four are decoding
        if get(served, "/stats")["running"] == 4:
            break
        time.sleep(0.05)
    before = get(served, "/stats")
    assert before["running"] == 4
    for client in clients:
        client.close()
    for _ in range(600):
        stats = get(served, "/stats")
        if stats["running"] == 0:
            break
        time.sleep(0.05)
    assert (stats["running"], stats["cancelled_requests"] - before["cancelled_requests"],
            stats["finished_requests"] - before["finished_requests"]) == (0, 4, 0)


def test_past_max_connections_a_new_connection_gets_503_and_the_server_stays_up(served):
    """Before: 1,100 connections that never sent their body (under ulimit -n 1024) made a normal request time out,
    and the log grew by a traceback per connection."""
    port = int(served.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]  # they send nothing
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as extra:
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert b"too many open connections" in answer
        idle.pop().close()  # one slot frees: a client that finishes its request is served again
        for _ in range(600):  # bounded: until the server has seen that connection close
            try:
                stats = get(served, "/stats")
                break
            except OSError:
                time.sleep(0.05)
        assert (stats["max_connections"], stats["open_connections"]) == (MAX_CONNECTIONS, MAX_CONNECTIONS)
        assert stats["refused_connections"] >= 1
    finally:
        for client in idle:
            client.close()
