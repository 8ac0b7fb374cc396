"""The fixed-data baseline (mode=offline in opd/train.py): its step accounting, exact resume, and the teacher-rollout
cache (opd/rollouts/teacher_rollouts.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from common.chat_records import RecordError
from common.resume_signature import ResumeRefusedError
from experiments.recipe.synthetic_task import write_task
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import demonstration_episode, load_demonstrations
from opd.train import train
from opd.training.checkpoints import load_resume
from opd.training.data_order import DataOrder
from tests.helpers.configs import entry_config


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("offline")
    task = write_task(root / "task", train=6, heldout=2, seed=1)
    base = [
        *tiny_pair, "batch_size=2", "rollout.max_turns=2", "rollout.max_gen_len=5",
        "rollout.max_total_len=2048", "optim.learning_rate=1e-3", "device=cpu", "mode=offline", "epochs=2",
    ]
    return {"root": root, "base": base, **task["files"]}


def config(workspace, out: str, *overrides: str):
    return entry_config("opd", [*workspace["base"], f"out_dir={workspace['root'] / out}", *overrides])


def metrics(workspace, out: str) -> list[dict]:
    return [json.loads(line) for line in (workspace["root"] / out / "metrics.jsonl").read_text().splitlines()]


def final_weights(workspace, out: str) -> dict:
    return load_resume(workspace["root"] / out / "agent_opd_64_resume.pth")["model"]


def assert_same_weights(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for key, tensor in first.items():
        assert torch.equal(tensor, second[key]), key


def straight_and_split(workspace, name: str, *overrides: str):
    """4 steps in one run, and 2 steps + resume + 2 steps (each half with its own cache folder)."""
    straight = train(config(workspace, f"{name}-straight", *overrides, f"offline.cache_dir={workspace['root']}/{name}-c1",
                          "max_steps=4"))
    train(config(workspace, f"{name}-split", *overrides, f"offline.cache_dir={workspace['root']}/{name}-c2",
               "max_steps=2", "optim.lr_schedule_steps=4"))
    resume = workspace["root"] / f"{name}-split" / "agent_opd_64_resume.pth"
    resumed = train(config(workspace, f"{name}-split", *overrides, f"offline.cache_dir={workspace['root']}/{name}-c2",
                         "max_steps=4", "optim.lr_schedule_steps=4", f"resume={resume}"))
    return straight, resumed


def test_dataset_turns_train_exactly_their_assistant_tokens_and_resume_exactly(workspace, tokenizer):
    data = workspace["train_demonstrations"]
    straight, resumed = straight_and_split(workspace, "dataset", f"data={data}", "offline.source=dataset")
    assert (straight["steps"], resumed["steps"], resumed["steps_this_run"]) == (4, 4, 2)
    assert_same_weights(final_weights(workspace, "dataset-straight"), final_weights(workspace, "dataset-split"))
    # each step trained on exactly the demonstrations' assistant tokens, in the trainer's data order
    demonstrations, _ = load_demonstrations(data)
    chat_format = ChatFormat(tokenizer)
    episodes = [demonstration_episode(d, chat_format) for d in demonstrations]
    order = DataOrder(6, batch_size=2, accumulation_steps=1, epochs=2, seed=42, max_steps=None)
    windows = [order.order(epoch)[start:start + 2] for epoch in (0, 1) for start in (0, 2, 4)][:4]
    steps = metrics(workspace, "dataset-straight")
    expected = [sum(episodes[i].assistant_tokens for i in window) for window in windows]
    assert [m["assistant_tokens"] for m in steps] == [m["target_tokens"] for m in steps] == expected
    assert [m["mean_turns"] for m in steps] == [sum(len(episodes[i].turns) for i in w) / 2 for w in windows]
    assert all("data_s" in m and "rollout_s" not in m for m in steps)
    assert [m["loss"] for m in steps] == [m["loss"] for m in metrics(workspace, "dataset-split")]


def test_teacher_rollouts_are_generated_once_cached_and_resume_exactly(workspace):
    prompts = workspace["train_prompts"]
    straight, resumed = straight_and_split(workspace, "teacher", f"data={prompts}")
    assert_same_weights(final_weights(workspace, "teacher-straight"), final_weights(workspace, "teacher-split"))
    caches = {name: list((workspace["root"] / name).glob("*.jsonl")) for name in ("teacher-c1", "teacher-c2")}
    assert all(len(files) == 1 for files in caches.values())
    lines = {name: files[0].read_text().splitlines() for name, files in caches.items()}
    header = json.loads(lines["teacher-c1"][0])
    assert header["format"] == "opd-teacher-rollouts/1" and header["key"]["sampling.temperature"] == 1.0
    # 4 steps of 2 records over 6 records: every record but the 2 of step 6 onward is rolled out, once
    episodes = {name: {row["index"]: row for row in map(json.loads, rows[1:])} for name, rows in lines.items()}
    order = DataOrder(6, batch_size=2, accumulation_steps=1, epochs=2, seed=42, max_steps=None)
    used = set(order.order(0)) | set(order.order(1)[:2])
    assert set(episodes["teacher-c1"]) == set(episodes["teacher-c2"]) == used
    assert len(lines["teacher-c1"]) == 1 + len(used)  # nothing generated twice
    assert episodes["teacher-c1"] == episodes["teacher-c2"]  # per-record seeds: same episodes however batched
    assert all(len(row["ids"]) > row["prompt_length"] for row in episodes["teacher-c1"].values())
    # a later run with the same producer only reads the cache
    before = caches["teacher-c1"][0].read_bytes()
    again = train(config(workspace, "teacher-again", f"data={prompts}",
                       f"offline.cache_dir={workspace['root']}/teacher-c1", "max_steps=4"))
    assert caches["teacher-c1"][0].read_bytes() == before
    assert again["final_loss"] == straight["final_loss"]


def test_cache_is_keyed_by_its_producer_and_survives_a_torn_line(workspace):
    prompts, cache_dir = workspace["train_prompts"], workspace["root"] / "keyed"
    train(config(workspace, "keyed-a", f"data={prompts}", f"offline.cache_dir={cache_dir}", "max_steps=1"))
    train(config(workspace, "keyed-b", f"data={prompts}", f"offline.cache_dir={cache_dir}", "max_steps=1",
               "sampling.temperature=0"))
    files = sorted(cache_dir.glob("*.jsonl"), key=lambda path: path.stat().st_mtime)
    assert len(files) == 2
    greedy = files[1]
    rows = greedy.read_text().splitlines()
    greedy.write_text("\n".join(rows[:-1]) + "\n" + rows[-1][: len(rows[-1]) // 2])  # killed mid-write
    train(config(workspace, "keyed-c", f"data={prompts}", f"offline.cache_dir={cache_dir}", "max_steps=1",
               "sampling.temperature=0"))
    assert greedy.read_text().splitlines() == rows  # the torn episode was cut off and rolled out again
    greedy.write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError, match="not a teacher-rollout cache for these settings"):
        train(config(workspace, "keyed-d", f"data={prompts}", f"offline.cache_dir={cache_dir}", "max_steps=1",
                   "sampling.temperature=0"))


def test_offline_resume_refuses_another_mode_or_source(workspace):
    data = workspace["train_demonstrations"]
    resume = workspace["root"] / "dataset-split" / "agent_opd_64_resume.pth"
    if not resume.exists():
        train(config(workspace, "dataset-split", f"data={data}", "offline.source=dataset", "max_steps=2",
                   "optim.lr_schedule_steps=4"))
    for override, named in (("mode=on_policy", "mode: saved 'offline', now 'on_policy'"),
                            ("offline.source=teacher_rollouts", "offline.source: saved 'dataset', now 'teacher_rollouts'")):
        with pytest.raises(ResumeRefusedError) as caught:
            train(config(workspace, "refused", f"data={data}", "offline.source=dataset", override, "max_steps=4",
                       "optim.lr_schedule_steps=4", f"resume={resume}"))
        assert named in str(caught.value)


def test_the_dataset_source_leaves_out_demonstrations_over_the_limit_only_when_asked(workspace, tokenizer, caplog):
    data = workspace["train_demonstrations"]
    demonstrations = load_demonstrations(data)[0]
    lengths = [len(demonstration_episode(d, ChatFormat(tokenizer)).ids) for d in demonstrations]
    limit = max(lengths) - 1
    over = [d.record.source for d, length in zip(demonstrations, lengths, strict=True) if length > limit]
    assert 0 < len(over) < len(demonstrations) - 1
    settings = (f"data={data}", "offline.source=dataset", f"rollout.max_total_len={limit}", "epochs=1", "batch_size=1")
    with pytest.raises(RecordError, match=f"{re.escape(over[0])}: the demonstration is {max(lengths)} tokens"):
        train(config(workspace, "too-long", *settings))
    with caplog.at_level("INFO", logger="opd"):
        train(config(workspace, "too-long-left-out", *settings, "offline.drop_too_long=true"))
    assert f"left out {len(over)} of {len(demonstrations)} demonstrations over max_total_len={limit}" in caplog.text
    assert len(metrics(workspace, "too-long-left-out")) == len(demonstrations) - len(over)  # an epoch of the kept


@pytest.mark.parametrize("override,message", [
    ("mode=offpolicy", "mode must be one of on_policy, offline"),
    ("offline.source=web", "offline.source must be one of dataset, teacher_rollouts"),
    ("offline.drop_too_long=true", "offline.drop_too_long must be false with offline.source=teacher_rollouts")])
def test_bad_mode_settings_fail_before_training(workspace, override, message):
    with pytest.raises(ValueError, match=message):
        train(config(workspace, "bad", f"data={workspace['train_prompts']}", override))
