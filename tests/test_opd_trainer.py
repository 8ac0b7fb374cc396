"""The training run: exact CPU continuation, resume refusal, strict-loading checkpoints, settings errors, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from opd.agent_records import RecordError
from opd.checkpoints import ResumeRefusedError, load_resume
from opd.minimind.model import load_native
from opd.minimind.tiny_checkpoints import tiny_arch, write_tiny_checkpoints
from opd.trainer import run
from tests.conftest import CONFIG_DIR, REPO_ROOT
from tests.opd_support import write_agent_data


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("opd-train")
    checkpoints = write_tiny_checkpoints(root / "tiny")
    other_teacher = write_tiny_checkpoints(root / "tiny-other", seed=9)["teacher"]
    data = write_agent_data(root / "agent.jsonl", 5)
    base = [
        "teacher=tiny", "student=tiny", f"data={data}", f"tokenizer={tokenizer_path}",
        f"teacher.checkpoint={checkpoints['teacher']}", f"student.checkpoint={checkpoints['student']}",
        "batch_size=2", "accumulation_steps=2", "epochs=2", "max_turns=2", "max_gen_len=6", "max_total_len=1024",
        "learning_rate=1e-3", "device=cpu",
    ]
    return {"root": root, "base": base, "other_teacher": other_teacher, "data": data, **checkpoints}


def config(workspace, out: str, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="opd", overrides=[*workspace["base"], f"out_dir={workspace['root'] / out}",
                                                     *overrides])


def metrics(workspace, out: str) -> list[dict]:
    lines = (workspace["root"] / out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def straight_and_resumed(workspace):
    """4 steps in one run (2 epochs of a full and a partial window), and 2 + resume + 2 steps."""
    straight = run(config(workspace, "straight"))
    first = run(config(workspace, "split", "max_steps=2", "lr_schedule_steps=4"))
    resume_file = workspace["root"] / "split" / "agent_opd_64_resume.pth"
    midway = load_resume(resume_file)
    resumed = run(config(workspace, "split", f"resume={resume_file}", "lr_schedule_steps=4"))
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
    ("learning_rate=2e-3", "learning_rate: saved 0.001, now 0.002"),
    ("sampling.temperature=0.7", "sampling.temperature: saved 1.0, now 0.7"),
    ("max_gen_len=7", "max_gen_len: saved 6, now 7"),
    ("teacher.checkpoint={other_teacher}", "teacher.checkpoint_sha256: saved"),
    ("lr_schedule_steps=5", "lr_schedule_steps: saved 4, now 5"),
])
def test_resume_with_changed_settings_is_refused(workspace, straight_and_resumed, override, named):
    resume_file = workspace["root"] / "straight" / "agent_opd_64_resume.pth"
    overrides = [f"resume={resume_file}", "max_steps=6", override.format(**workspace)]
    if not override.startswith("lr_schedule_steps"):
        overrides.append("lr_schedule_steps=4")
    with pytest.raises(ResumeRefusedError, match="refusing to resume") as caught:
        run(config(workspace, "refused", *overrides))
    assert named in str(caught.value)
    assert not (workspace["root"] / "refused" / "agent_opd_64.pth").exists()


@pytest.mark.parametrize("override,error,message", [
    ("batch_size=0", ValueError, "batch_size must be an integer >= 1"),
    ("kl_direction=js", ValueError, "kl_direction must be one of"),
    ("lr_scheduler=step", ValueError, "lr_scheduler must be one of"),
    ("sampling.repetition_penalty=1.1", ValueError, "sampling.repetition_penalty not implemented"),
    ("max_total_len=100", ValueError, "agent.jsonl:1: prompt is"),
    ("data={root}/bad.jsonl", RecordError, "bad.jsonl:1: needs a non-empty"),
])
def test_bad_settings_fail_before_training(workspace, override, error, message):
    (workspace["root"] / "bad.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(error, match=message):
        run(config(workspace, "bad", override.format(**workspace)))
    assert not (workspace["root"] / "bad" / "metrics.jsonl").exists()


def test_cli_trains_tiny_models_on_cpu(workspace):
    out, run_dir = workspace["root"] / "cli-out", workspace["root"] / "cli-run"
    overrides = [o for o in workspace["base"] if not o.startswith(("accumulation_steps", "epochs"))]
    result = subprocess.run(
        [sys.executable, "opd/train.py", *overrides, f"out_dir={out}", f"hydra.run.dir={run_dir}", "max_steps=2",
         "save_interval=1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert {"loss", "mean_turns", "tool_calls", "assistant_tokens", "truncated_fraction", "tokens_per_s",
            "lr"} <= lines[0].keys()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and (out / "agent_opd_64.pth").is_file() and (out / "agent_opd_64_resume.pth").is_file()
    assert "opd summary" in result.stdout
