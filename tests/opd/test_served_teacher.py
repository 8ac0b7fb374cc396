"""A served teacher (``teacher_server.endpoints``): the scores of a real HTTP server on 127.0.0.1 answering vLLM's
``prompt_logprobs`` from the tiny teacher equal the local teacher's; a run with it trains without loading a teacher;
what a top-k cannot compute is refused; a server's faults are one error naming the record."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from common.config_schema import ConfigError
from common.endpoints.address import parse_endpoint
from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch
from common.user_errors import UserError
from opd.config import TeacherServerConfig
from opd.episodes.episode import TopLogprobs, pack_episodes
from opd.train import train
from opd.training.loss import logits_at_targets
from opd.training.served_teacher import ServedTeacher, TeacherServerError
from standins.teacher_scores import PromptLogprobs
from standins.vllm_server import Reply
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import write_agent_data
from tests.helpers.paths import REPO_ROOT
from tests.opd.test_loss import episodes  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def local_teacher(tiny_checkpoints):
    return load_native(tiny_checkpoints["teacher"], tiny_arch("teacher")).eval().requires_grad_(False)


@pytest.fixture
def teacher_url(serve, local_teacher):
    return serve(completions=PromptLogprobs(local_teacher), model="tiny-teacher").url


def settings(url: str, **overrides):
    from common.endpoints.address import parse_endpoint

    values = {"endpoints": [parse_endpoint(url)], "model": None, "top_logprobs": 20, "api_key_env": None,
              "concurrency": 4, "request_timeout_s": 60.0, "max_retries": 0, **overrides}
    return TeacherServerConfig(**values)


def test_served_scores_equal_the_local_teachers_top_k(teacher_url, local_teacher, tokenizer, episodes):  # noqa: F811
    scorer = ServedTeacher(settings(teacher_url), max_total_len=2048, vocab=6400)
    try:
        scored = scorer.score(episodes)
    finally:
        scorer.close()
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    logits, _ = logits_at_targets(local_teacher, packed)
    labels = packed.input_ids[:, 1:][packed.target_mask]
    expected = TopLogprobs.of_logits(logits, labels, 20)
    served = TopLogprobs.cat([episode.teacher_top for episode in scored])
    assert served.ids.shape == expected.ids.shape == (packed.target_count, 21)
    for row in range(packed.target_count):  # the same ids (the order within a row is the server's)
        got = dict(zip(served.ids[row].tolist(), served.logprobs[row].tolist(), strict=True))
        want = dict(zip(expected.ids[row].tolist(), expected.logprobs[row].tolist(), strict=True))
        assert got.keys() == want.keys()
        assert all(math.isclose(got[i], want[i], abs_tol=1e-5) for i in want if i >= 0)
    torch.testing.assert_close(served.next_token, expected.next_token, atol=1e-5, rtol=0)


@pytest.mark.parametrize("direction", ["reverse_kl", "forward_kl"])
def test_a_run_with_a_served_teacher_trains_without_loading_one(tmp_path, tiny_pair, teacher_url, direction):
    data = write_agent_data(tmp_path / "agent.jsonl", 4)
    cfg = entry_config("opd", [*tiny_pair, f"data={data}", "batch_size=2", "max_steps=2", "rollout.max_turns=2",
                               "rollout.max_gen_len=6", "rollout.max_total_len=1024", "device=cpu",
                               f"out_dir={tmp_path / 'run'}", "teacher.checkpoint=/nowhere/teacher.pth",
                               f"teacher_server.endpoints=[{teacher_url}]", f"loss.kl_direction={direction}"])
    summary = train(cfg)
    assert summary["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(0 < line["teacher_topk_mass"] <= 1 + 1e-5 and math.isfinite(line["kl"]) for line in lines)


class AnswersThen:
    """The first ``answered`` requests scored, then every one hung until ``release()`` (a 500 then), or answered
    with a 500 at once."""

    def __init__(self, scores: PromptLogprobs, answered: int, then: str):
        self.scores, self.answered, self.then, self.calls = scores, answered, then, 0
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def __call__(self, payload: dict):
        self.calls += 1
        if self.calls <= self.answered:
            return self.scores(payload)
        return self._hang() if self.then == "hang" else Reply({"error": {"message": "gone"}}, 500)

    async def _hang(self) -> Reply:
        while not self.released.is_set():
            await asyncio.sleep(0.05)
        return Reply({"error": {"message": "gone"}}, 500)


def served_run(tmp_path, tiny_pair, url: str, name: str, *more: str) -> list[str]:
    data = write_agent_data(tmp_path / "agent.jsonl", 6)
    return [*tiny_pair, f"data={data}", "batch_size=2", "max_steps=3", "rollout.max_turns=2", "rollout.max_gen_len=6",
            "rollout.max_total_len=1024", "device=cpu", f"out_dir={tmp_path / name}", "save_interval=100",
            "teacher.checkpoint=/nowhere/teacher.pth", f"teacher_server.endpoints=[{url}]",
            "teacher_server.max_retries=0", "loss.kl_direction=reverse_kl", *more]


def test_sigterm_while_the_teacher_server_hangs_saves_the_last_step_and_resumes_exactly(tmp_path, tiny_pair, serve,
                                                                                         local_teacher):
    """Issue 67: SIGTERM while a step waited on a hung teacher server left the run alive for minutes (its wait is
    bounded only by request_timeout_s x attempts), and a second Ctrl-C lost every step since the last save."""
    hangs = AnswersThen(PromptLogprobs(local_teacher), answered=2, then="hang")
    hanging = serve(completions=hangs)
    run = subprocess.Popen([sys.executable, "opd/train.py", *served_run(tmp_path, tiny_pair, hanging.url, "stopped")],
                           cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while hanging.server.request_count <= 2:  # step 1 scored (two episodes); step 2 now waits on the server
        assert run.poll() is None, run.communicate()
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=600)  # request_timeout_s (600 s) x attempts otherwise
    hangs.release()
    resume = tmp_path / "stopped" / "agent_opd_64_resume.pth"
    assert run.returncode == 128 + signal.SIGTERM
    assert stderr.strip().splitlines()[-1] == f"error: interrupted (SIGTERM) after step 1 of 3; continue with resume={resume}"
    working = serve(completions=PromptLogprobs(local_teacher)).url
    assert train(entry_config("opd", served_run(tmp_path, tiny_pair, working, "stopped", f"resume={resume}")))[
        "steps"] == 3
    assert train(entry_config("opd", served_run(tmp_path, tiny_pair, working, "whole")))["steps"] == 3
    resumed, whole = (torch.load(tmp_path / name / "agent_opd_64.pth") for name in ("stopped", "whole"))
    assert all(torch.equal(resumed[key], whole[key]) for key in whole)  # the resume continued exactly


def test_a_teacher_server_that_dies_saves_the_last_finished_step(tmp_path, tiny_pair, serve, local_teacher):
    """Issue 67: with save_interval=100, every step before a teacher server's death was lost."""
    dying = serve(completions=AnswersThen(PromptLogprobs(local_teacher), answered=4, then="fail")).url
    with pytest.raises(UserError) as refused:
        train(entry_config("opd", served_run(tmp_path, tiny_pair, dying, "run")))
    resume = tmp_path / "run" / "agent_opd_64_resume.pth"
    assert "the teacher server could not score" in refused.value.message
    assert refused.value.hint.startswith(f"step 2 is saved: continue with resume={resume}")
    assert torch.load(resume, weights_only=True)["step"] == 2


def test_a_resume_against_another_served_model_is_refused(tmp_path, tiny_pair, serve, local_teacher):
    """Issue 67: with teacher_server.model=null the resume file kept null, and a resume after the server switched
    to another model finished with no word. The model the servers answered with is part of the run's signature."""
    data = write_agent_data(tmp_path / "agent.jsonl", 4)
    common = [*tiny_pair, f"data={data}", "batch_size=2", "rollout.max_turns=2", "rollout.max_gen_len=6",
              "rollout.max_total_len=1024", "device=cpu", f"out_dir={tmp_path / 'run'}",
              "teacher.checkpoint=/nowhere/teacher.pth", "save_interval=1"]
    first = serve(completions=PromptLogprobs(local_teacher), model="teacher-a").url
    assert train(entry_config("opd", [*common, "max_steps=2", f"teacher_server.endpoints=[{first}]"]))["steps"] == 2
    other = serve(completions=PromptLogprobs(local_teacher), model="teacher-b").url
    resume = f"resume={tmp_path / 'run' / 'agent_opd_64_resume.pth'}"
    with pytest.raises(UserError) as refused:
        train(entry_config("opd", [*common, "max_steps=2", f"teacher_server.endpoints=[{other}]", resume]))
    assert "teacher_server.served_model: saved 'teacher-a', now 'teacher-b'" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 3  # nothing else differs
    assert train(entry_config("opd", [*common, "max_steps=2", f"teacher_server.endpoints=[{first}]", resume]))[
        "steps"] == 2  # the same model resumes


@pytest.mark.parametrize(("overrides", "message"), [
    (["loss.kl_direction=jsd"], "loss.kl_direction must be forward_kl or reverse_kl with teacher_server.endpoints"),
    (["loss.temperature=2.0"], "loss.temperature must be 1 with teacher_server.endpoints set (vLLM's log-probabilities"),
    (["guidance.token_mix=0.2"], "guidance must be off with teacher_server.endpoints set"),
    (["mixture.teacher_share=0.5"], "mixture.teacher_share must be 0 with teacher_server.endpoints set"),
    (["mode=offline"], "offline.source must be dataset or regen_rows with teacher_server.endpoints set"),
    (["mode=offline", "offline.source=dataset", "loss.kl_direction=reverse_kl"],
     "loss.kl_direction must be forward_kl with mode=offline with teacher_server.endpoints set"),
    (["loss.kl_direction=reverse_kl", "sampling.temperature=0.7"], "sampling must be the student's own distribution"),
    (["teacher_server.endpoints=[ftp://host]"], "teacher_server.endpoints: 'ftp://host' is not an http(s)://host:port URL"),
    (["teacher_server.top_logprobs=0"], "teacher_server.top_logprobs"),
    (["teacher_server.api_key_env=NO_SUCH_KEY_SET"],
     "teacher_server.api_key_env=NO_SUCH_KEY_SET: that environment variable is not set"),
])
def test_what_a_top_k_cannot_compute_is_refused_naming_the_key(tiny_pair, overrides, message):
    served = [] if any(o.startswith("teacher_server.endpoints") for o in overrides) else [
        "teacher_server.endpoints=[http://127.0.0.1:9]"]
    with pytest.raises(ConfigError) as refused:
        entry_config("opd", [*tiny_pair, "data=x.jsonl", *served, *overrides])
    assert message in str(refused.value)


def test_an_unreachable_server_is_one_error_naming_the_key(tiny_pair):
    with pytest.raises(UserError, match=r"no endpoint answers /v1/models: http://127.0.0.1:9") as refused:
        ServedTeacher(settings("http://127.0.0.1:9"), max_total_len=1024, vocab=6400)
    assert refused.value.hint == "start the server, or check teacher_server.endpoints (and teacher_server.api_key_env)"


def test_a_server_too_short_for_the_episodes_is_refused_before_any_compute(serve, local_teacher):
    url = serve(completions=PromptLogprobs(local_teacher), models={"object": "list", "data": [
        {"id": "tiny-teacher", "object": "model", "max_model_len": 512}]}).url
    with pytest.raises(TeacherServerError, match="max_model_len 512 is below rollout.max_total_len=1024"):
        ServedTeacher(settings(url), max_total_len=1024, vocab=6400)


@pytest.mark.parametrize(("answer", "problem"), [
    ({"drop_prompt_id": True}, r"the prompt's own id \d+ is missing \(another tokenizer\?\)"),
    # issue 67: all-zero log-probabilities trained at loss 183, and -1e39 (-inf in float32) ended in a NaN loss
    ({"forged": 0.0}, r"its probabilities sum to \d+, more than 1"),
    ({"forged": -1e39}, r"log-probability -1e\+39 is not a finite float32 at most 0"),
], ids=["no-prompt-id", "zeros", "float32-overflow"])
def test_unusable_scores_are_refused_naming_the_record(serve, local_teacher, episodes, answer, problem):  # noqa: F811
    url = serve(completions=PromptLogprobs(local_teacher, **answer)).url
    scorer = ServedTeacher(settings(url), max_total_len=2048, vocab=6400)
    try:
        with pytest.raises(TeacherServerError, match=r"answered loss.jsonl:1 with unusable prompt_logprobs: position "
                                                      rf"\d+: {problem}"):
            scorer.score(episodes[:1])
    finally:
        scorer.close()


def test_a_dead_endpoint_is_taken_out_and_the_live_one_scores(teacher_url, episodes):  # noqa: F811
    scorer = ServedTeacher(settings(teacher_url, endpoints=[parse_endpoint("http://127.0.0.1:9"),
                                                            parse_endpoint(teacher_url)]), max_total_len=2048,
                           vocab=6400)
    try:
        scored = scorer.score(episodes)
        dead, live = scorer.pool.endpoints
        assert not dead.live and live.live and live.requests == len(episodes)
    finally:
        scorer.close()
    assert all(episode.teacher_top is not None for episode in scored)
