"""opd/train.py: the loop's loss and accumulation, exact CPU continuation, resume refusal, checkpoints, errors, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from common.chat_records import RecordError
from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch, write_tiny_checkpoints
from common.resume_signature import ResumeRefusedError
from common.user_errors import UserError
from opd.train import train
from opd.training.checkpoints import load_resume
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import not_a_checkpoint, run_entry, write_agent_data
from tests.helpers.paths import REPO_ROOT, small_tmpfs


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_pair, tiny_checkpoints):
    root = tmp_path_factory.mktemp("opd-train")
    checkpoints = tiny_checkpoints
    other_teacher = write_tiny_checkpoints(root / "tiny-other", seed=9)["teacher"]
    data = write_agent_data(root / "agent.jsonl", 5)
    base = [
        *tiny_pair, f"data={data}",
        "batch_size=2", "accumulation_steps=2", "epochs=2", "rollout.max_turns=2", "rollout.max_gen_len=6", "rollout.max_total_len=1024",
        "optim.learning_rate=1e-3", "device=cpu",
    ]
    return {"root": root, "base": base, "other_teacher": other_teacher, "data": data, **checkpoints}


def config(workspace, out: str, *overrides: str):
    return entry_config("opd", [*workspace["base"], f"out_dir={workspace['root'] / out}", *overrides])


def metrics(workspace, out: str) -> list[dict]:
    lines = (workspace["root"] / out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def straight_and_resumed(workspace):
    """4 steps in one run (2 epochs of a full and a partial window), and 2 + resume + 2 steps."""
    straight = train(config(workspace, "straight"))
    first = train(config(workspace, "split", "max_steps=2", "optim.lr_schedule_steps=4"))
    resume_file = workspace["root"] / "split" / "agent_opd_64_resume.pth"
    midway = load_resume(resume_file)
    resumed = train(config(workspace, "split", f"resume={resume_file}", "optim.lr_schedule_steps=4"))
    return straight, first, midway, resumed


def test_resumed_run_is_bit_identical_to_a_straight_run(workspace, straight_and_resumed):
    straight, first, midway, resumed = straight_and_resumed
    assert (straight["steps"], first["steps"], resumed["steps"], resumed["steps_this_run"]) == (4, 2, 4, 2)
    assert midway["step"] == 2 and midway["cursor"] == {"epoch": 1, "batch": 0}
    final_straight = load_resume(workspace["root"] / "straight" / "agent_opd_64_resume.pth")
    final_resumed = load_resume(workspace["root"] / "split" / "agent_opd_64_resume.pth")
    assert final_straight["cursor"] == final_resumed["cursor"] == {"epoch": 2, "batch": 0}
    assert final_straight["model"].keys() == final_resumed["model"].keys()
    for key, tensor in final_straight["model"].items():
        assert torch.equal(tensor, final_resumed["model"][key]), key
    assert any(not torch.equal(t, midway["model"][k]) for k, t in final_straight["model"].items())
    straight_steps, split_steps = metrics(workspace, "straight"), metrics(workspace, "split")
    assert [m["step"] for m in straight_steps] == [m["step"] for m in split_steps] == [1, 2, 3, 4]
    for a, b in zip(straight_steps, split_steps, strict=True):
        assert (a["loss"], a["assistant_tokens"], a["lr"], a["episodes"]) == (
            b["loss"], b["assistant_tokens"], b["lr"], b["episodes"])
    assert [m["episodes"] for m in straight_steps] == [4, 1, 4, 1]  # full and partial windows per epoch
    assert straight_steps[-1]["lr"] < straight_steps[0]["lr"]  # cosine schedule over 4 steps


def test_checkpoint_loads_strictly_as_minimind_weights(workspace, straight_and_resumed):
    weights = workspace["root"] / "straight" / "agent_opd_64.pth"
    native = torch.load(weights, weights_only=True)
    assert all(t.dtype == torch.float16 for t in native.values())
    assert "lm_head.weight" in native and "model.embed_tokens.weight" in native
    model = load_native(weights, tiny_arch("student"))
    trained = load_resume(workspace["root"] / "straight" / "agent_opd_64_resume.pth")["model"]
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[key].half().float()), key
    summary = json.loads((workspace["root"] / "straight" / "agent_opd_64_summary.json").read_text())
    assert summary["weights"] == str(weights) and summary["steps"] == 4


@pytest.mark.parametrize("override,named", [
    ("optim.learning_rate=2e-3", "learning_rate: saved 0.001, now 0.002"),
    ("sampling.temperature=0.7", "sampling.temperature: saved 1.0, now 0.7"),
    ("rollout.max_gen_len=7", "max_gen_len: saved 6, now 7"),
    ("teacher.checkpoint={other_teacher}", "teacher.checkpoint_sha256: saved"),
    ("optim.lr_schedule_steps=5", "lr_schedule_steps: saved 4, now 5"),
])
def test_resume_with_changed_settings_is_refused(workspace, straight_and_resumed, override, named):
    resume_file = workspace["root"] / "straight" / "agent_opd_64_resume.pth"
    overrides = [f"resume={resume_file}", "max_steps=6", override.format(**workspace)]
    if not override.startswith("optim.lr_schedule_steps"):
        overrides.append("optim.lr_schedule_steps=4")
    with pytest.raises(ResumeRefusedError, match="refusing to resume") as caught:
        train(config(workspace, "refused", *overrides))
    assert named in str(caught.value)
    assert not (workspace["root"] / "refused" / "agent_opd_64.pth").exists()


@pytest.mark.parametrize("override,error,message", [
    ("batch_size=0", ValueError, "batch_size must be an integer >= 1"),
    ("loss.kl_direction=js", ValueError, "loss.kl_direction must be one of forward_kl, reverse_kl"),
    ("optim.lr_scheduler=step", ValueError, "optim.lr_scheduler must be one of"),
    ("sampling.repetition_penalty=1.1", ValueError, "sampling.repetition_penalty: not implemented"),
    ("rollout.max_total_len=100", ValueError, "agent.jsonl:1: prompt is"),
    ("data={root}/bad.jsonl", RecordError, "bad.jsonl:1: needs a non-empty"),
])
def test_bad_settings_fail_before_training(workspace, override, error, message):
    (workspace["root"] / "bad.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(error, match=message):
        train(config(workspace, "bad", override.format(**workspace)))
    assert not (workspace["root"] / "bad" / "metrics.jsonl").exists()


def test_cli_trains_tiny_models_on_cpu(workspace):
    out, run_dir = workspace["root"] / "cli-out", workspace["root"] / "cli-run"
    overrides = [o for o in workspace["base"] if not o.startswith(("accumulation_steps", "epochs"))]
    result = subprocess.run(
        [sys.executable, "opd/train.py", *overrides, f"out_dir={out}", f"hydra.run.dir={run_dir}", "max_steps=2",
         "save_interval=1"],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert {"loss", "mean_turns", "tool_calls", "assistant_tokens", "truncated_fraction", "tokens_per_s",
            "lr"} <= lines[0].keys()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and (out / "agent_opd_64.pth").is_file() and (out / "agent_opd_64_resume.pth").is_file()
    assert "opd summary" in result.stdout


@pytest.mark.parametrize("override,shown", [
    ("batch_size=abc", "error: batch_size must be an integer, got 'abc'"),
    ("rollout.max_turns=0", "error: rollout.max_turns must be an integer >= 1, got 0"),
    ("+rollout.unknown=1", "error: unknown setting rollout.unknown"),
    ("data=/nowhere/agent.jsonl", "error: agent data file not found: /nowhere/agent.jsonl"),
])
def test_cli_user_errors_are_one_error_line_without_traceback(workspace, tmp_path, override, shown):
    result = run_entry("train", *workspace["base"], f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}",
                       override)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.splitlines()[0] == shown and "Traceback" not in result.stderr


def test_cli_a_teacher_checkpoint_that_is_no_checkpoint_is_one_error_line(workspace, tmp_path):
    result = run_entry("train", *workspace["base"], f"teacher.checkpoint={workspace['data']}",
                       f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        not_a_checkpoint("teacher.checkpoint", workspace["data"])], result.stderr[-3000:]


def test_cli_a_full_disk_at_save_time_is_one_error_and_keeps_the_earlier_checkpoint(workspace, tmp_path):
    """A real tmpfs that holds one checkpoint pair and a half: step 1's pair is saved, step 2's resume file does
    not fit (torch's zip writer reports that as a RuntimeError over the OSError)."""
    sizes = train(config(workspace, "pair-size", "max_steps=1"))
    pair = sum(path.stat().st_size for path in (workspace["root"] / "pair-size").glob("agent_opd_64*.pth"))
    assert sizes["steps"] == 1
    with small_tmpfs(tmp_path / "small", pair * 3 // 2) as out:
        result = run_entry("train", *workspace["base"], f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}",
                           "max_steps=2", "save_interval=1")
        resume = out / "agent_opd_64_resume.pth"
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert result.stderr.splitlines() == [
            f"error: cannot save checkpoint {resume}: No space left on device",
            f"error: {resume} and the weights beside it are the last checkpoint, intact: make room and continue with "
            f"resume={resume}"]
        assert sorted(path.name for path in out.iterdir()) == [".lock", "agent_opd_64.pth", "agent_opd_64_resume.pth"]
        assert load_resume(resume)["step"] == 1


def offline_steps(workspace, out: str, *overrides: str) -> list[dict]:
    """Train on the data file's own answers (fixed sequences, no sampling) and return the per-step metrics."""
    train(config(workspace, out, "mode=offline", "offline.source=dataset", "epochs=1", *overrides))
    return metrics(workspace, out)


def hand_kl(workspace, tokenizer, student_path, teacher_path) -> float:
    """Mean forward KL over every target token of the data file's demonstrations, from plain full forwards."""
    from opd.config import LossConfig
    from opd.episodes.chat_format import ChatFormat
    from opd.episodes.demonstrations import demonstration_episode, load_demonstrations
    from opd.episodes.episode import pack_episodes
    from opd.training.loss import token_divergence

    chat_format = ChatFormat(tokenizer)
    episodes = [demonstration_episode(d, chat_format) for d in load_demonstrations(workspace["data"])[0]]
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    logits = []
    for path, role in ((student_path, "student"), (teacher_path, "teacher")):
        model = load_native(path, tiny_arch(role)).eval()
        with torch.no_grad():
            full = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits
        logits.append(full[:, :-1][packed.target_mask])
    return token_divergence(*logits, LossConfig("forward_kl", 1.0, 0.5)).mean().item()


def test_a_step_minimizes_the_mean_kl_over_every_target_of_the_window(workspace, tokenizer):
    steps = offline_steps(workspace, "hand", "batch_size=5", "accumulation_steps=1")
    expected = hand_kl(workspace, tokenizer, workspace["student"], workspace["teacher"])
    assert len(steps) == 1 and steps[0]["loss"] == pytest.approx(expected, rel=1e-5)
    assert steps[0]["kl"] == steps[0]["loss"] and steps[0]["aux_loss"] == 0.0
    assert steps[0]["target_tokens"] == steps[0]["assistant_tokens"] > 0
    trained = load_resume(workspace["root"] / "hand" / "agent_opd_64_resume.pth")["model"]
    start = load_native(workspace["student"], tiny_arch("student")).state_dict()
    assert all(not torch.equal(start[k], v) for k, v in trained.items() if "norm" not in k)


def test_accumulation_weights_micro_batches_by_their_target_tokens(workspace):
    """A window of 4 records as one micro-batch of 4 or two of 2: the same loss and gradient (norm)."""
    whole = offline_steps(workspace, "accum-whole", "batch_size=4", "accumulation_steps=1")
    split = offline_steps(workspace, "accum-split", "batch_size=2", "accumulation_steps=2")
    assert [m["episodes"] for m in whole] == [m["episodes"] for m in split] == [4, 1]
    assert [m["target_tokens"] for m in whole] == [m["target_tokens"] for m in split]
    assert whole[0]["loss"] == pytest.approx(split[0]["loss"], rel=1e-6)
    assert whole[0]["grad_norm"] == pytest.approx(split[0]["grad_norm"], rel=1e-5)


def test_loss_is_zero_when_the_teacher_is_the_student(workspace):
    steps = offline_steps(workspace, "self", "teacher=tiny_student", f"teacher.checkpoint={workspace['student']}",
                          "batch_size=5")
    assert abs(steps[0]["loss"]) < 1e-6 and steps[0]["grad_norm"] < 1e-5


def test_repeated_updates_halve_the_divergence_from_a_confident_teacher(workspace, tmp_path):
    from common.minimind.model import save_native

    teacher = load_native(workspace["teacher"], tiny_arch("teacher"))
    with torch.no_grad():
        teacher.model.norm.weight.mul_(30.0)  # sharp next-token distributions: a large initial KL
    confident = save_native(teacher, tmp_path / "confident.pth")
    steps = offline_steps(workspace, "confident", f"teacher.checkpoint={confident}", "batch_size=5", "epochs=15",
                          "optim.learning_rate=1e-2", "optim.lr_scheduler=constant", "optim.weight_decay=0")
    assert len(steps) == 15 and steps[-1]["loss"] < 0.5 * steps[0]["loss"], [m["loss"] for m in steps]


def test_a_new_run_refuses_an_out_dir_holding_checkpoints(workspace, straight_and_resumed):
    out = workspace["root"] / "straight"
    before = (out / "agent_opd_64.pth").read_bytes()
    with pytest.raises(UserError, match="already holds checkpoints: .*agent_opd_64.pth.*overwrite=true"):
        train(config(workspace, "straight", "max_steps=1"))
    assert (out / "agent_opd_64.pth").read_bytes() == before
    other = workspace["root"] / "split" / "agent_opd_64_resume.pth"  # resuming another run into this folder
    with pytest.raises(UserError, match="already holds another run's checkpoints"):
        train(config(workspace, "straight", f"resume={other}", "optim.lr_schedule_steps=4", "max_steps=5"))
    replaced = train(config(workspace, "overwritten", "max_steps=1"))
    again = train(config(workspace, "overwritten", "max_steps=1", "overwrite=true"))
    assert replaced["final_loss"] == again["final_loss"]


def test_kept_step_weights_are_the_weights_of_each_save(workspace, straight_and_resumed):
    """keep_saved_weights: one run leaves every save's weights (a learning curve), the last one the final weights;
    the step-2 file holds exactly the weights a run stopped at step 2 wrote."""
    train(config(workspace, "kept", "save_interval=2", "keep_saved_weights=true", "optim.lr_schedule_steps=4"))
    out = workspace["root"] / "kept"
    assert sorted(path.name for path in out.glob("agent_opd_64_step*.pth")) == ["agent_opd_64_step2.pth",
                                                                             "agent_opd_64_step4.pth"]
    assert (out / "agent_opd_64_step4.pth").read_bytes() == (out / "agent_opd_64.pth").read_bytes()
    train(config(workspace, "two-steps", "max_steps=2", "optim.lr_schedule_steps=4"))
    first_two = workspace["root"] / "two-steps"
    assert (out / "agent_opd_64_step2.pth").read_bytes() == (first_two / "agent_opd_64.pth").read_bytes()
    assert not list(first_two.glob("*_step*.pth"))  # off by default
    elapsed = [m["elapsed_s"] for m in metrics(workspace, "kept")]
    assert len(elapsed) == 4 and all(0 < a < b for a, b in zip(elapsed, elapsed[1:], strict=False))
    for name in ("agent_opd_64.pth", "agent_opd_64_resume.pth"):
        (out / name).unlink()
    with pytest.raises(UserError, match="already holds checkpoints: .*agent_opd_64_step2.pth"):
        train(config(workspace, "kept", "max_steps=1"))


def test_gradient_checkpointing_changes_memory_not_the_update(workspace):
    """Recomputing activations in the backward (no prefix sharing then) gives the same loss and gradient."""
    plain = offline_steps(workspace, "no-checkpointing", "batch_size=5")
    recomputed = offline_steps(workspace, "checkpointing", "batch_size=5", "gradient_checkpointing=true")
    assert recomputed[0]["loss"] == pytest.approx(plain[0]["loss"], rel=1e-5)  # no shared prefix: another sum order
    assert recomputed[0]["grad_norm"] == pytest.approx(plain[0]["grad_norm"], rel=1e-5)
    first, second = (load_resume(workspace["root"] / out / "agent_opd_64_resume.pth")["model"]
                     for out in ("no-checkpointing", "checkpointing"))
    # Adam moves every weight by about lr (1e-3) on its first step; the two runs agree far below that
    assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-4
