"""`make demo` from a fresh clone: setup, tiny checkpoints, regen on the embedded server, the report."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from launch.server_process import probe_models
from tests.helpers.paths import REPO_ROOT


@pytest.mark.slow
def test_make_demo_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("MINIMIND_TOKENIZER", "VIRTUAL_ENV")}
    result = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = clone / "out" / "demo" / "sample.jsonl"
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    summary = json.loads((clone / "out" / "demo" / "sample.summary.json").read_text())
    assert summary["status"] == "completed" and summary["rows_written"] == len(rows) > 0
    for row in rows:
        assert len(row["input_ids"]) == len(row["loss_mask"])
        start = row["loss_mask"].index(1)
        assert set(row["loss_mask"][:start]) == {0} and set(row["loss_mask"][start:]) == {1}
    assert f"output: {output.relative_to(clone)}" in result.stdout
    assert "generated (loss_mask 1)" in result.stdout
    assert probe_models("http://127.0.0.1:8011") is None  # the embedded server was stopped
