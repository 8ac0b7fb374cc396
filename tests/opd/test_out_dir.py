"""opd's entries and their out_dir: one run per folder (two real processes), a folder that cannot be written
refused before anything loads, and Hydra sweeps (-m) whose jobs each write their own out_dir, in sweep folders
named without the keys that hold paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from opd.config import path_keys
from tests.helpers.opd_support import (
    HOLD_OUT_DIR,
    entry_command,
    entry_env,
    run_entry,
    write_agent_data,
)
from tests.helpers.paths import small_tmpfs


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tokenizer_path, tiny_checkpoints, tiny_pair):
    root = tmp_path_factory.mktemp("out-dir")
    checkpoints = tiny_checkpoints
    data = write_agent_data(root / "agent.jsonl", 4)
    common = [f"data={data}", f"tokenizer={tokenizer_path}", "device=cpu", "batch_size=2", "max_steps=1"]
    rollout = ["rollout.max_turns=1", "rollout.max_gen_len=4", "rollout.max_total_len=1024"]
    entries = {
        "train": [*common, *rollout, *tiny_pair],
        "sft": [*common, "model=tiny_student", f"model.checkpoint={checkpoints['student']}", "max_total_len=1024"],
        "evaluate": [*common[:3], *rollout, "batch_size=2", "+model@models.student=tiny_student",
                     f"models.student.checkpoint={checkpoints['student']}", "isolate=false", "chart=false"],
    }
    return {"root": root, "data": data, "entries": entries}


def held_by(process: subprocess.Popen, out_dir) -> None:
    """Wait until ``process`` holds ``out_dir``'s lock (its pid is in the lock file)."""
    lock, deadline = out_dir / ".lock", time.monotonic() + 300
    while not (lock.is_file() and lock.read_text().strip() == str(process.pid)):
        assert process.poll() is None, f"the run ended (status {process.returncode}) without holding {lock}"
        assert time.monotonic() < deadline, f"the run did not take {lock} in 300 s"
        time.sleep(0.02)


def test_a_second_train_run_on_the_same_out_dir_is_refused_until_the_first_is_gone(workspace, tmp_path):
    out = tmp_path / "out"
    train = [*workspace["entries"]["train"], f"out_dir={out}"]
    first = subprocess.Popen(entry_command("train", *train, f"hydra.run.dir={tmp_path / 'run1'}"), cwd=tmp_path,
                             env=entry_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        held_by(first, out)
        os.kill(first.pid, signal.SIGSTOP)  # the first run holds out_dir for as long as the second one takes
        second = run_entry("train", *train, f"hydra.run.dir={tmp_path / 'run2'}", cwd=tmp_path)
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"error: {out} is being written by another opd run (pid {first.pid}, lock {out / '.lock'})",
            "error: wait for it to finish (or stop it), or choose another out_dir="]
        assert not (tmp_path / "run2" / "metrics.jsonl").exists()
    finally:
        first.kill()  # kill -9: the OS lets go of the lock
        first.communicate()
    third = run_entry("train", *train, f"hydra.run.dir={tmp_path / 'run3'}", "overwrite=true", cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (out / "agent_opd_64_resume.pth").is_file()


@pytest.mark.parametrize("entry", ["sft", "evaluate"])
def test_sft_and_evaluate_are_refused_while_another_process_holds_out_dir(workspace, tmp_path, entry):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OUT_DIR, str(out)], cwd=tmp_path, env=entry_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        refused = run_entry(entry, *workspace["entries"][entry], f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}",
                      cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == (f"error: {out} is being written by another opd run (pid {holder.pid}, "
                                              f"lock {out / '.lock'})")
    assert sorted(path.name for path in out.iterdir()) == [".lock"]


@pytest.mark.parametrize("entry", ["train", "sft", "evaluate"])
@pytest.mark.parametrize("where,shown", [
    ("/dev/null", "error: out_dir /dev/null is not a folder"),
    ("{data}/out", "error: cannot write to out_dir {data}/out (Not a directory)"),
])
def test_an_out_dir_that_cannot_be_written_is_refused_before_anything_loads(workspace, tmp_path, entry, where, shown):
    """data= names no file: the out_dir check comes first, before the data (and the models) are read."""
    arguments = [*workspace["entries"][entry], "data=/nowhere/agent.jsonl", f"out_dir={where.format(**workspace)}",
                 f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_entry(entry, *arguments, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [shown.format(**workspace), "error: choose another out_dir="]


def test_an_out_dir_on_a_read_only_disk_is_refused_before_anything_loads(workspace, tmp_path):
    with small_tmpfs(tmp_path / "read-only", 1 << 20, "ro") as read_only:
        result = run_entry("train", *workspace["entries"]["train"], f"out_dir={read_only / 'out'}",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == f"error: cannot write to out_dir {read_only / 'out'} (Read-only file system)"


def test_sweep_folder_names_leave_out_every_key_that_holds_a_path():
    overrides = ["data=/d.jsonl", "tokenizer=/t", "out_dir=o", "resume=r.pth", "teacher.checkpoint=/a.pth",
                 "+student.checkpoint=b.pth", "offline.cache_dir=c", "models={a: {checkpoint: x.pth}}",
                 "models.a.checkpoint=x.pth", "~teacher.tokenizer", "sampling.temperature=0.7,1.0",
                 "+model@models.b=tiny_student", "models.b.hidden_size=64", "teacher=tiny_teacher"]
    assert path_keys(overrides) == ["data", "tokenizer", "out_dir", "resume", "teacher.checkpoint",
                                    "student.checkpoint", "offline.cache_dir", "models", "models.a.checkpoint",
                                    "teacher.tokenizer"]


SWEEPS = {  # entry: (the swept override, the default out_dir's name, what each job's out_dir holds)
    "train": ("sampling.temperature=0.7,1.0", "agent_opd",
              [".lock", "agent_opd_64.pth", "agent_opd_64_resume.pth", "agent_opd_64_summary.json"]),
    "sft": ("optim.learning_rate=0.001,0.0001", "agent_sft",
            [".lock", "agent_sft_64.pth", "agent_sft_64_resume.pth", "agent_sft_64_summary.json"]),
    "evaluate": ("seed=0,1", "eval", [".lock", "episodes_student.jsonl", "evaluation.json"]),
}


@pytest.mark.parametrize("entry", list(SWEEPS))
def test_every_job_of_a_sweep_writes_its_own_out_dir(workspace, tmp_path, entry):
    """A 2-job sweep from a folder of its own: each job's out_dir is inside its sweep folder, named by the
    overrides without data=, tokenizer= and *.checkpoint= (their '/' would nest folders)."""
    swept, folder, files = SWEEPS[entry]
    sweep = tmp_path / "sweep"
    result = run_entry(entry, "-m", *workspace["entries"][entry], swept, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(path for path in sweep.iterdir() if path.is_dir())
    key, values = swept.split("=")
    assert len(jobs) == 2
    for number, (job, value) in enumerate(zip(jobs, values.split(","), strict=True)):
        assert job.name.startswith(f"{number}_") and f"{key}={value}" in job.name.removeprefix(f"{number}_").split(",")
        assert not any(part in job.name for part in ("data=", "tokenizer=", "checkpoint=", "/")), job.name
        assert sorted(path.name for path in (job / folder).iterdir()) == files
    assert not (tmp_path / "out").exists()  # nothing in the single run's default
