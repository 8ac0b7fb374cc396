"""Plain SFT on the synthetic task's demonstrations: the loss falls, resume is exact, checkpoints load, the CLI runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch
from experiments.recipe.synthetic_task import write_task
from opd.sft import train
from opd.training.checkpoints import load_resume
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import run_entry
from tests.helpers.paths import REPO_ROOT


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("sft")
    data = write_task(root / "task", train=8, heldout=2, seed=0)["files"]["train_demonstrations"]
    base = ["model=tiny_student", f"tokenizer={tokenizer_path}", f"data={data}", "from_scratch=true",
            "batch_size=4", "epochs=3", "optim.learning_rate=1e-2", "optim.warmup_steps=0", "optim.lr_scheduler=constant", "device=cpu"]
    return {"root": root, "base": base, "data": data}


def config(workspace, out: str, *overrides: str):
    return entry_config("sft", [*workspace["base"], f"out_dir={workspace['root'] / out}", *overrides])


def losses(workspace, out: str) -> list[float]:
    lines = (workspace["root"] / out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["cross_entropy"] for line in lines]


def test_sft_loss_falls_and_resume_is_exact(workspace):
    straight = train(config(workspace, "straight"))
    assert straight["steps"] == 6  # 8 records, batch 4, 3 epochs
    curve = losses(workspace, "straight")
    assert curve[-1] < 0.8 * curve[0] and curve[0] > 5.0  # from ~ln(6400) = 8.8 for a random init
    train(config(workspace, "split", "max_steps=3", "optim.lr_schedule_steps=6"))
    resumed = train(config(workspace, "split", "optim.lr_schedule_steps=6",
                         f"resume={workspace['root'] / 'split' / 'agent_sft_64_resume.pth'}"))
    assert resumed["steps_this_run"] == 3 and losses(workspace, "split") == curve
    first = load_resume(workspace["root"] / "straight" / "agent_sft_64_resume.pth")["model"]
    second = load_resume(workspace["root"] / "split" / "agent_sft_64_resume.pth")["model"]
    assert all(torch.equal(tensor, second[key]) for key, tensor in first.items())
    model = load_native(workspace["root"] / "straight" / "agent_sft_64.pth", tiny_arch("student"))
    assert all(torch.equal(t, first[k].half().float()) for k, t in model.state_dict().items())


def test_sft_continues_from_a_checkpoint(workspace):
    weights = workspace["root"] / "straight" / "agent_sft_64.pth"
    if not weights.exists():
        train(config(workspace, "straight"))
    further = train(config(workspace, "further", "from_scratch=false", f"model.checkpoint={weights}", "max_steps=2"))
    assert losses(workspace, "further")[0] < 0.65 * losses(workspace, "straight")[0]  # trained weights, not a fresh init
    assert further["weights"] == str(workspace["root"] / "further" / "agent_sft_64.pth")


def test_sft_cli(workspace, tmp_path):
    result = subprocess.run(
        [sys.executable, "opd/sft.py", *workspace["base"], f"out_dir={tmp_path / 'out'}",
         f"hydra.run.dir={tmp_path / 'run'}", "max_steps=1", "save_prefix=teacher_sft"],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sft summary" in result.stdout and (tmp_path / "out" / "teacher_sft_64.pth").is_file()
    # tokenizing the demonstrations (seconds per thousand) shows its progress: done of total, time so far, ETA
    demonstrations = len(Path(workspace["data"]).read_text().splitlines())
    assert re.search(rf"demonstrations .* {demonstrations}/{demonstrations} +\d+:\d\d:\d\d \d+:\d\d:\d\d",
                     result.stdout), result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["curves"] == str(tmp_path / "run" / "training_curves.png")
    assert "[opd][INFO] - step 1  loss " in (tmp_path / "run" / "sft.log").read_text()  # Hydra's run log


@pytest.mark.parametrize("prefix", ["../../x", "sub/x", "/tmp/x", ""])
def test_save_prefix_names_files_in_out_dir_only(workspace, tmp_path, prefix):
    """save_prefix=../../x once wrote {out_dir}/../../x_64.pth: a prefix that is no plain name is refused at start."""
    result = run_entry("sft", *workspace["base"], f"out_dir={tmp_path / 'a' / 'b' / 'out'}",
                       f"hydra.run.dir={tmp_path / 'run'}", "max_steps=1", f"save_prefix='{prefix}'")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: save_prefix must be named with letters, digits, '_', '-' and '.' only (it names files in out_dir), "
        f"got {prefix!r}"]
    assert not list(tmp_path.rglob("*.pth"))
