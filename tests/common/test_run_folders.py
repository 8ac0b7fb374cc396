"""A run that stops at its checks leaves no folder where it ran (``common/run_folders.py``): not Hydra's
``outputs/<entry>/<date>/<time>/`` (or a sweep's ``multirun/...``), not opd's ``out_dir``, not regen's output folder;
a run past its checks keeps them, and a folder holding anyone else's files is never removed."""

from __future__ import annotations

import importlib

import pytest

from common import run_folders
from common.run_folders import checks_passed, discard_unless_checked, note_new_folder
from tests.helpers.entries import run_main
from tests.helpers.opd_support import run_entry, write_agent_data
from tests.helpers.paths import small_tmpfs


def regen(*overrides: str, cwd):
    from regen.main import main

    return run_main(main, *overrides, cwd=cwd, program="regen/main.py")


def test_regen_stopped_by_a_missing_dataset_file_leaves_no_hydra_folder(tmp_path):
    result = regen("dataset=local", "dataset.path=missing.jsonl", "server.model=m", cwd=tmp_path)
    assert result.returncode == 1 and "error: dataset file not found: missing.jsonl" in result.stderr
    assert list(tmp_path.iterdir()) == []  # before: outputs/regen/DATE/TIME/ with .hydra/ and main.log


def test_regen_stopped_at_its_server_check_leaves_neither_its_output_folder_nor_hydras(tmp_path, tokenizer_path):
    data = tmp_path / "in" / "prompts.jsonl"
    data.parent.mkdir()
    data.write_text('{"prompt": "hi"}\n')
    # server.model names the output, so the output is opened (its folder made) before any server is asked
    result = regen("dataset=local", f"dataset.path={data}", "server=external", "server.model=m",
                   "server.endpoints=[http://127.0.0.1:1]", f"tokenizer={tokenizer_path}", "output=out/regen/x.jsonl",
                   cwd=tmp_path)
    assert result.returncode == 1 and "error: no endpoint answers /v1/models" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # before: out/regen/x.jsonl, .manifest, .errors


def test_regen_sweep_stopped_at_its_checks_leaves_no_multirun_folder(tmp_path):
    result = regen("-m", "dataset=local", "dataset.path=missing.jsonl", "server.model=m",
                   "sampling.temperature=0.6,1.0", cwd=tmp_path)
    assert result.returncode == 1 and "error: dataset file not found" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_opd_entries_stopped_by_missing_data_leave_neither_out_dir_nor_hydra_folder(tmp_path):
    for entry, group in (("train", "teacher=tiny_teacher"), ("sft", "model=tiny_student"),
                         ("evaluate", "+model@models.s=tiny_student")):
        result = run_entry(entry, "data=missing.jsonl", "tokenizer=tok", group, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert "missing.jsonl" in result.stderr.splitlines()[-1]
        assert list(tmp_path.iterdir()) == [], entry  # before: outputs/... and out/agent_opd (its .lock) stayed


def test_evaluate_with_a_missing_checkpoint_stops_at_its_checks_naming_the_model(tmp_path, tokenizer_path):
    data = write_agent_data(tmp_path / "agent.jsonl", 2)
    result = run_entry("evaluate", f"data={data}", f"tokenizer={tokenizer_path}", "+model@models.s=tiny_student",
                       f"models.s.checkpoint={tmp_path / 'none.pth'}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == f"error: models.s.checkpoint: no such file: {tmp_path / 'none.pth'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl"]  # before: outputs/ and out/eval stayed


def error_lines(result) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_a_run_folder_that_cannot_be_written_is_two_error_lines_for_every_entry(tmp_path):
    """Hydra's own mkdir or config copy would fail with its traceback: a file in the way, a path under one, a sweep
    folder under one."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for setting, overrides in (("hydra.run.dir", [f"hydra.run.dir={blocker}"]),
                               ("hydra.run.dir", [f"hydra.run.dir={blocker / 'run'}"]),
                               ("hydra.sweep.dir", ["-m", f"hydra.sweep.dir={blocker / 'sweep'}", "seed=1,2"])):
        for name, run in (("regen", lambda *o: regen(*o, "dataset=local", "dataset.path=x.jsonl", cwd=tmp_path)),
                          ("sft", lambda *o: run_entry("sft", *o, "data=x.jsonl", "model=tiny_student",
                                                       cwd=tmp_path))):
            if name == "regen" and "seed=1,2" in overrides:
                overrides = [*overrides[:-1], "sampling.temperature=0.6,1.0"]
            result = run(*overrides)
            assert result.returncode == 1, (name, result.stderr)
            folder = overrides[-1 if "-m" not in overrides else 1].split("=", 1)[1]
            expected = ([f"error: {setting}={folder} is not a folder"] if folder == str(blocker) else
                        [f"error: cannot write to the run folder {folder} ({setting}): Not a directory"])
            assert error_lines(result) == [*expected, f"error: choose another {setting}="], name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_checked_run_folder_stays_and_a_checked_sweep_folder_goes(tmp_path):
    """Every rank of a torchrun job checks the same run folder at once: one that removed it after its own check
    made another's check fail (CI saw a rank exit 1). A sweep's is made by Hydra only after regen's own checks."""
    run_folders.check_run_folder(tmp_path / "outputs" / "run", "hydra.run.dir", keep=True)
    assert (tmp_path / "outputs" / "run").is_dir() and list((tmp_path / "outputs" / "run").iterdir()) == []
    run_folders.check_run_folder(tmp_path / "multirun" / "sweep", "hydra.sweep.dir", keep=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


@pytest.mark.parametrize("module", ["experiments.study.study", "experiments.recipe.recipe"])
def test_an_experiment_whose_out_dir_cannot_be_written_is_two_error_lines_naming_out_dir(tmp_path, module):
    """Their run folder is ``${out_dir}/hydra``: the error names the key a person sets."""
    (tmp_path / "file").write_text("x")
    result = run_main(importlib.import_module(module).main, f"out_dir={tmp_path / 'file'}", cwd=tmp_path)
    assert result.returncode == 1
    assert error_lines(result) == [
        f"error: cannot write to the run folder {tmp_path / 'file' / 'hydra'} (out_dir): Not a directory",
        "error: choose another out_dir="]


def test_a_full_disk_under_the_run_folder_is_two_error_lines_and_leaves_nothing(tmp_path):
    with small_tmpfs(tmp_path / "disk", 8 << 10) as disk:
        (disk / "fill").write_bytes(b"\0" * (8 << 10))
        result = run_entry("sft", "data=x.jsonl", "model=tiny_student", f"hydra.run.dir={disk / 'a' / 'run'}",
                           cwd=tmp_path)
        assert result.returncode == 1
        assert error_lines(result) == [
            f"error: cannot write to the run folder {disk / 'a' / 'run'} (hydra.run.dir): No space left on device",
            "error: make room on that disk, or choose another hydra.run.dir="]
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]


def test_opd_run_past_its_checks_keeps_its_folders(tmp_path, tokenizer_path):
    data = write_agent_data(tmp_path / "agent.jsonl", 2)
    # the student checkpoint is read after the data: a failure there is past the data's check but before the
    # run's end of checks, so nothing stays; a run that trains keeps its out_dir and Hydra folder
    stopped = run_entry("sft", f"data={data}", f"tokenizer={tokenizer_path}", "model=tiny_student",
                        f"model.checkpoint={tmp_path / 'none.pth'}", cwd=tmp_path)
    assert stopped.returncode == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl"]
    ran = run_entry("sft", f"data={data}", f"tokenizer={tokenizer_path}", "model=tiny_student", "from_scratch=true",
                    "max_steps=1", "batch_size=2", "max_total_len=1024", "device=cpu", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.jsonl", "out", "outputs"]


@pytest.fixture
def fresh():
    run_folders.forget()
    yield
    run_folders.forget()


def test_only_folders_this_run_made_and_only_its_own_files_are_removed(tmp_path, fresh):
    existing = tmp_path / "existing"
    existing.mkdir()
    made, foreign = existing / "a" / "b", tmp_path / "foreign"
    note_new_folder(made, (".lock",))
    note_new_folder(existing, (".lock",))  # it was there before: never removed
    note_new_folder(foreign, (".lock",))
    made.mkdir(parents=True)
    (made / ".lock").write_text("1")
    (existing / ".lock").write_text("1")
    foreign.mkdir()
    (foreign / ".lock").write_text("1")
    (foreign / "theirs.txt").write_text("someone else's")
    with pytest.raises(RuntimeError), discard_unless_checked():
        raise RuntimeError("a check failed")
    assert not (existing / "a").exists() and (existing / ".lock").is_file()
    assert sorted(p.name for p in foreign.iterdir()) == ["theirs.txt"]


def test_after_the_checks_pass_a_failure_removes_nothing(tmp_path, fresh):
    folder = tmp_path / "run"
    note_new_folder(folder, (".lock",))
    folder.mkdir()
    (folder / ".lock").write_text("1")
    with pytest.raises(RuntimeError), discard_unless_checked():
        checks_passed()
        raise RuntimeError("failed mid-run")
    assert (folder / ".lock").is_file()
