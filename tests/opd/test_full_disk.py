"""A full disk under an opd run (``opd.training.out_dir.checked_run``): the run folder (``metrics.jsonl``, the run log) on a
small tmpfs fills while the SFT trains. The run ends with the two ``error:`` lines, no traceback and no "Logging
error" report; ``metrics.jsonl`` keeps whole lines; once there is room, ``resume=`` continues from the last
checkpoint. (A checkpoint that does not fit: tests/opd/test_checkpoints.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from experiments.recipe.synthetic_task import write_task
from opd.training.checkpoints import load_resume
from tests.helpers.paths import REPO_ROOT, small_tmpfs

HINT = ("error: make room on that disk; a training run continues from its last checkpoint with resume= (the "
        "checkpoints saved before are intact)")


def steps(metrics) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]  # each line whole


def test_a_full_run_folder_ends_the_run_with_two_lines_and_it_resumes(tmp_path, standin_tokenizer_path):
    data = write_task(tmp_path / "task", train=8, heldout=2, seed=0)["files"]["train_demonstrations"]
    out = tmp_path / "out"
    with small_tmpfs(tmp_path / "disk", 32 << 10) as disk:
        def sft(*overrides: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "opd/sft.py", "model=tiny_student", f"tokenizer={standin_tokenizer_path}", f"data={data}",
                 "from_scratch=true", "batch_size=4", "epochs=100000", "device=cpu", "optim.lr_schedule_steps=400",
                 "save_interval=5", f"out_dir={out}", f"hydra.run.dir={disk / 'run'}", *overrides],
                cwd=REPO_ROOT, capture_output=True, text=True)

        full = sft("max_steps=400")
        assert full.returncode == 1, full.stderr[-3000:]
        assert "Traceback" not in full.stderr and "Logging error" not in full.stderr, full.stderr[-3000:]
        lines = [line for line in full.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 2 and lines[1] == HINT, full.stderr[-3000:]
        assert re.fullmatch(rf"error: no space left on device for {re.escape(str(disk))}/run/\S+: the write needs \d+ "
                            r"bytes free, \d+ bytes are free", lines[0]), lines
        logged = steps(disk / "run" / "metrics.jsonl")
        assert logged == list(range(1, len(logged) + 1)) and 5 <= len(logged) < 400
        resume = out / "agent_sft_64_resume.pth"
        saved = load_resume(resume)["step"]
        assert saved == len(logged) // 5 * 5
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        resumed = sft(f"resume={resume}", f"max_steps={saved + 2}")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert steps(disk / "run" / "metrics.jsonl") == [*logged, saved + 1, saved + 2]
