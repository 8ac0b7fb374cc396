"""The study's pick of a warm student or teacher from an SFT it runs: each kept checkpoint as it is written, in step
order, none of an earlier run, and the SFT stopped at the pick."""

from __future__ import annotations

import os
import sys

import pytest

from experiments.study import warm_start
from experiments.study.warm_start import followed_checkpoints


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(warm_start, "POLL_S", 0.01)

# a stand-in SFT: keeps "weights" at steps 10, 20, ... (written whole, then renamed, as opd.training.checkpoints does), and
# waits for a file of the test before each next step, so the test decides how far it gets
FAKE_SFT = """
import os, sys, time
run, steps = sys.argv[1], int(sys.argv[2])
with open(os.path.join(run, "pid"), "w") as f:
    f.write(str(os.getpid()))
for step in range(10, steps + 1, 10):
    while not os.path.exists(os.path.join(run, f"go{step}")):
        time.sleep(0.01)
    with open(os.path.join(run, "tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(run, "tmp"), os.path.join(run, f"sft_step{step}.pth"))
sys.exit(int(sys.argv[3]))
"""


def _command(run, steps: int, status: int = 0) -> list[str]:
    return [sys.executable, "-c", FAKE_SFT, str(run), str(steps), str(status)]


def test_each_kept_checkpoint_is_yielded_once_in_step_order_and_the_sft_is_stopped_at_the_pick(tmp_path):
    (tmp_path / "sft_step50.pth").write_text("an earlier run's")  # older than the SFT: never yielded
    os.utime(tmp_path / "sft_step50.pth", (0, 0))
    checkpoints = followed_checkpoints(tmp_path, "sft", _command(tmp_path, 40))
    (tmp_path / "go10").touch()
    assert next(checkpoints) == (10, tmp_path / "sft_step10.pth")
    (tmp_path / "go20").touch()
    assert next(checkpoints) == (20, tmp_path / "sft_step20.pth")
    checkpoints.close()  # the pick: the SFT, still waiting for go30, is stopped and reaped
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)
    assert sorted(path.name for path in tmp_path.glob("sft_step*")) == ["sft_step10.pth", "sft_step20.pth",
                                                                        "sft_step50.pth"]


def test_checkpoints_kept_before_the_sft_ends_are_all_yielded(tmp_path):
    for step in (10, 20, 30):
        (tmp_path / f"go{step}").touch()
    assert [step for step, _ in followed_checkpoints(tmp_path, "sft", _command(tmp_path, 30))] == [10, 20, 30]


def test_a_failed_sft_is_an_error_after_its_checkpoints(tmp_path):
    (tmp_path / "go10").touch()
    checkpoints = followed_checkpoints(tmp_path, "sft", _command(tmp_path, 10, status=3))
    assert next(checkpoints)[0] == 10
    with pytest.raises(RuntimeError, match="exited with status 3"):
        next(checkpoints)


def test_an_sft_keeping_weights_under_another_stem_is_an_error_naming_them(tmp_path):
    """A wrong ``--stem`` would otherwise wait through the whole SFT and measure nothing."""
    (tmp_path / "go10").touch()
    checkpoints = followed_checkpoints(tmp_path, "sft_64", _command(tmp_path, 40))
    with pytest.raises(RuntimeError, match=r"keeps sft_step10.pth in .*, not sft_64_step<N>.pth: --stem must be"):
        next(checkpoints)
    checkpoints.close()
    with pytest.raises(ProcessLookupError):  # and the SFT was stopped
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_a_terminated_pick_stops_the_sft_it_runs_with_one_error_line(tmp_path):
    """SIGTERM to the pick (a study stopped by hand, or the stage runner) stops its SFT too: no orphan trains on."""
    import subprocess
    import time

    from experiments.study.chain_task import write_task
    from tests.helpers.paths import REPO_ROOT

    write_task(tmp_path / "data", train=2, distill=2)
    run = tmp_path / "run"
    run.mkdir()
    pick = subprocess.Popen([sys.executable, "-m", "experiments.study.warm_start", "--run-dir", str(run), "--stem",
                             "sft", "--arch", "32,1,2,1", "--data", str(tmp_path / "data" / "distill_prompts.jsonl"),
                             "--tokenizer", "unused", "--min-accuracy", "0.5", "--out", str(tmp_path / "pick.pth"),
                             "--", *_command(run, 40)], cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
    while not (run / "pid").exists() or not (run / "pid").read_text():
        assert pick.poll() is None, pick.stderr.read()
        time.sleep(0.05)
    pick.terminate()
    assert pick.wait(timeout=60) == 130
    assert pick.stderr.read().strip().splitlines() == ["error: interrupted"]
    with pytest.raises(ProcessLookupError):  # stopped and reaped by the pick before it exited
        os.kill(int((run / "pid").read_text()), 0)
