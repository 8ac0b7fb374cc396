"""Fixtures of the regen tests: a regen run on rows written for the test (scripted servers: ``serve``, tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.regen_support import read_jsonl, regen_config, write_jsonl


@pytest.fixture
def regen(tmp_path, tokenizer_path):
    """``run(cfg)`` on rows written to tmp_path/rows.jsonl; returns (summary, output rows, error rows)."""
    from regen.job import run

    def go(urls, rows, *overrides):
        data = write_jsonl(tmp_path / "rows.jsonl", rows)
        summary = run(regen_config(tmp_path, urls, data, tokenizer_path, *overrides))
        return summary, read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")

    return go


@pytest.fixture
def regen_failing(tmp_path, tokenizer_path):
    """``regen`` for a run in which no conversation succeeds: it must raise ``NothingSucceededError``; returns
    (the summary file, output rows, error rows)."""
    from regen.job import NothingSucceededError, run

    def go(urls, rows, *overrides):
        data = write_jsonl(tmp_path / "rows.jsonl", rows)
        with pytest.raises(NothingSucceededError, match="no conversation succeeded"):
            run(regen_config(tmp_path, urls, data, tokenizer_path, *overrides))
        summary = json.loads((tmp_path / "out.summary.json").read_text())
        return summary, read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")

    return go
