"""Ctrl-C and SIGTERM on an opd run once it trains (``opd.training.stop_and_save``): the step in progress is saved, the run
ends with the one line naming its resume file, and resuming from it ends where the run that was never stopped ends;
a second Ctrl-C stops at once (while it starts: tests/common/test_start_up.py; under torchrun:
tests/opd/test_distributed.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.minimind.tiny import tiny_arch
from common.user_errors import Interrupted, exit_on_user_error
from experiments.recipe.synthetic_task import write_task
from opd.training.checkpoints import load_resume
from opd.training.distributed import Ranks
from opd.training.stop_and_save import AGAIN, StepStop, stopping
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import communicate, loaded
from tests.helpers.standin_vllm_cli import wait_until

# the schedule spans a fixed 40 steps, so a run may end after any step (max_steps) and still resume the stopped one
SFT = ["opd/sft.py", "model=tiny_student", "from_scratch=true", "batch_size=4", "epochs=100000", "device=cpu",
       "optim.learning_rate=1e-3", "optim.lr_schedule_steps=40", "save_interval=1000"]
STOPPED = re.compile(r"error: interrupted \((SIGINT|SIGTERM)\) after step (\d+) of 100000; continue with resume=(\S+)")


@pytest.fixture
def sft(tmp_path, standin_tokenizer_path):  # which tokenizer does not matter here: run once, not again by test-standin
    data = write_task(tmp_path / "task", train=8, heldout=2, seed=0)["files"]["train_demonstrations"]

    def start(name: str, *overrides: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, *SFT, f"tokenizer={standin_tokenizer_path}", f"data={data}",
                                 f"out_dir={tmp_path / name}", f"hydra.run.dir={tmp_path / name}-run", *overrides],
                                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    return start


def steps_logged(run) -> int:
    metrics = run / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.is_file() else 0


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_the_step_in_progress_and_the_resumed_run_is_the_straight_one(sft, tmp_path, signum):
    process = sft("stopped", "max_steps=100000")
    wait_until(lambda: steps_logged(tmp_path / "stopped-run") >= 2, process, "the SFT's second step is logged")
    process.send_signal(signum)
    _, stderr = communicate(process)
    assert process.returncode == 128 + signum, stderr[-3000:]
    (line,) = error_lines(stderr)
    name, step, resume = STOPPED.fullmatch(line).groups()
    step = int(step)
    assert name == signal.Signals(signum).name and resume == str(tmp_path / "stopped" / "agent_sft_64_resume.pth")
    run_log = (tmp_path / "stopped-run" / "sft.log").read_text()
    assert run_log.count(f"{name}: stopping after this step, which is saved") == 1, run_log
    # the step it stopped after is the last one logged and the one saved (save_interval saves none before)
    assert steps_logged(tmp_path / "stopped-run") == step and load_resume(resume)["step"] == step
    assert 2 <= step < 40
    resumed = sft("stopped", f"resume={resume}", f"max_steps={step + 2}")
    straight = sft("straight", f"max_steps={step + 2}")
    for process in (resumed, straight):
        _, stderr = communicate(process)
        assert process.returncode == 0, stderr[-3000:]
    assert (tmp_path / "stopped" / "agent_sft_64.pth").read_bytes() == (
        tmp_path / "straight" / "agent_sft_64.pth").read_bytes()
    resumed_summary = json.loads((tmp_path / "stopped" / "agent_sft_64_summary.json").read_text())
    assert resumed_summary["steps"] == step + 2


def test_a_second_ctrl_c_stops_at_once_without_saving(capsys):
    """Handled in the test's process: a signal sent right after another one of its kind merges with it (one pending
    signal), and once the first is handled the step it waits for can end first."""
    with pytest.raises(SystemExit) as ended, exit_on_user_error(), stopping(Ranks()) as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.caught == signal.SIGINT
        signal.raise_signal(signal.SIGINT)
    assert ended.value.code == 130 and capsys.readouterr().err == AGAIN + "\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_keeps_the_first_signal_and_only_a_second_ctrl_c_stops_at_once():
    stop = StepStop(Ranks())
    assert stop.agreed() == 0
    stop._handle(signal.SIGTERM, None)
    stop._handle(signal.SIGTERM, None)  # its sender's SIGKILL follows its grace period: nothing more to do here
    assert stop.agreed() == signal.SIGTERM
    with pytest.raises(Interrupted) as again:
        stop._handle(signal.SIGINT, None)
    assert (again.value.message, again.value.exit_status) == (AGAIN, 130)
    line = stop.interrupted(signal.SIGTERM, 7, 100, "out/x_resume.pth")
    assert (line.message, line.exit_status) == (
        "error: interrupted (SIGTERM) after step 7 of 100; continue with resume=out/x_resume.pth", 143)
    assert stop.interrupted(signal.SIGINT, 7, 100, None).message == "error: interrupted (SIGINT) after step 7 of 100"


def test_a_step_that_fails_while_a_signal_is_kept_raises_its_error_on_one_process():
    with pytest.raises(RuntimeError, match="the step's own"), stopping(Ranks()) as stop:
        stop._handle(signal.SIGTERM, None)
        raise RuntimeError("the step's own error")


def test_under_torchrun_a_step_that_fails_while_a_signal_is_kept_ends_the_rank_by_that_signal():
    """torchrun stopped the ranks of a job whose other rank failed: the collective this rank waits in fails, and the
    rank ends as it would have without the handler (the failed rank's error is the job's: opd.torchrun)."""
    child = ("import signal\nfrom opd.training.distributed import Ranks\nfrom opd.training.stop_and_save import stopping\n"
             "with stopping(Ranks(rank=1, world_size=2)) as stop:\n"
             "    stop._handle(signal.SIGTERM, None)\n"
             "    raise RuntimeError('Connection closed by peer')\n")
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "Traceback" not in done.stderr


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [int(child) for child in listed.read().split()]


def spawned(pid: int) -> bool:
    """The child runs multiprocessing's spawn (a child forked but not yet exec'd still maps its parent's torch)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"spawn_main" in cmdline.read()


def test_sigterm_while_evaluating_is_one_line_and_143_and_stops_the_checkpoints_process(
        tmp_path, standin_tokenizer_path, tiny_checkpoints):
    """Outside a step loop (loading, an evaluation) SIGTERM was Python's default, a silent kill; now it ends the run
    as Ctrl-C does (``common.start_up.interrupt_job``). The checkpoint's own process (isolate=true) goes with it."""
    data = write_task(tmp_path / "task", train=2, heldout=200, seed=4)["files"]["heldout_prompts"]
    arch = tiny_arch("student")
    model = (f"models={{student: {{checkpoint: '{tiny_checkpoints['student']}', hidden_size: {arch.hidden_size}, "
             f"num_hidden_layers: {arch.num_hidden_layers}, num_attention_heads: {arch.num_attention_heads}, "
             f"num_key_value_heads: {arch.num_key_value_heads}}}}}")
    process = subprocess.Popen([sys.executable, "opd/evaluate.py", f"data={data}",
                                f"tokenizer={standin_tokenizer_path}", model, "device=cpu", "batch_size=1",
                                "rollout.max_gen_len=64", "chart=false", f"out_dir={tmp_path / 'eval'}",
                                f"hydra.run.dir={tmp_path / 'run'}"],
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    (worker,) = wait_until(lambda: [child for child in children(process.pid) if spawned(child)
                                    and loaded(child, "libtorch_global_deps")],
                           process, "the checkpoint's process has imported torch")
    process.send_signal(signal.SIGTERM)
    _, stderr = communicate(process)
    assert process.returncode == 143, stderr[-3000:]
    assert error_lines(stderr) == ["error: interrupted (SIGTERM)"] and stderr.strip() == "error: interrupted (SIGTERM)"
    assert not (tmp_path / "eval" / "evaluation.json").exists()
    assert not Path(f"/proc/{worker}").exists()  # terminated and reaped before the run exited (a daemon process)
