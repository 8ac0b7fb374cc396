"""Pytest fixtures of the regen tests (loaded with ``pytest_plugins = ("tests.regen_fixtures",)``)."""

from __future__ import annotations

import pytest

from tests.scripted_vllm_server import ServerThread


@pytest.fixture
def serve():
    """Start scripted servers (``serve(responder, **StandinServer kwargs)``); all are closed afterwards."""
    servers = []

    def start(responder=None, **kwargs) -> ServerThread:
        servers.append(ServerThread(responder, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
