"""The evaluate CLI end to end: two checkpoints, each in its own process, the table, the JSON report and the chart."""

from __future__ import annotations

import json
import subprocess
import sys

from opd.minimind.tiny_checkpoints import tiny_arch, write_tiny_checkpoints
from opd.synthetic_task import write_task
from tests.conftest import REPO_ROOT


def model_override(name: str, checkpoint, role: str) -> str:
    arch = tiny_arch(role)
    return (f"+models.{name}={{checkpoint: '{checkpoint}', hidden_size: {arch.hidden_size}, "
            f"num_hidden_layers: {arch.num_hidden_layers}, num_attention_heads: {arch.num_attention_heads}, "
            f"num_key_value_heads: {arch.num_key_value_heads}}}")


def test_evaluate_cli_compares_checkpoints(tmp_path, tokenizer_path):
    checkpoints = write_tiny_checkpoints(tmp_path / "tiny")
    data = write_task(tmp_path / "task", train=5, heldout=4, seed=4)["files"]["heldout_prompts"]
    out = tmp_path / "eval"
    result = subprocess.run(
        [sys.executable, "opd/evaluate.py", f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={out}",
         f"hydra.run.dir={tmp_path / 'run'}", "max_gen_len=8", "max_turns=2", "batch_size=2", "device=cpu",
         model_override("small", checkpoints["student"], "student"),
         model_override("large", checkpoints["teacher"], "teacher")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "evaluation.json").read_text())
    assert [c["name"] for c in report["checkpoints"]] == ["small", "large"]
    assert report["records"] == 4 and report["settings"]["sampling"]["temperature"] == 0.0
    assert report["settings"]["isolate"] is True
    for checkpoint in report["checkpoints"]:
        assert checkpoint["episodes"] == 4 and 0.0 <= checkpoint["accuracy"] <= 1.0
        assert checkpoint["peak_memory_kind"] == "process_peak_rss"
        assert checkpoint["peak_memory_mb"] >= checkpoint["baseline_rss_mb"] > 0
        assert checkpoint["mean_assistant_tokens"] > 0 and checkpoint["wall_s"] > 0
        assert len((out / f"episodes_{checkpoint['name']}.jsonl").read_text().splitlines()) == 4
    assert (out / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "evaluation" in result.stdout and "small" in result.stdout and "large" in result.stdout


def test_evaluate_cli_refuses_an_empty_model_list(tmp_path, tokenizer_path):
    result = subprocess.run(
        [sys.executable, "opd/evaluate.py", "data=x.jsonl", "models={}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "models is empty" in result.stderr
