"""A run's status must say what happened: ``max_tokens`` above the served model's ``max_model_len`` is refused
before any request (vLLM would answer every one with HTTP 400), a run in which no conversation succeeded
exits non-zero with its own status, and the end-of-run lines put the failures first. Replies and listings
are vLLM's own (``tests/fixtures/vllm/``, recorded by ``make test-vllm``)."""

from __future__ import annotations

import json
import os

import pytest

from common.config_schema import ConfigError
from regen.main import main
from regen.settings import RegenSettings
from standins.vllm_server import Reply
from tests.helpers.configs import compose_config
from tests.helpers.entries import run_main
from tests.helpers.paths import REPO_ROOT
from tests.helpers.regen_support import EOS, Script, ok, read_jsonl, write_jsonl
from tests.vllm_live.support import FIXTURES

MODELS = json.loads((FIXTURES / "models.json").read_text())  # tiny-qwen3, max_model_len 2048
REFUSED = json.loads((FIXTURES / "error_max_tokens_over_max_model_len.json").read_text())


def test_max_tokens_above_the_listed_max_model_len_is_refused_before_any_request(serve, regen):
    server = serve(model="tiny-qwen3", models=MODELS)
    with pytest.raises(ConfigError) as refused:
        regen([server.url], [{"id": "a", "prompt": "Hi"}], "max_tokens=8192")
    assert str(refused.value) == ("max_tokens=8192 is more than the model's max_model_len=2048 (tiny-qwen3 on the "
                                  "endpoints' /v1/models): the server would refuse every request")
    assert refused.value.hint == ("set max_tokens=2048 or lower (vLLM caps each reply at max_model_len minus its "
                                  "prompt), or serve the model with --max-model-len 8192 or more")
    assert server.requests == []
    summary, out, _ = regen([server.url], [{"id": "a", "prompt": "Hi"}], "max_tokens=2048")  # at the limit: fine
    assert summary["status"] == "completed" and len(out) == 1


def test_max_tokens_above_server_max_model_len_is_refused_before_the_server_starts(tmp_path):
    cfg = compose_config("regen", ["server=vllm", "server.model=org/m", "server.max_model_len=2048",
                                   "dataset=sample", f"output={tmp_path / 'o.jsonl'}"], hydra_config=True)
    with pytest.raises(ConfigError, match="max_tokens=8192 is more than the model's max_model_len=2048 "
                                            r"\(server.max_model_len\)"):
        RegenSettings.from_config(cfg)


def cli(tmp_path, url, rows, *overrides):
    """``python regen/main.py ...`` (inside this process) on a console wide enough that rich wraps no line."""
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    return run_main(main, "dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{url}]",
                    f"output={tmp_path / 'out.jsonl'}", "max_retries=0", f"hydra.run.dir={tmp_path / 'h'}", *overrides,
                    cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "1000"})


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "out.summary.json").read_text())


def test_a_run_where_every_request_fails_exits_1_with_its_own_status(serve, tmp_path, tokenizer_path):
    server = serve(lambda payload: Reply(REFUSED["reply"], status=REFUSED["status"]))  # lists no max_model_len
    result = cli(tmp_path, server.url, [{"id": "a", "prompt": "Hi"}, {"id": "b", "prompt": "Ho"}],
                 f"tokenizer={tokenizer_path}", "concurrency=1")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "regen failed: 0 conversations done, 2 FAILED, 0 truncated; 0 rows" in result.stderr
    first = f"{tmp_path / 'rows.jsonl'}:1: RequestFailedError: HTTP 400 from {server.chat_url}: max_tokens=8192 cannot"
    assert f"first failure: {first}" in result.stderr
    assert "error: no conversation succeeded: 2 failed, 0 input errors; the first: " in result.stderr
    summary = summary_of(tmp_path)
    assert summary["status"].startswith("failed: NothingSucceededError: no conversation succeeded: 2 failed")
    assert (summary["conversations_done"], summary["conversations_failed"]) == (0, 2)
    assert summary["first_failure"].startswith(first)
    assert len(read_jsonl(tmp_path / "out.errors.jsonl")) == 2


def test_some_failures_in_a_completed_run_are_in_its_first_line(serve, tmp_path, tokenizer_path):
    server = serve(Script({"Hi": [ok("fine", [1, 5], [6, EOS])],
                           "Ho": [Reply({"error": {"message": "bad request"}}, status=400)]}))
    result = cli(tmp_path, server.url, [{"id": "a", "prompt": "Hi"}, {"id": "b", "prompt": "Ho"}],
                 f"tokenizer={tokenizer_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "regen completed: 1 conversations done, 1 FAILED, 0 truncated; 1 rows" in result.stderr
    assert (f"first failure: {tmp_path / 'rows.jsonl'}:2: RequestFailedError: HTTP 400 from {server.chat_url}: bad request"
            in result.stderr)
    assert summary_of(tmp_path)["status"] == "completed" and summary_of(tmp_path)["first_failure"].endswith(
        "HTTP 400 from " + server.chat_url + ": bad request")


def test_a_run_of_only_unusable_rows_fails(serve, tmp_path, tokenizer_path):
    server = serve()
    result = cli(tmp_path, server.url, [{"id": "a", "instruction": "no messages"}], f"tokenizer={tokenizer_path}")
    assert result.returncode == 1 and "error: no conversation succeeded: 0 failed, 1 input errors" in result.stderr
    assert server.requests == []


def test_a_resumed_run_with_nothing_left_to_do_completes(serve, tmp_path, tokenizer_path):
    server = serve()
    rows = [{"id": "a", "prompt": "Hi"}]
    assert cli(tmp_path, server.url, rows, f"tokenizer={tokenizer_path}").returncode == 0
    again = cli(tmp_path, server.url, rows, f"tokenizer={tokenizer_path}", "resume=true")
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary_of(tmp_path)["status"] == "completed" and summary_of(tmp_path)["skipped_already_done"] == 1
