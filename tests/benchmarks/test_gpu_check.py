"""The prepared GPU check runs end to end (on the CPU here, tiny pair) and reports every phase, so it never rots."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu_check import PHASES, main
from common.user_errors import UserError


def test_gpu_check_reports_every_phase(tmp_path, tokenizer_path):
    out = tmp_path / "gpu_check.json"
    results = main(["--device", "cpu", "--dtype", "float32", "--size", "tiny", "--batch-sizes", "2", "--turns", "2",
                    "--gen-len", "64", "--steps", "2", "--peak-tflops", "1", "--tokenizer", str(tokenizer_path),
                    "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    (run,) = results["runs"]
    assert run["batch_size"] == 2 and run["assistant_tokens"] == 2 * 2 * 64  # one timed step, 2 episodes, 2 turns
    assert set(run["tokens_per_s"]) == set(PHASES) and all(v > 0 for v in run["tokens_per_s"].values())
    assert run["model_flops"] > 0 and 0 < run["mfu"] and run["peak_gpu_memory_gib"] is None


def test_gpu_check_needs_a_timed_step():
    with pytest.raises(UserError, match="--steps must be at least 2"):
        main(["--device", "cpu", "--dtype", "float32", "--steps", "1"])
