"""Where the repository, its configs and the tokenizer the tests use are, and a small tmpfs (a disk that fills)."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

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


@contextmanager
def small_tmpfs(path, size: int, *options: str):
    """A tmpfs of ``size`` bytes mounted at ``path`` for the block (skips where mounting is not permitted)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
                             capture_output=True)
    if mounted.returncode:
        pytest.skip(f"mounting a tmpfs is not permitted here ({mounted.stderr.decode().strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
