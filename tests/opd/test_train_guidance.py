"""opd/train.py with a guided behaviour policy and the JSD loss: plain OPD reproduced, the teacher's share logged,
exact resume after kill -9, resume refused when the policy changes, settings checked at start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch
from common.resume_signature import ResumeRefusedError
from opd.config import LossConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import demonstration_episode, load_demonstrations
from opd.episodes.episode import pack_episodes
from opd.train import train
from opd.training.checkpoints import load_resume
from opd.training.loss import token_divergence
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import entry_command, entry_env, run_entry, write_agent_data
from tests.helpers.paths import REPO_ROOT

OPTIONS = {"turn_share": ["guidance.turn_share=0.9", "guidance.turn_share_final=0.1"],
           "token_mix": ["guidance.token_mix=0.3"],
           "top_k": ["guidance.top_k=20", "loss.kl_direction=jsd", "loss.jsd_beta=0.3"]}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_pair, tiny_checkpoints):
    root = tmp_path_factory.mktemp("opd-guided")
    checkpoints = tiny_checkpoints
    data = write_agent_data(root / "agent.jsonl", 6)
    base = [*tiny_pair, f"data={data}",
            "batch_size=2", "accumulation_steps=2", "epochs=2", "rollout.max_turns=2", "rollout.max_gen_len=8",
            "rollout.max_total_len=1024", "optim.learning_rate=1e-3", "device=cpu"]
    return {"root": root, "base": base, "data": data, **checkpoints}


def run(workspace, out: str, *overrides: str) -> list[dict]:
    """Train in this process; returns the per-step metrics."""
    train(entry_config("opd", [*workspace["base"], f"out_dir={workspace['root'] / out}", *overrides]))
    return [json.loads(line) for line in (workspace["root"] / out / "metrics.jsonl").read_text().splitlines()]


def weights(workspace, out: str) -> dict:
    return load_resume(workspace["root"] / out / "agent_opd_64_resume.pth")["model"]


def test_a_policy_that_never_lets_the_teacher_write_trains_as_plain_opd(workspace):
    """token_mix=0: the same episodes bit for bit; the loss reads the teacher logits its rollout kept instead of a
    second teacher forward, equal up to the float sums' order (the decode loop's incremental forward)."""
    plain, guided = run(workspace, "plain"), run(workspace, "mix0", "guidance.token_mix=0")
    for a, b in zip(plain, guided, strict=True):
        assert (a["assistant_tokens"], a["target_tokens"], a["tool_calls"], a["episodes"]) == (
            b["assistant_tokens"], b["target_tokens"], b["tool_calls"], b["episodes"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["teacher_token_share"] == b["teacher_token_share"] == 0.0
    first, second = weights(workspace, "plain"), weights(workspace, "mix0")
    assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-5


def test_the_teachers_share_of_the_tokens_is_logged_every_step(workspace):
    everything = run(workspace, "mix1", "guidance.token_mix=1")
    assert [m["teacher_token_share"] for m in everything] == [1.0] * 4
    decaying = run(workspace, "decay", *OPTIONS["turn_share"], "rollout.max_gen_len=4")
    shares = [m["teacher_token_share"] for m in decaying]
    assert shares[0] > shares[-1] and all(0 <= share <= 1 for share in shares)
    assert [m["turn_share"] for m in decaying] == pytest.approx([0.9, 0.9 - 0.8 / 3, 0.1 + 0.8 / 3, 0.1])  # scheduled
    assert "turn_share" not in everything[0]
    mixed = run(workspace, "mixture", "mixture.teacher_share=0.5", "guidance.token_mix=0")
    for step in mixed:  # half of every micro-batch is the teacher's own cached episodes, the rest the student's
        assert 0 < step["teacher_token_share"] < 1


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_killed_and_resumed_guided_run_is_bit_identical_to_a_straight_one(workspace, option):
    """The straight run and the resumed one run in this process, the killed one in its own; all on one thread, so
    the three compute alike to the bit."""
    common = ["max_steps=6", "save_interval=1", "epochs=3", *OPTIONS[option]]
    straight, killed = workspace["root"] / f"{option}-straight", workspace["root"] / f"{option}-killed"

    def arguments(out, *extra):
        return [*workspace["base"], *common, f"out_dir={out}", f"hydra.run.dir={out / 'run'}", *extra]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as entry_env() sets for the killed run
    try:
        done = run_entry("train", *arguments(straight))
        assert done.returncode == 0, done.stderr[-3000:]
        process = subprocess.Popen(entry_command("train", *arguments(killed)), cwd=REPO_ROOT, env=entry_env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = killed / "run" / "metrics.jsonl"
        while not log.is_file() or len(log.read_text().splitlines()) < 2:  # a hang ends at pytest's timeout
            assert process.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        resume = killed / "agent_opd_64_resume.pth"
        assert 1 <= load_resume(resume)["step"] < 6  # killed mid-run
        done = run_entry("train", *arguments(killed, f"resume={resume}"))
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        torch.set_num_threads(threads)
    final_straight, final_resumed = load_resume(straight / "agent_opd_64_resume.pth"), load_resume(resume)
    assert final_resumed["step"] == 6
    assert all(torch.equal(final_straight["model"][k], v) for k, v in final_resumed["model"].items())


def test_resume_with_another_policy_is_refused(workspace):
    run(workspace, "policy", "max_steps=2", "optim.lr_schedule_steps=4", "guidance.token_mix=0.3")
    resume = workspace["root"] / "policy" / "agent_opd_64_resume.pth"
    for changed, named in (("guidance.token_mix=0.5", "guidance.token_mix: saved 0.3, now 0.5"),
                           ("loss.kl_direction=jsd", "loss.kl_direction: saved 'forward_kl', now 'jsd'")):
        with pytest.raises(ResumeRefusedError, match=named):
            run(workspace, "policy", f"resume={resume}", "optim.lr_schedule_steps=4", "guidance.token_mix=0.3", changed)


def test_the_jsd_step_minimizes_the_mean_jsd_over_every_target(workspace, tokenizer):
    """Fixed sequences (the data file's answers): the first step's loss is the mean JSD(0.3) of the two models'
    full forwards over every target token."""
    steps = run(workspace, "jsd", "mode=offline", "offline.source=dataset", "epochs=1", "batch_size=6",
                "accumulation_steps=1", "loss.kl_direction=jsd", "loss.jsd_beta=0.3", "loss.temperature=2.0")
    chat_format = ChatFormat(tokenizer)
    episodes = [demonstration_episode(d, chat_format) for d in load_demonstrations(workspace["data"])[0]]
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    logits = []
    for role in ("student", "teacher"):
        model = load_native(workspace[role], tiny_arch(role)).eval()
        with torch.no_grad():
            logits.append(model(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1][
                packed.target_mask])
    expected = token_divergence(*logits, LossConfig("jsd", 2.0, 0.3)).mean().item()
    assert steps[0]["loss"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("override,shown", [
    (["guidance.token_mix=0.2", "guidance.top_k=3"],
     "error: set at most one of guidance.turn_share, guidance.token_mix and guidance.top_k (got guidance.token_mix=0.2, "
     "guidance.top_k=3)"),
    (["mode=offline", "guidance.top_k=3"],
     "error: guidance must be off (null keys) with mode=offline (it steers on-policy rollouts), got {'top_k': 3}"),
    (["guidance.top_k=7000"], "error: guidance.top_k=7000 exceeds the vocabulary (6400 tokens)"),
    (["loss.kl_direction=jsd", "loss.jsd_beta=1"],
     "error: loss.jsd_beta must be in (0, 1) (the limits are loss.kl_direction=forward_kl and reverse_kl), got 1.0"),
])
def test_bad_guidance_settings_are_one_error_line(workspace, tmp_path, override, shown):
    result = run_entry("train", *workspace["base"], f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}",
                       *override)
    assert result.returncode == 1 and result.stderr.splitlines()[0] == shown, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
