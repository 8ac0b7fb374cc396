"""The error a person sees: under torchrun only rank 0 prints it, every rank writes it to torchrun's error file."""

from __future__ import annotations

import json

import pytest

from common.user_errors import UserError, exit_on_user_error


def stop(error: BaseException):
    with pytest.raises(SystemExit) as exited, exit_on_user_error():
        raise error
    return exited.value.code


@pytest.mark.parametrize("rank,printed", [("0", True), ("1", False)])
def test_under_torchrun_only_rank_0_prints_and_every_rank_writes_its_error_file(monkeypatch, capsys, tmp_path,
                                                                                 rank, printed):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("RANK", rank)
    assert stop(UserError("batch_size=3 does not divide", "use a multiple of 2")) == 1
    lines = "error: batch_size=3 does not divide\nerror: use a multiple of 2"
    assert capsys.readouterr().err == (lines + "\n" if printed else "")
    record = json.loads(error_file.read_text())["message"]  # what torch's ErrorHandler.record_exception writes
    assert record["message"] == lines and int(record["extraInfo"]["timestamp"]) > 0


def test_without_torchrun_the_error_is_printed_and_no_file_written(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setenv("RANK", "1")  # set by something else: not torchrun's
    monkeypatch.chdir(tmp_path)
    assert stop(KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == "error: interrupted\n" and list(tmp_path.iterdir()) == []
