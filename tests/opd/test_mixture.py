"""GKD's mixture in opd/train.py (mixture.teacher_share): the teacher's cached episodes take that share of every
on-policy micro-batch, the student rolls out the rest; the run resumes exactly; bad settings are refused."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.recipe.synthetic_task import write_task
from opd.train import train
from opd.training.checkpoints import load_resume
from opd.training.data_order import DataOrder, teacher_count
from tests.helpers.configs import entry_config


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("mixture")
    prompts = write_task(root / "task", train=8, heldout=2, seed=1)["files"]["train_prompts"]
    base = [*tiny_pair, f"data={prompts}",
            "batch_size=4", "rollout.max_turns=2", "rollout.max_gen_len=5", "rollout.max_total_len=2048",
            "optim.learning_rate=1e-3", "device=cpu", "mode=on_policy", "mixture.teacher_share=0.5"]
    return root, base


def run(workspace, out: str, *overrides: str) -> dict:
    root, base = workspace
    return train(entry_config("opd", [*base, f"out_dir={root / out}", f"offline.cache_dir={root / out}-cache",
                                      *overrides]))


def test_teacher_count_rounds_the_share_down():
    assert [teacher_count(list(range(n)), 0.5) for n in (1, 2, 3, 8)] == [0, 1, 1, 4]
    assert teacher_count(list(range(100)), 0.29) == 29 and teacher_count(list(range(8)), 0.0) == 0


def test_the_teacher_takes_its_share_of_every_micro_batch_and_the_run_resumes_exactly(workspace):
    root, _ = workspace
    run(workspace, "straight")  # one epoch: 8 records, 2 steps of 4
    steps = [json.loads(line) for line in (root / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [step["episodes"] for step in steps] == [4, 4]
    cache, = (root / "straight-cache").glob("*.jsonl")
    cached = {json.loads(line)["index"] for line in cache.read_text().splitlines()[1:]}
    order = DataOrder(8, batch_size=4, accumulation_steps=1, epochs=1, seed=42, max_steps=None)
    first_halves = [index for window in order.windows() for batch in window.batches for index in batch[:2]]
    assert len(first_halves) == 4 and cached == set(first_halves)  # the teacher's half of each step, nothing else
    run(workspace, "split", "max_steps=1", "optim.lr_schedule_steps=2")
    run(workspace, "split", "max_steps=2", "optim.lr_schedule_steps=2",
        f"resume={root / 'split' / 'agent_opd_64_resume.pth'}")
    straight = load_resume(root / "straight" / "agent_opd_64_resume.pth")["model"]
    split = load_resume(root / "split" / "agent_opd_64_resume.pth")["model"]
    assert all(torch.equal(straight[key], split[key]) for key in straight)
    with pytest.raises(ValueError, match="mixture.teacher_share: saved 0.5, now 0.25"):
        run(workspace, "split", "max_steps=2", "optim.lr_schedule_steps=2", "mixture.teacher_share=0.25",
            f"resume={root / 'split' / 'agent_opd_64_resume.pth'}")


@pytest.mark.parametrize("overrides,message", [
    (["mixture.teacher_share=1.0"], r"mixture.teacher_share must be in \[0, 1\)"),
    (["mode=offline"], "mixture.teacher_share must be 0 with mode=offline")])
def test_bad_mixture_settings_fail_before_training(workspace, overrides, message):
    with pytest.raises(ValueError, match=message):
        run(workspace, "bad", *overrides)
