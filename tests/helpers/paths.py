"""Where the repository, its configs and the tokenizer the tests use are."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
FIXTURES = REPO_ROOT / "tests" / "fixtures"
# ``STANDIN_TOKENIZER=1``: every test uses the stand-in tokenizer even where the real one is found (tests/conftest.py).
FORCE_STANDIN = os.environ.get("STANDIN_TOKENIZER") == "1"


def real_tokenizer_path() -> Path | None:
    """The real MiniMind-3 tokenizer: $MINIMIND_TOKENIZER, else ../shared/minimind3-tokenizer, else None (and
    None under ``STANDIN_TOKENIZER=1``)."""
    if FORCE_STANDIN:
        return None
    candidates = [os.environ.get("MINIMIND_TOKENIZER"), str(REPO_ROOT.parent / "shared" / "minimind3-tokenizer")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    return None
