"""The run manifest: written by a first run, a resume with any changed setting refused key by key (the output
untouched), resume_accept_changes recorded, and an output without a manifest (speculators') resumed with a
warning. End to end through ``run`` against a scripted server."""

from __future__ import annotations

import json
import re

import pytest

from common.resume_signature import ResumeRefusedError
from tests.helpers.regen_support import EOS, ok, write_jsonl

ROWS = [{"id": "a", "prompt": "first"}, {"id": "b", "prompt": "second"}]


@pytest.fixture
def first_run(serve, regen, tmp_path):
    """A finished run over ROWS; returns (server, the output's bytes)."""
    server = serve(lambda payload: ok("answer", [1, 5], [6, EOS]))
    regen([server.url], ROWS)
    return server, (tmp_path / "out.jsonl").read_bytes()


def manifest(tmp_path) -> dict:
    return json.loads((tmp_path / "out.manifest.json").read_text())


def test_a_first_run_records_what_produced_the_output(first_run, tmp_path, tokenizer_path):
    saved = manifest(tmp_path)
    assert saved["version"] == 1 and saved["changes"] == []
    settings = saved["settings"]
    assert settings["dataset.path"] == str((tmp_path / "rows.jsonl").resolve())
    assert settings["dataset.fingerprint"].startswith("sha256:") and settings["tokenizer"].startswith("sha256:")
    assert (settings["model"], settings["max_tokens"], settings["carry_reasoning"], settings["mix_seed"]) == (
        "standin", 8192, False, 0)
    assert settings["sampling.temperature"] is None and settings["extra_request_params"] is None


@pytest.mark.parametrize("override,key,old,new", [
    ("sampling=greedy", "sampling.temperature", None, 0.0),
    ("sampling.top_p=0.9", "sampling.top_p", None, 0.9),
    ("max_tokens=100", "max_tokens", 8192, 100),
    ("extra_request_params={chat_template_kwargs: {enable_thinking: false}}",
     "extra_request_params.chat_template_kwargs.enable_thinking", None, False),
    ("reasoning_effort_weights={low: 1, high: 3}", "reasoning_effort_weights.high", None, 3.0),
    ("temperature_weights={0.6: 1}", "temperature_weights.0.6", None, 1.0),
    ("mix_seed=3", "mix_seed", 0, 3),
    ("carry_reasoning=true", "carry_reasoning", False, True),
    ("language_filter=EN", "language_filter", None, "EN"),
])
def test_a_resume_with_a_changed_setting_is_refused_naming_it(first_run, regen, tmp_path, override, key, old, new):
    server, before = first_run
    with pytest.raises(ResumeRefusedError) as refused:
        regen([server.url], ROWS, "resume=true", override)
    assert f"\n  {key}: saved {old!r}, now {new!r}" in str(refused.value)
    assert str(refused.value).startswith(f"refusing to resume {tmp_path / 'out.jsonl'}: the run's settings differ "
                                         "from out.manifest.json")
    assert refused.value.hint.startswith("resume with the original settings, or add resume_accept_changes=true")
    assert (tmp_path / "out.jsonl").read_bytes() == before and len(server.requests) == 2


def test_another_model_dataset_or_tokenizer_is_refused(first_run, serve, regen, tmp_path, tokenizer_path):
    server, _ = first_run
    other_model = serve(lambda payload: ok("answer", [1, 5], [6, EOS]), model="org/other")
    with pytest.raises(ResumeRefusedError, match="model: saved 'standin', now 'org/other'"):
        regen([other_model.url], ROWS, "resume=true")
    with pytest.raises(ResumeRefusedError, match=r"dataset.fingerprint: saved 'sha256:\w+', now 'sha256:\w+'"):
        regen([server.url], [*ROWS, {"id": "c", "prompt": "a row added later"}], "resume=true")
    reformatted = tmp_path / "tokenizer.json"
    reformatted.write_text(json.dumps(json.loads((tokenizer_path / "tokenizer.json").read_text()), indent=1))
    with pytest.raises(ResumeRefusedError, match=r"\n  tokenizer: saved 'sha256:\w+', now 'sha256:\w+'"):
        regen([server.url], ROWS, "resume=true", f"tokenizer={reformatted}")


def test_resume_accept_changes_continues_and_records_the_change(first_run, regen, tmp_path):
    server, _ = first_run
    rows = [*ROWS, {"id": "c", "prompt": "third"}]
    data_before = manifest(tmp_path)["settings"]["dataset.fingerprint"]
    summary, out, _ = regen([server.url], rows, "resume=true", "max_tokens=100", "resume_accept_changes=true")
    assert [r["primary_id"] for r in out] == ["a", "b", "c"] and summary["skipped_already_done"] == 2
    assert server.requests[-1]["max_tokens"] == 100
    saved = manifest(tmp_path)
    assert saved["settings"]["max_tokens"] == 100
    [change] = saved["changes"]
    assert change["differences"] == {"dataset.fingerprint": {"old": data_before,
                                                             "new": saved["settings"]["dataset.fingerprint"]},
                                     "max_tokens": {"old": 8192, "new": 100}}
    regen([server.url], rows, "resume=true", "max_tokens=100")  # the recorded settings are the new ones now


def test_an_output_without_a_manifest_is_resumed_with_a_warning(first_run, regen, tmp_path, capsys):
    server, before = first_run
    (tmp_path / "out.manifest.json").unlink()  # e.g. written by speculators regenerate-responses
    summary, out, _ = regen([server.url], [*ROWS, {"id": "c", "prompt": "third"}], "resume=true", "max_tokens=7")
    assert "has no manifest (written by speculators or an older regen): resuming without checking" in \
        " ".join(capsys.readouterr().err.split())
    assert [r["primary_id"] for r in out] == ["a", "b", "c"] and summary["skipped_already_done"] == 2
    assert manifest(tmp_path)["settings"]["max_tokens"] == 7


def test_a_fresh_run_replaces_a_stale_manifest(serve, regen, tmp_path):
    (tmp_path / "out.manifest.json").write_text('{"settings": {"max_tokens": 1}}')
    server = serve(lambda payload: ok("answer", [1, 5], [6, EOS]))
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    regen([server.url], ROWS)
    assert manifest(tmp_path)["settings"]["max_tokens"] == 8192


@pytest.mark.parametrize("saved,overrides", [
    ({"settings": 5}, []),
    ([1, 2], []),
    ("keep", ["max_tokens=100", "resume_accept_changes=true"]),  # the saved settings, with "changes": 5
], ids=["settings-not-an-object", "not-an-object", "changes-not-a-list"])
def test_a_manifest_of_the_wrong_shape_is_an_error_naming_it(first_run, regen, tmp_path, saved, overrides):
    server, before = first_run
    path = tmp_path / "out.manifest.json"
    if saved == "keep":
        saved = {**manifest(tmp_path), "changes": 5}
    path.write_text(json.dumps(saved))
    with pytest.raises(ResumeRefusedError, match=f"^{path} is not a regen manifest: ") as refused:
        regen([server.url], ROWS, "resume=true", *overrides)
    assert refused.value.hint == "restore it, or remove it to resume without a settings check"
    assert (tmp_path / "out.jsonl").read_bytes() == before and json.loads(path.read_text()) == saved


@pytest.mark.parametrize("version", [99, None, "1"])
def test_a_manifest_of_an_unknown_version_is_refused_naming_it(first_run, regen, tmp_path, version):
    server, before = first_run
    path = tmp_path / "out.manifest.json"
    saved = {**manifest(tmp_path), "version": version}
    path.write_text(json.dumps(saved))
    with pytest.raises(ResumeRefusedError, match=re.escape(f"{path} has manifest version {version!r}; this regen reads "
                                                      "version 1 only")) as refused:
        regen([server.url], ROWS, "resume=true")
    assert refused.value.hint.startswith("resume it with the regen that wrote it")
    assert (tmp_path / "out.jsonl").read_bytes() == before and json.loads(path.read_text()) == saved
