"""Data parallelism: two torchrun processes (gloo, CPU) make the update one process makes on the global batch,
resume exactly after a kill, refuse another world size, and only rank 0 writes files."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from common.minimind.model import load_native, save_native
from common.minimind.tiny import tiny_arch
from common.minimind.tokenizer import MINIMIND_VOCAB_SIZE
from common.resume_signature import ResumeRefusedError
from opd.torchrun import exit_status, failure_lines, job_status
from opd.train import train
from opd.training.checkpoints import load_resume
from opd.training.distributed import Ranks
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import HOLD_OUT_DIR, write_agent_data
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import wait_until

# The logged loss is the mean over the window's targets of each token's KL, sum_v p_v (log p_v - log q_v) over the
# 6,400 ids. Each log-softmax row is z - logsumexp(z) with logsumexp near log(6400) = 8.8 for these near-uniform
# models, so fp32 rounding (eps = 1.19e-7) shifts a row by up to eps/2 * 8.8, and a shifted row moves the KL by that
# shift however small the KL is (0.03 here). Two processes run the same sums in another order (other batch shapes
# and shared prefixes, per-rank partial sums): teacher and student rows and the vocabulary sum make about
# 2 * eps * log(V) = 2.1e-6 per token, and so for their mean (permuting the vocabulary of 60 such rows moved one
# token's KL by 1.5e-6). The bound is twice that, 4.2e-6; a relative 1e-5 of 0.034 (3.4e-7) is below what the
# stand-in tokenizer's sequences differ by (4e-7). It still rejects every real fault: a rank's share lost or counted
# twice, or a wrong world-size scaling, moves the loss by 10% or more.
LOSS_ROUNDING = 4 * torch.finfo(torch.float32).eps * math.log(MINIMIND_VOCAB_SIZE)
# The weights after 3 AdamW steps at lr 1e-3: Adam divides each gradient by its own running RMS, so a parameter whose
# gradient is small (a rarely used embedding row) turns the gradients' rounding differences into update differences
# far larger than theirs; measured up to 5.3e-6 (stand-in tokenizer) and 3e-6 (MiniMind's). A lost or doubled rank
# share changes the gradient's direction and moves parameters by up to lr per step, 1e-3: 50x this bound.
WEIGHT_ROUNDING = 2e-5


def test_shares_split_a_micro_batch_in_rank_order():
    batch = [7, 3, 9, 1, 4]
    assert [Ranks(r, 2).share(batch) for r in range(2)] == [[7, 3, 9], [1, 4]]
    assert [Ranks(r, 3).share(batch) for r in range(3)] == [[7, 3], [9, 1], [4]]
    assert [Ranks(r, 2).share([5]) for r in range(2)] == [[5], []]  # a short last micro-batch can leave a rank idle
    assert Ranks().share(batch) == batch and Ranks().seed(42) == 42
    assert len({Ranks(r, 4).seed(42) for r in range(4)}) == 4


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_pair, tiny_checkpoints):
    root = tmp_path_factory.mktemp("ddp")
    data = write_agent_data(root / "agent.jsonl", 5)
    base = [*tiny_pair, f"data={data}",
            "rollout.max_turns=2", "rollout.max_gen_len=6", "rollout.max_total_len=1024", "optim.learning_rate=1e-3",
            "device=cpu", "batch_size=4", "epochs=2", "max_steps=3", "optim.lr_schedule_steps=6"]
    return {"root": root, "base": base, "contrary_teacher": contrary_teacher(tiny_checkpoints["teacher"], root)}


def contrary_teacher(checkpoint: Path, folder: Path) -> Path:
    """The tiny teacher with random signs on its final norm. Random-init models with tied embeddings predict the last
    input token, so under greedy decoding the tiny student's token is always the tiny teacher's argmax and
    speculative top-k would never replace one; this teacher's argmax is another token, and its top-50 holds the
    student's token about half of the time."""
    teacher = load_native(checkpoint, tiny_arch("teacher"))
    signs = torch.randn(teacher.model.norm.weight.shape, generator=torch.Generator().manual_seed(0)).sign()
    with torch.no_grad():
        teacher.model.norm.weight.copy_(signs)
    return save_native(teacher, folder / "contrary_teacher.pth")


def launch(arguments: list[str]) -> subprocess.Popen:
    """``torchrun --standalone`` with one thread per process."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", *arguments], cwd=REPO_ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_job(process: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process under it: its workers run in sessions of their own, so a kill of
    torchrun's process group alone would leave them running, holding the output pipes open."""
    pids, frontier = [], [process.pid]
    while frontier:
        pid = frontier.pop()
        pids.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            frontier += [int(child) for child in task.read_text().split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for a launch, as long as it takes (a hang ends at pytest's timeout, which then kills it and its
    workers here)."""
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        kill_job(process)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def torchrun(workspace, name: str, *overrides: str, processes: int = 2, start_only: bool = False):
    """``torchrun --nproc_per_node N opd/train.py ...``; returns the run's folders (and the process if start_only)."""
    out, run = workspace["root"] / name, workspace["root"] / f"{name}-run"
    process = launch([f"--nproc_per_node={processes}", "opd/train.py", *workspace["base"], f"out_dir={out}",
                      f"hydra.run.dir={run}", *overrides])
    if start_only:
        return process, out, run
    done = finish(process)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, run


def single(workspace, name: str, *overrides: str):
    torch.set_num_threads(1)
    try:
        train(entry_config("opd", [*workspace["base"], f"out_dir={workspace['root'] / name}", *overrides]))
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
    return workspace["root"] / name


def weights(out) -> dict:
    return load_resume(out / "agent_opd_64_resume.pth")["model"]


def max_difference(first: dict, second: dict) -> float:
    return max((first[k] - second[k]).abs().max().item() for k in first)


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


GUIDED = [["sampling=greedy", "guidance.token_mix=0.5", "loss.kl_direction=jsd"],
          ["sampling=greedy", "guidance.turn_share=0.8", "guidance.turn_share_final=0.2"],
          ["sampling=greedy", "guidance.top_k=50", "teacher.checkpoint={contrary_teacher}"]]


@pytest.mark.parametrize("mode", [["mode=offline", "offline.source=dataset"], ["sampling=greedy"], *GUIDED])
def test_two_processes_make_the_single_process_update(workspace, mode):
    """3 steps of a global batch of 4 over 5 records: the second epoch's first micro-batch holds 1 record, so one
    rank is idle for it; fixed sequences, greedy on-policy rollouts, and greedy rollouts that the teacher guides: a
    token mixture (under the JSD loss), teacher-written turns with a share moving over the schedule, speculative
    top-k replacement. The guidance's coins are drawn per episode, whichever rank rolls it out, and a greedy
    replacement is the teacher's argmax: identical episodes."""
    name = "-".join(mode).replace("=", "-").replace("{", "").replace("}", "")
    mode = [override.format(**workspace) for override in mode]
    logged = ["logger.backends=[jsonl,tensorboard]"] if "mode=offline" in mode else []
    two, two_run = torchrun(workspace, f"{name}-two", *mode, *logged)
    one = single(workspace, f"{name}-one", *mode)
    difference = max_difference(weights(two), weights(one))
    print(f"max |difference| of student parameters after 3 steps ({name}): {difference:.3g}")
    assert difference < WEIGHT_ROUNDING
    steps_two, steps_one = metrics(two_run), metrics(one)
    assert [m["episodes"] for m in steps_two] == [m["episodes"] for m in steps_one] == [4, 1, 4]
    for a, b in zip(steps_two, steps_one, strict=True):
        assert (a["assistant_tokens"], a["target_tokens"], a["tool_calls"], a["teacher_token_share"]) == (
            b["assistant_tokens"], b["target_tokens"], b["tool_calls"], b["teacher_token_share"])
        assert a["loss"] == pytest.approx(b["loss"], abs=LOSS_ROUNDING) and a["grad_norm"] == pytest.approx(
            b["grad_norm"], rel=1e-4)
    if "guidance.token_mix=0.5" in mode:  # the teacher wrote some of the tokens, the same ones in both runs
        assert all(0 < m["teacher_token_share"] < 1 for m in steps_two)
    if "guidance" in name:  # over the run, each option let the teacher write some tokens but not all
        written = sum(m["teacher_token_share"] * m["assistant_tokens"] for m in steps_two)
        assert 0 < written < sum(m["assistant_tokens"] for m in steps_two)
    if logged:  # only rank 0 logs: one event file, each step line once in Hydra's run log
        assert len(list((two_run / "tensorboard").iterdir())) == 1
        assert (two_run / "train.log").read_text().count("- step 1  loss ") == 1
    summary = json.loads((two_run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["episodes_per_rank"] == [5, 4]
    assert sorted(p.name for p in two.iterdir()) == [".lock", "agent_opd_64.pth", "agent_opd_64_resume.pth",
                                                     "agent_opd_64_summary.json"]  # .lock: rank 0 held out_dir
    assert len(load_resume(two / "agent_opd_64_resume.pth")["rng"]) == 2  # every rank's RNG states


def test_killed_and_resumed_two_process_run_equals_the_straight_one(workspace):
    sampled = ["max_steps=6", "save_interval=1"]
    straight, _ = torchrun(workspace, "straight", *sampled)
    process, killed, killed_run = torchrun(workspace, "killed", *sampled, start_only=True)
    deadline = time.monotonic() + 300
    while not (killed_run / "metrics.jsonl").is_file() or len(metrics(killed_run)) < 2:
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    kill_job(process)
    process.communicate()
    resume = killed / "agent_opd_64_resume.pth"
    reached = load_resume(resume)["step"]
    assert 1 <= reached < 6  # killed mid-run
    torchrun(workspace, "killed", *sampled, f"resume={resume}")
    final_straight, final_resumed = weights(straight), weights(killed)
    assert all(torch.equal(final_straight[k], v) for k, v in final_resumed.items())
    with pytest.raises(ResumeRefusedError, match="world_size: saved 2, now 1"):
        single(workspace, "killed", *sampled, f"resume={resume}", "max_steps=7")


ODD_BATCH = ("error: batch_size=3 does not divide by the 2 processes: batch_size is the global batch; use a multiple "
             "of 2")


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]


def test_a_global_batch_that_does_not_split_is_refused(workspace):
    """Both ranks refuse it; only rank 0 prints the error, and torchrun's own report shows each rank's message
    (from its error file) instead of "To enable traceback see ..."."""
    out, run = workspace["root"] / "odd", workspace["root"] / "odd-run"
    done = finish(launch(["--nproc_per_node=2", "opd/train.py", *workspace["base"], "batch_size=3", f"out_dir={out}",
                          f"hydra.run.dir={run}"]))
    assert done.returncode == 1
    assert error_lines(done) == [ODD_BATCH]
    assert f"traceback : {ODD_BATCH}" in done.stderr and "To enable traceback" not in done.stderr
    assert not out.exists() and not run.exists()  # held from the start, taken back: the run stopped at its checks


def launch_wrapped(workspace, name: str, *overrides: str) -> tuple[subprocess.Popen, Path, Path]:
    """``python -m opd.torchrun --standalone --nproc_per_node=2 opd/train.py ...``; the process and the run's folders."""
    out, run = workspace["root"] / name, workspace["root"] / f"{name}-run"
    process = subprocess.Popen(
        [sys.executable, "-m", "opd.torchrun", "--standalone", "--nproc_per_node=2", "opd/train.py",
         *workspace["base"], f"out_dir={out}", f"hydra.run.dir={run}", *overrides],
        cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    return process, out, run


def test_sigterm_stops_a_two_process_run_after_a_step_both_ranks_saved(workspace):
    """A scheduler's SIGTERM to ``python -m opd.torchrun``: torchrun passes it to both ranks, which agree on the step
    to stop after; rank 0 saves it with every rank's RNG state and says so in the one line; 143; it resumes."""
    longer = ["epochs=1000", "save_interval=1000"]
    process, out, run = launch_wrapped(workspace, "stopped", *longer, "max_steps=2000")
    wait_until(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2, process,
               "the run's second step is logged")
    process.send_signal(signal.SIGTERM)
    done = finish(process)
    assert done.returncode == 143, done.stderr[-4000:]
    assert "Traceback" not in done.stdout + done.stderr and "death signal" not in done.stderr, done.stderr
    (line,) = error_lines(done)
    resume = out / "agent_opd_64_resume.pth"
    step = int(re.fullmatch(rf"error: interrupted \(SIGTERM\) after step (\d+) of 2000; continue with resume={resume}",
                            line)[1])
    saved = load_resume(resume)
    assert saved["step"] == step == len(metrics(run)) and len(saved["rng"]) == 2
    resumed = finish(launch_wrapped(workspace, "stopped", *longer, f"max_steps={step + 1}", f"resume={resume}")[0])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert load_resume(resume)["step"] == step + 1


def test_opd_torchrun_ends_a_failed_job_with_one_error_line(workspace):
    """``python -m opd.torchrun``: torchrun's options, then the one line, without torchrun's report and traceback."""
    done = finish(launch_wrapped(workspace, "odd-launcher", "batch_size=3")[0])
    assert done.returncode == 1
    assert error_lines(done) == [ODD_BATCH]
    assert "Traceback" not in done.stdout + done.stderr and "ChildFailedError" not in done.stderr, done.stderr


def failure(folder, rank: int, exitcode: int, message: str | None = None, at: int = 1000) -> ProcessFailure:
    """torchrun's record of a failed rank; with ``message``, its error file as ``common.user_errors`` writes it."""
    error_file = folder / f"{rank}.json"
    if message is not None:
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": str(at)}}}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(error_file))


def test_opd_torchrun_shows_each_other_message_once(tmp_path):
    """What rank 0 printed is not repeated; another rank's own error is, once, first failure first; a rank killed by
    a signal or one that wrote nothing (a crash: its traceback is above) gets a line of its own."""
    same, others, mixed = (tmp_path / name for name in ("same", "others", "mixed"))
    for folder in (same, others, mixed):
        folder.mkdir()
    assert failure_lines({rank: failure(same, rank, 1, "error: a\nerror: fix") for rank in range(8)}) == []
    assert failure_lines({rank: failure(others, rank, 1, "error: b") for rank in (3, 5)}) == ["error: b"]
    mixed = {0: failure(mixed, 0, 130, "error: interrupted", at=1002), 1: failure(mixed, 1, 1, "error: c", at=1001),
             2: failure(mixed, 2, -9), 3: failure(mixed, 3, 1)}
    assert failure_lines(mixed) == ["error: c", "error: rank 2 was killed by SIGKILL",
                                    "error: rank 3 exited with status 1 (its output above says why)"]
    assert [exit_status(f) for f in (mixed[0], mixed[2])] == [130, 137]
    # a rank slower to reach the error than torchrun's poll: stopped (SIGTERM) before it wrote; rank 0 printed nothing
    (tmp_path / "slow").mkdir()
    slow = {0: failure(tmp_path / "slow", 0, -15), 1: failure(tmp_path / "slow", 1, 1, "error: d")}
    assert failure_lines(slow) == ["error: d"]
    slow[1] = failure(tmp_path / "slow", 2, 1)  # nothing written: the job may have been ended by the signal
    assert failure_lines(slow) == ["error: rank 0 was killed by SIGTERM",
                                   "error: rank 1 exited with status 1 (its output above says why)"]


def test_a_job_that_ended_on_a_user_error_exits_1_though_torchrun_stopped_a_rank_first(tmp_path):
    """torchrun stops the other ranks with SIGTERM when one fails; in the same (whole) second the stopped rank can be
    the first failure, and a rank that wrote its lines can be stopped as it exits (CI: rank 0 wrote the batch error,
    then died of SIGTERM; rank 1 exited 1 with it). The status is that of the first failure that wrote its lines and
    exited on its own, else of the first that wrote its lines, else of the first failure."""
    odd = "error: batch_size=3 does not divide"
    stopped, failed = failure(tmp_path, 0, -15), failure(tmp_path, 1, 1, odd, at=1000)
    stopped.timestamp = 1000
    assert job_status({0: stopped, 1: failed}) == 1
    (tmp_path / "wrote").mkdir()
    wrote_then_stopped = failure(tmp_path / "wrote", 0, -15, odd, at=1000)
    assert job_status({0: wrote_then_stopped, 1: failed}) == 1  # first by time and rank, but stopped as it exited
    interrupted, silent = failure(tmp_path, 5, -2, "error: interrupted", at=999), failure(tmp_path, 6, -9)
    silent.timestamp = 998
    # none that wrote exited on its own: the first that wrote (not the first failure, which wrote nothing)
    assert job_status({6: silent, 5: interrupted, 0: wrote_then_stopped}) == 130
    killed, also = failure(tmp_path, 2, -9), failure(tmp_path, 3, -15)
    killed.timestamp, also.timestamp = 1001, 1000
    assert job_status({2: killed, 3: also}) == 143  # none wrote lines: the first failure, by time
    also.timestamp = 1001
    assert job_status({3: also, 2: killed}) == 137  # the same second: the lower rank


def test_a_held_out_dir_refuses_a_two_process_run_without_a_hang(workspace):
    """Only rank 0 takes out_dir's lock: refused, it exits before joining the process group and torchrun stops
    the other rank (which would otherwise wait in the rendezvous)."""
    out, run = workspace["root"] / "held", workspace["root"] / "held-run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OUT_DIR, str(out)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        done = finish(launch(["--nproc_per_node=2", "opd/train.py", *workspace["base"], f"out_dir={out}",
                              f"hydra.run.dir={run}"]))
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    assert f"error: {out} is being written by another opd run (pid {holder.pid}, lock {out / '.lock'})" in done.stderr
    assert not (run / "metrics.jsonl").exists()
