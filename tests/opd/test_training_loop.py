"""opd/training/loop.py, the loop every recipe runs: accumulated micro-batches update as one batch of the whole window
(an empty share joining with a zero loss), the metrics line names the recipe's loss and figures, the resume signature
holds the loop's settings and the recipe's, and a run is claimed before it is fitted."""

from __future__ import annotations

import json

import pytest
import torch

from common.minimind.precision import resolve_precision
from experiments.recipe.synthetic_task import write_task
from opd.config import OptimConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import demonstration_episode, load_demonstrations
from opd.episodes.episode import pack_episodes
from opd.training.checkpoints import load_resume
from opd.training.data_order import Window
from opd.training.distributed import Ranks
from opd.training.loop import Learner, Recipe, TrainingRun
from opd.training.loss import TargetLogits, sft_loss_step
from opd.training.optimization import Optimization
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import tiny_model

CPU = resolve_precision("cpu", "float32")


@pytest.fixture(scope="module")
def task(tmp_path_factory, tokenizer, tokenizer_path):
    root = tmp_path_factory.mktemp("training-loop")
    data = write_task(root / "task", train=6, heldout=2, seed=0)["files"]["train_demonstrations"]
    chat_format = ChatFormat(tokenizer)
    demonstrations, _ = load_demonstrations(data)
    episodes = [demonstration_episode(demonstration, chat_format, 2048) for demonstration in demonstrations]
    return {"root": root, "data": data, "chat_format": chat_format, "episodes": episodes, "tokenizer": tokenizer_path}


def cross_entropy(forward, episodes, batch):
    return sft_loss_step(forward, episodes, batch, CPU)


class KeptGradients(Optimization):
    """The optimizer of these tests, keeping the accumulated gradients each step clipped and applied."""

    def step(self) -> float:
        self.gradients = [parameter.grad.clone() for parameter in self.parameters]
        return super().step()


def learner() -> Learner:
    model = tiny_model(seed=3)
    settings = OptimConfig(learning_rate=1e-2, weight_decay=0.0, lr_scheduler="constant", warmup_steps=0,
                           lr_schedule_steps=None, grad_clip=1.0)
    return Learner(TargetLogits(model), KeptGradients(model, settings, 4, CPU), Ranks(), torch.device("cpu"))


def test_micro_batches_accumulate_to_the_gradient_of_the_whole_window(task):
    episodes, pad = task["episodes"][:4], task["chat_format"].pad_token_id
    whole = learner()
    one = whole.update([episodes], cross_entropy, pad)
    split = learner()
    # uneven micro-batches and an empty one (a rank's share of a short micro-batch), which joins with a zero loss
    accumulated = split.update([episodes[:1], episodes[1:3], [], episodes[3:]], cross_entropy, pad)
    assert accumulated.targets == one.targets == pack_episodes(episodes, pad).target_count
    assert accumulated.loss == pytest.approx(one.loss, rel=1e-5) and accumulated.aux == one.aux == 0.0
    assert accumulated.grad_norm == pytest.approx(one.grad_norm, rel=1e-5) and accumulated.lr == one.lr
    for a, b in zip(whole.optimization.gradients, split.optimization.gradients, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-8)
    assert all(parameter.grad is None for parameter in split.optimization.parameters)  # cleared after the step


class Probe(Recipe):
    """Fine-tuning on fixed episodes, with a figure of its own and a timed collection."""

    name, loss_name, collect_time = "probe", "probe_loss", "data_s"

    def __init__(self, chat_format: ChatFormat, episodes: list) -> None:
        self.chat_format, self.episodes = chat_format, episodes

    def collect(self, window: Window, stop) -> list[list]:
        return [[self.episodes[i] for i in batch] for batch in window.batches]

    def loss(self, forward, episodes, batch):
        return cross_entropy(forward, episodes, batch)

    def metrics(self, step: int) -> dict:
        return {"probe_step": step * 10}


def test_a_run_logs_the_recipe_s_names_saves_and_summarizes(task):
    out = task["root"] / "run"
    cfg = entry_config("sft", ["model=tiny_student", f"tokenizer={task['tokenizer']}", f"data={task['data']}",
                               "device=cpu", "batch_size=2", "accumulation_steps=2", "epochs=2", "max_steps=3",
                               "save_interval=2", f"out_dir={out}"])
    run = TrainingRun(cfg)
    model = tiny_model(seed=1)
    order = run.data_order(len(task["episodes"]))
    signature = run.signature(order, {"probe": True}, models={"model": model}, fingerprints={"data.sha256": "abc"})
    assert signature["lr_schedule_steps"] == order.total_steps == 3 and "optim.lr_schedule_steps" not in signature
    assert {"seed", "batch_size", "accumulation_steps", "world_size", "dtype", "optim.learning_rate", "probe",
            "model.hidden_size", "data.sha256"} <= signature.keys()
    with pytest.raises(RuntimeError, match="claim"):
        run.fit(model, order, Probe(task["chat_format"], task["episodes"]))
    run.claim(model, "probe", signature)
    summary = run.fit(model, order, Probe(task["chat_format"], task["episodes"]), summary={"extra": 1})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3] and [row["probe_step"] for row in rows] == [10, 20, 30]
    assert all({"probe_loss", "data_s", "update_s", "elapsed_s", "aux_loss"} <= row.keys() for row in rows)
    assert [row["episodes"] for row in rows] == [4, 2, 4]  # 6 records: a full window, the epoch's partial one, ...
    assert summary["steps"] == 3 and summary["extra"] == 1 and summary["episodes_per_rank"] == [10]
    saved = load_resume(out / "probe_64_resume.pth")
    assert saved["step"] == 3 and saved["signature"] == signature and saved["rng"][0]["sampler"] is None
    assert json.loads((out / "probe_64_summary.json").read_text())["final_loss"] == rows[-1]["probe_loss"]
