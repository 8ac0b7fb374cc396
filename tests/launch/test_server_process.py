"""launch/server_process.py: readiness is /health (no key) then /v1/models (with $VLLM_API_KEY), against the
stand-in `vllm` on 127.0.0.1; a server that refuses the key is an error, not a server that is still loading."""

from __future__ import annotations

import sys

import pytest

from launch.server_process import (
    ServerStartError,
    probe_health,
    probe_models,
    start_detached,
    stop_process_group,
)
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import free_port, wait_until_answers


@pytest.fixture
def keyed_server(tmp_path, monkeypatch):
    """A stand-in vLLM that wants the key ``sk-right``; yields (base URL, request log)."""
    port, log = free_port(), tmp_path / "requests.jsonl"
    monkeypatch.setenv("VLLM_API_KEY", "sk-right")
    monkeypatch.setenv("STANDIN_VLLM_REQUEST_LOG", str(log))
    process = start_detached([sys.executable, str(REPO_ROOT / "tests" / "helpers" / "standin_vllm_cli.py"), "serve", "org/m",
                              "--port", str(port)], tmp_path / "server.log")
    try:
        wait_until_answers(f"http://127.0.0.1:{port}", process)
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop_process_group(process.pid, grace_s=5, process=process)


def test_health_then_models_with_the_key(keyed_server):
    url, log = keyed_server
    log.write_text("")
    assert probe_health(url) and probe_models(url) == ["org/m"]
    assert log.read_text().splitlines() == ['["/health", null]', '["/health", null]', '["/v1/models", "Bearer sk-right"]']


def test_a_refused_key_is_an_error_naming_it(keyed_server, monkeypatch):
    url, _ = keyed_server
    monkeypatch.setenv("VLLM_API_KEY", "sk-wrong")
    with pytest.raises(ServerStartError, match=f"the server at {url} is up but wants an API key: \\$VLLM_API_KEY is set "
                                               "but refused"):
        probe_models(url)
    monkeypatch.delenv("VLLM_API_KEY")
    with pytest.raises(ServerStartError, match="VLLM_API_KEY is not set"):
        probe_models(url)


def test_nothing_listening_is_not_ready():
    url = f"http://127.0.0.1:{free_port()}"
    assert not probe_health(url) and probe_models(url) is None
