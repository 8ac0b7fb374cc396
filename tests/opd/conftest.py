"""Fixtures of the opd tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.minimind.tiny import write_tiny_checkpoints


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The tiny teacher and student of ``configs/model/tiny_*.yaml`` in native MiniMind format, written once per
    session (``{"teacher": path, "student": path}``); tests read them and write elsewhere."""
    return write_tiny_checkpoints(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_pair(tiny_checkpoints, tokenizer_path) -> list[str]:
    """The overrides that make ``opd/train.py`` distil the tiny student from the tiny teacher."""
    return ["teacher=tiny_teacher", "student=tiny_student", f"tokenizer={tokenizer_path}",
            f"teacher.checkpoint={tiny_checkpoints['teacher']}", f"student.checkpoint={tiny_checkpoints['student']}"]
