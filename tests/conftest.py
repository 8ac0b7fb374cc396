"""Shared fixtures: offline hubs, the MiniMind-3 tokenizer (real when available, else the stand-in).

``STANDIN_TOKENIZER=1`` makes every test use the stand-in even where the real tokenizer is found, as on a new
user's clone with no ``../shared`` beside it (``.ci/run`` runs the suite a second time that way); it also drops
``$MINIMIND_TOKENIZER``, which the configs' default ``tokenizer`` reads.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers.paths import FORCE_STANDIN, real_tokenizer_path
from tests.helpers.regen_support import ServerThread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (``make test`` runs one worker per core) each worker computes on one thread, so the workers
# do not oversubscribe the cores; read by torch when it is first imported, after this file.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
if FORCE_STANDIN:
    os.environ.pop("MINIMIND_TOKENIZER", None)
# A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and an ignored signal stays
# ignored in every child, where neither Python nor bash's trap can handle it: the Ctrl-C tests would see
# processes that cannot be interrupted. A handled signal is reset to the default in each child instead.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def standin_tokenizer_path(tmp_path_factory) -> Path:
    """The MiniMind-shaped stand-in tokenizer, written once per session."""
    from common.minimind.standin_tokenizer import build_standin_tokenizer

    return build_standin_tokenizer(tmp_path_factory.mktemp("standin-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer_path(standin_tokenizer_path) -> Path:
    """The tokenizer tests use: the real MiniMind-3 one when present, else the stand-in (never a skip)."""
    return real_tokenizer_path() or standin_tokenizer_path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    from common.minimind.tokenizer import load_tokenizer

    return load_tokenizer(str(tokenizer_path))


# The tests whose behaviour can depend on which tokenizer is found: those that read ``tokenizer_path`` (or the
# ``tokenizer`` loaded from it), directly or through another fixture. Every other test sees the same inputs with or
# without ``../shared``, so ``make test-standin`` (the stand-in pass of ``.ci/run``) runs only these, marked
# ``uses_tokenizer`` here at collection.
TOKENIZER_FIXTURES = {"tokenizer_path", "tokenizer"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if TOKENIZER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.uses_tokenizer)


@pytest.fixture
def serve():
    """Start scripted vLLM-shaped servers (``serve(responder, **StandinServer kwargs)``); all are closed afterwards."""
    servers = []

    def start(responder=None, **kwargs) -> ServerThread:
        servers.append(ServerThread(responder, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
