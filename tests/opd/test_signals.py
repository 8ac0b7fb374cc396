"""Ctrl-C on an opd command once it runs: ``error: interrupted`` and 130, no traceback (while it starts:
tests/common/test_start_up.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

from experiments.recipe.synthetic_task import write_task
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import communicate
from tests.helpers.standin_vllm_cli import wait_until


def start(command: list[str], *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *command, *overrides], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_ctrl_c_while_a_command_runs_is_error_interrupted_and_130(tmp_path, tokenizer_path):
    """After its start-up an entry no longer says "while starting": the job's own Ctrl-C line."""
    data = write_task(tmp_path / "task", train=8, heldout=2, seed=0)["files"]["train_demonstrations"]
    out = tmp_path / "out"
    process = start(["opd/sft.py"], "model=tiny_student", f"tokenizer={tokenizer_path}", f"data={data}", "from_scratch=true",
                    "batch_size=4", "epochs=100000", "device=cpu", f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}")
    metrics = tmp_path / "run" / "metrics.jsonl"
    wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2,
               process, "the SFT's second step is logged")
    process.send_signal(signal.SIGINT)
    _, stderr = communicate(process)
    assert process.returncode == 130, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error:")] == ["error: interrupted"], stderr
    assert "Traceback" not in stderr
