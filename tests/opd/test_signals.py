"""Ctrl-C and SIGTERM on opd's commands: while one starts (importing Hydra and torch, composing the config), one
line and 130 / 143 (``common.start_up``); once it runs, Ctrl-C is ``error: interrupted`` and 130. Never a
traceback."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from experiments.recipe.synthetic_task import write_task
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import communicate, loaded
from tests.helpers.standin_vllm_cli import wait_until


def start(command: list[str], *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *command, *overrides], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


# command -> a library it maps while it starts: PyYAML's C extension (Hydra being imported, before torch), and for
# the launcher, which imports torch first, torch's first one
STARTING = {"train": (["opd/train.py"], "_yaml"), "sft": (["opd/sft.py"], "_yaml"),
            "evaluate": (["opd/evaluate.py"], "_yaml"),
            "torchrun": (["-m", "opd.torchrun", "--standalone", "--nproc_per_node=2", "opd/train.py"],
                         "libtorch_global_deps")}


@pytest.mark.parametrize("name, signum", [("train", signal.SIGINT), ("train", signal.SIGTERM), ("sft", signal.SIGTERM),
                                          ("evaluate", signal.SIGINT), ("torchrun", signal.SIGINT),
                                          ("torchrun", signal.SIGTERM)])
def test_a_signal_while_a_command_starts_is_one_line_and_130_or_143(tmp_path, name, signum):
    """Without the start-up handler, SIGINT was a ``KeyboardInterrupt`` traceback from inside an import and SIGTERM a
    silent kill; ``python -m opd.torchrun`` starts no worker (torchrun's own handlers come with them)."""
    command, library = STARTING[name]
    process = start(command, f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}")
    wait_until(lambda: loaded(process.pid, library), process, f"{library} is mapped")
    process.send_signal(signum)
    _, stderr = communicate(process)
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert stderr.splitlines() == [f"error: interrupted ({signal.Signals(signum).name}) while starting"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


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
