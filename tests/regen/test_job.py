"""regen end to end: ``run(cfg)`` against a scripted vLLM-dialect server on 127.0.0.1 (exact ids, masks, rows),
resume, one run per output, the manifest check, credentials that never reach a file, file permissions."""

from __future__ import annotations

import json
import os

import pytest

from common.config_schema import ConfigError
from common.endpoints.served_models import EndpointsUnusableError
from common.user_errors import UserError
from regen.conversations.detokenizer import TokenizerMismatchError
from regen.job import run
from standins.vllm_server import Reply
from tests.helpers.regen_support import EOS, Script, ok, read_jsonl, regen_config, write_jsonl


def test_single_and_multi_turn_rows_are_exact(serve, regen, tokenizer, tmp_path):
    script = Script({
        "Hi": [ok("Hello!", [1, 300, 301, 2], [400, 401, EOS])],
        "Q1": [ok("A1", [1, 310, 2, 1, 311], [410, EOS]),
               ok("A2", [1, 310, 2, 1, 311, 410, EOS, 1, 312], [420, 421, 422, EOS], finish_reason="stop")],
        "Only": [ok("Done", [1, 320], [430, EOS])],
    })
    server = serve(script, model="org/Target-1B")
    rows = [
        {"id": "A", "prompt": "Hi"},
        {"id": "B", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Q1"},
                                      {"from": "gpt", "value": "OLD1"}, {"from": "human", "value": "Q2"},
                                      {"from": "gpt", "value": "OLD2"}]},
        {"messages": [{"role": "user", "content": "Only"}, {"role": "assistant", "content": "OLD"}]},
    ]
    summary, out, errors = regen([server.url], rows, "concurrency=1")
    hashed = next(r["primary_id"] for r in out if r["primary_id"].startswith("hash_"))
    assert [r["id"] for r in out] == ["A_gen0", "B_gen0", "B_gen1", f"{hashed}_gen0"]
    b1 = out[2]
    assert b1["input_ids"] == [1, 310, 2, 1, 311, 410, EOS, 1, 312, 420, 421, 422, EOS]
    assert b1["loss_mask"] == [0] * 9 + [1] * 4
    assert b1["text"] == tokenizer.decode(b1["input_ids"], skip_special_tokens=False)
    assert b1["metadata"] == {
        "idx": 1, "finish_reason": "stop", "is_tool_call": False,
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13, "prompt_tokens_details": None},
        "endpoint": server.chat_url, "sampling_params": {}, "num_generations": 2}
    assert out[0]["loss_mask"] == [0, 0, 0, 0, 1, 1, 1] and out[3]["metadata"]["idx"] == 2
    first, second = script.seen["Q1"]
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}]
    assert second["messages"][2:] == [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    assert all(p["model"] == "org/Target-1B" and p["return_token_ids"] is True and p["max_tokens"] == 8192
               and "tools" not in p for p in server.requests)
    assert errors == []
    assert (summary["conversations_done"], summary["rows_written"], summary["requests"], summary["status"]) == (3, 4, 4, "completed")
    assert summary["endpoints"][server.chat_url]["conversations"] == 3
    written = json.loads((tmp_path / "out.summary.json").read_text())
    assert written["rows_written"] == 4 and written["model"] == "org/Target-1B"


def test_sampling_and_extra_params_are_merged_never_override(serve, regen):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}))
    summary, out, _ = regen([server.url], [{"id": "A", "prompt": "Hi"}], "sampling=qwen3_thinking",
                            "sampling.seed=3", "+extra_request_params={chat_template_kwargs: {enable_thinking: false}}",
                            "max_tokens=77")
    payload = server.requests[0]
    expected = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 3,
                "chat_template_kwargs": {"enable_thinking": False}}
    assert {k: v for k, v in payload.items() if k not in ("model", "messages", "max_tokens", "return_token_ids")} == expected
    assert payload["max_tokens"] == 77
    assert out[0]["metadata"]["sampling_params"] == expected == summary["sampling_params"]


def test_resume_skips_done_retries_failed_and_repairs_a_torn_tail(serve, regen, tmp_path):
    rows = [{"id": name, "prompt": name} for name in ("a", "b", "c", "d")]
    flaky = {"a": [ok("A", [1, 5], [6, EOS])], "b": [Reply({"error": {"message": "no"}}, status=400)],
             "c": [ok("C", [1, 5], [7, EOS])], "d": [ok("D", [1, 5], [8, EOS])]}
    first = serve(Script(flaky))
    summary, out, errors = regen([first.url], rows)
    assert sorted(r["id"] for r in out) == ["a_gen0", "c_gen0", "d_gen0"] and [e["id"] for e in errors] == ["b"]
    output = tmp_path / "out.jsonl"
    lines = output.read_text().splitlines(keepends=True)
    torn_id = json.loads(lines[-1])["primary_id"]
    output.write_text("".join(lines[:-1]) + lines[-1][:40])  # kill -9 in the middle of the last write

    with pytest.raises(UserError, match="exists from an earlier run") as refused:
        regen([first.url], rows)
    assert refused.value.hint.startswith("pass resume=true to continue it")

    second = serve(lambda payload: ok("again", [1, 5], [9, EOS]))
    summary, out, errors = regen([second.url], rows, "resume=true")
    assert sorted(r["primary_id"] for r in out) == ["a", "b", "c", "d"]  # each exactly once
    assert sorted(p["messages"][0]["content"] for p in second.requests) == sorted(["b", torn_id])
    assert errors == []  # b succeeded this time: it no longer counts as failed
    assert (summary["skipped_already_done"], summary["recovered_from_errors"], summary["errors_file_rows"]) == (2, 1, 0)
    assert summary["resume_dropped_bytes"] == 40


def test_resume_removes_blocks_a_second_run_appended(serve, regen, tmp_path):
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    rows = [{"id": name, "prompt": name} for name in ("a", "b", "c")]
    regen([server.url], rows)
    output = tmp_path / "out.jsonl"
    first = output.read_text()
    output.write_text(first + first.splitlines(keepends=True)[1] + first)  # two runs once shared this file
    summary, out, _ = regen([server.url], rows, "resume=true")
    assert output.read_text() == first and len(server.requests) == 3
    assert (summary["resume_removed_duplicate_blocks"], summary["resume_removed_duplicate_rows"]) == (4, 4)
    assert (summary["skipped_already_done"], summary["conversations_done"]) == (3, 0)


def test_rows_after_a_resume_that_removed_duplicates_land_in_the_output(serve, regen, tmp_path):
    """Removing duplicate blocks rewrites the output as a new file; the run's appender was opened on the old one, so
    the conversations regenerated after it went to a deleted file, unseen (now caught as OutputGoneError, and reopened)."""
    failing = {"c"}  # c fails in the first run and is regenerated by the resume

    def answer(payload):
        if payload["messages"][-1]["content"] in failing:
            return Reply({"error": {"message": "not now"}}, status=400)
        return ok("x", [1, 5], [6, EOS])

    server = serve(answer)
    rows = [{"id": name, "prompt": name} for name in ("a", "b", "c")]
    regen([server.url], rows)
    output = tmp_path / "out.jsonl"
    first = output.read_text()
    output.write_text(first + first)
    failing.clear()
    summary, out, _ = regen([server.url], rows, "resume=true")
    assert summary["status"] == "completed" and summary["resume_removed_duplicate_blocks"] == 2
    assert [row["id"] for row in out] == ["a_gen0", "b_gen0", "c_gen0"]


def test_model_is_detected_and_checked(serve, regen):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model="served/name")
    with pytest.raises(EndpointsUnusableError, match=r"server.model='other' is not served by the endpoints \(they serve 'served/name'\)"):
        regen([server.url], [{"prompt": "Hi"}], "server.model=other")
    summary, _, _ = regen([server.url], [{"prompt": "Hi"}], "server.model=served/name")
    assert summary["model"] == "served/name"


def test_a_model_id_with_control_characters_cannot_forge_a_console_line(serve, tmp_path, tokenizer_path,
                                                                                   capsys):
    """Issue 67: a served model id ``line1\nerror: forged line`` printed a fake ``error:`` line in a run that ended
    well (a path holding a newline the same: ``common.run_log.printable`` writes both)."""
    from regen.job import run

    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model="line1\nerror: forged line\x1b[2K")
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Hi"}])
    summary = run(regen_config(tmp_path, [server.url], data, tokenizer_path))
    assert summary["model"] == "line1\nerror: forged line\x1b[2K"  # kept as served in the files
    said = capsys.readouterr()
    lines = (said.out + said.err).splitlines()
    assert not any(line.startswith("error:") for line in lines) and "\x1b" not in said.out + said.err
    assert any("line1\\nerror: forged line\\x1b[2K" in line for line in lines)  # shown, escaped


def test_a_model_id_holding_the_api_key_is_named_redacted(serve, regen, monkeypatch):
    """Before: the endpoints' model list went into the error as the server sent it."""
    monkeypatch.setenv("REGEN_TEST_KEY", "sk-secret-123")
    server = serve(Script({}), model="org/sk-secret-123")
    with pytest.raises(EndpointsUnusableError) as refused:
        regen([server.url], [{"prompt": "Hi"}], "server.model=other", "api_key_env=REGEN_TEST_KEY")
    assert str(refused.value).endswith("(they serve 'org/[redacted]')")


def test_api_key_is_sent_but_never_written(serve, regen, tmp_path, monkeypatch):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}))
    monkeypatch.setenv("REGEN_TEST_KEY", "sk-secret-123")
    regen([server.url], [{"id": "A", "prompt": "Hi"}], "api_key_env=REGEN_TEST_KEY")
    assert server.server.authorizations == ["Bearer sk-secret-123", "Bearer sk-secret-123"]  # /v1/models, chat
    for name in ("out.jsonl", "out.summary.json"):
        assert "sk-secret" not in (tmp_path / name).read_text()
    with pytest.raises(ConfigError, match="api_key_env=REGEN_MISSING_KEY: that environment variable is not set"):
        regen([server.url], [{"prompt": "Hi"}], "api_key_env=REGEN_MISSING_KEY")


def echoing_server(serve, as_raw: bool = False):
    """A server that answers every chat request with HTTP 400 whose error text echoes the request's Authorization
    header (as some proxies do), as JSON or as plain text."""
    holder = {}

    def answer(payload):
        said = f"bad request; you sent Authorization: {holder['server'].server.authorizations[-1]}"
        return Reply(raw=said.encode(), status=400) if as_raw else Reply({"error": {"message": said}}, status=400)

    holder["server"] = serve(answer)
    return holder["server"]


@pytest.mark.parametrize("as_raw", [False, True], ids=["json", "text"])
def test_a_server_that_echoes_the_api_key_gets_it_written_nowhere(serve, regen_failing, tmp_path, monkeypatch, capfd,
                                                                  as_raw):
    """Before: `Bearer sk-...` in errors.jsonl, in summary.json's first_failure and on the console."""
    server = echoing_server(serve, as_raw)
    monkeypatch.setenv("REGEN_TEST_KEY", "sk-secret-123")
    summary, out, errors = regen_failing([server.url], [{"id": "A", "prompt": "Hi"}], "api_key_env=REGEN_TEST_KEY")
    assert out == [] and "Authorization: Bearer [redacted]" in errors[0]["metadata"]["error"]
    assert "Authorization: Bearer [redacted]" in summary["first_failure"]
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert [path for path in written if "sk-secret" in path.read_text(errors="replace")] == []
    assert "sk-secret" not in "".join(capfd.readouterr())


def test_a_server_that_echoes_url_credentials_gets_neither_them_nor_their_basic_token_written(serve, regen_failing,
                                                                                           tmp_path, capfd):
    """Before: the password appeared base64-encoded (`Basic YWxpY2U6...`) wherever the server's text went."""
    import base64

    server = echoing_server(serve)
    secret = "pw-3f9a2b"
    token = base64.b64encode(f"alice:{secret}".encode()).decode()
    summary, _, errors = regen_failing([server.url.replace("http://", f"http://alice:{secret}@")],
                                       [{"id": "A", "prompt": "Hi"}])
    assert server.server.authorizations[-1] == f"Basic {token}"
    assert errors[0]["metadata"]["error"].endswith("Authorization: Basic [redacted]")
    written = "".join(path.read_text(errors="replace") for path in tmp_path.rglob("*") if path.is_file())
    console = "".join(capfd.readouterr())
    assert token not in written + console and secret not in written + console and "[redacted]" in console


def test_wrong_tokenizer_stops_the_run(serve, regen, tmp_path):
    server = serve(Script({"Hi": [ok("x", [1, 5], [151644, EOS])]}))
    with pytest.raises(TokenizerMismatchError, match="token id 151644 is outside the vocabulary"):
        regen([server.url], [{"id": "A", "prompt": "Hi"}])
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: TokenizerMismatchError")


@pytest.mark.parametrize(("model", "name"), [
    ("org/Qwen3-8B", "my_prompts_Qwen3-8B.jsonl"), ("org/Qwen2.5-7B", "my_prompts_Qwen2.5-7B.jsonl"),
    ("out/tiny/tiny_teacher.pth", "my_prompts_tiny_teacher.jsonl"),  # the embedded server names a .pth by its path
    ("out/step_100.pt", "my_prompts_step_100.jsonl")])
def test_output_is_named_after_dataset_and_model(serve, tmp_path, tokenizer_path, model, name):
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model=model)
    data = write_jsonl(tmp_path / "my_prompts.jsonl", [{"prompt": "Hi"}])
    summary = run(regen_config(tmp_path, [server.url], data, tokenizer_path, "output=null", f"output_dir={tmp_path / 'o'}"))
    assert summary["output"] == str(tmp_path / "o" / name)
    assert len(read_jsonl(tmp_path / "o" / name)) == 1


def test_every_file_of_a_run_gets_the_outputs_permissions(serve, regen, tmp_path):
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    rows = [{"id": "a", "prompt": "Hi"}, {"id": "b", "messages": []}]
    siblings = ["out.jsonl", "out.errors.jsonl", "out.summary.json", "out.manifest.json"]  # the lock is gone by then
    previous = os.umask(0o027)
    try:
        regen([server.url], rows)
    finally:
        os.umask(previous)
    assert {name: (tmp_path / name).stat().st_mode & 0o777 for name in siblings} == dict.fromkeys(siblings, 0o640)
    assert not (tmp_path / "out.lock").exists()
    (tmp_path / "out.jsonl").chmod(0o600)  # e.g. a private output being resumed
    regen([server.url], rows, "resume=true")
    assert {name: (tmp_path / name).stat().st_mode & 0o777 for name in siblings} == dict.fromkeys(siblings, 0o600)


def test_a_symlinked_output_is_locked_as_the_file_it_names(serve, regen, tmp_path):
    """Two runs, one given the file and one a symlink to it, must not both write it (they duplicated conversations)."""
    from common.run_lock import OutputLock, OutputLockedError

    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "rows_out.jsonl"
    (tmp_path / "out.jsonl").symlink_to(real)  # the fixture's output= is this link
    holder = OutputLock(real.with_name("rows_out.lock"), real, job="regen", hint="").acquire()  # a run on the file
    try:
        with pytest.raises(OutputLockedError, match=f"{real} is being written by another regen run"):
            regen([server.url], [{"id": "a", "prompt": "Hi"}])
    finally:
        holder.release()
    assert server.requests == [] and not real.exists()
    summary, out, _ = regen([server.url], [{"id": "a", "prompt": "Hi"}])  # written through the link, siblings beside the file
    assert (tmp_path / "out.jsonl").is_symlink() and [r["id"] for r in read_jsonl(real)] == ["a_gen0"]
    assert summary["output"] == str(real) and (tmp_path / "real" / "rows_out.summary.json").is_file()


def test_a_hard_linked_output_is_refused(serve, regen, tmp_path):
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    regen([server.url], [{"id": "a", "prompt": "Hi"}])
    os.link(tmp_path / "out.jsonl", tmp_path / "twin.jsonl")  # a second name another run could be given
    with pytest.raises(UserError, match=f"{tmp_path / 'out.jsonl'} has 2 names \\(hard links\\)") as refused:
        regen([server.url], [{"id": "a", "prompt": "Hi"}, {"id": "b", "prompt": "Ho"}], "resume=true")
    assert refused.value.hint.startswith("copy it")
    assert len(server.requests) == 1 and not (tmp_path / "out.lock").exists()  # the first run's only request


def test_an_explicit_tokenizer_that_does_not_load_is_an_error(serve, regen, tmp_path, tokenizer_path):
    """Not silently replaced by the next candidate (here the served model's name, which is a tokenizer folder)."""
    server = serve(Script({"Hi": [ok("x", [1, 5], [6, EOS])]}), model=str(tokenizer_path))
    with pytest.raises(UserError, match="tokenizer=/typo/path cannot be loaded") as refused:
        regen([server.url], [{"id": "A", "prompt": "Hi"}], "tokenizer=/typo/path")
    assert "tokenizer=" in refused.value.hint and server.requests == []
    summary, _, _ = regen([server.url], [{"id": "A", "prompt": "Hi"}], "tokenizer=null")  # unset: the model's own
    assert summary["tokenizer"] == str(tokenizer_path)
