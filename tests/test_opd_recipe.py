"""The CPU recipe end to end at tiny sizes (slow: every stage is a real subprocess), and its stage skipping."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

TINY = ["data.train=40", "data.heldout=10", "teacher.sft_steps=3", "student.sft_steps=2", "distill.steps=2",
        "teacher.hidden_size=64", "teacher.num_hidden_layers=2", "student.hidden_size=64",
        "student.num_hidden_layers=2", "distill.max_gen_len=8", "evaluation.max_gen_len=8", "evaluation.batch_size=5"]


@pytest.mark.slow
def test_recipe_runs_every_stage_then_skips_them(tmp_path, tokenizer_path):
    command = [sys.executable, "opd/recipe.py", f"tokenizer={tokenizer_path}", f"out_dir={tmp_path}", *TINY]
    first = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "recipe_summary.json").read_text())
    assert list(summary["stage_wall_s"]) == ["data", "teacher", "student", "opd", "offline", "evaluate"]
    assert [c["name"] for c in summary["evaluation"]] == ["student", "teacher", "opd", "offline"]
    assert (tmp_path / "eval" / "evaluation.png").is_file() and summary["reused_stages"] == []
    assert len(list((tmp_path / "teacher_rollouts").glob("*.jsonl"))) == 1
    again = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "recipe_summary.json").read_text())["reused_stages"] == list(summary["stage_wall_s"])
    changed = subprocess.run([*command, "student.sft_steps=3"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=600)
    assert changed.returncode == 0, changed.stderr[-3000:]
    # the student reran, so everything reading its weights reran too
    assert json.loads((tmp_path / "recipe_summary.json").read_text())["reused_stages"] == ["data", "teacher"]
