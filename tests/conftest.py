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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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
    from standins.tokenizer import build_standin_tokenizer

    return build_standin_tokenizer(tmp_path_factory.mktemp("standin-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer_path(standin_tokenizer_path) -> Path:
    """The tokenizer tests use: the real MiniMind-3 one when present, else the stand-in (never a skip)."""
    return real_tokenizer_path() or standin_tokenizer_path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    from common.minimind.tokenizer import load_tokenizer

    return load_tokenizer(str(tokenizer_path))
