"""Ctrl-C and SIGTERM while a command starts (``common.start_up``): the start-up line, whatever a library made of
the signal, the finalizer reports of what it cut dropped, and the defaults back once the job runs; opd's commands,
its torchrun launcher, the embedded server and the experiments signalled as they start (regen's:
tests/regen/test_errors.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest

from common.start_up import (
    _StartUp,
    interrupt_job,
    interrupt_start_up,
    raise_if_signalled,
    start_up_interrupts,
    started,
    stop_at_start_up,
)
from common.user_errors import Interrupted, exit_on_user_error
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import communicate, loaded
from tests.helpers.standin_vllm_cli import wait_until

LINE = "tool: interrupted ({signal}) while starting"


@pytest.fixture(autouse=True)
def own_start_up(monkeypatch):
    """The signal is this test's: later runs in this process see none, and their handlers and stderr are theirs."""
    monkeypatch.setattr(_StartUp, "signum", None)
    monkeypatch.setattr(_StartUp, "stderr", None)
    monkeypatch.setattr(_StartUp, "message", LINE)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("full_error, reports", [(None, 0), ("1", 1)])
def test_a_signal_in_plain_code_drops_the_finalizer_reports_of_what_it_cut(monkeypatch, full_error, reports):
    """A signal raised in plain code may cut a constructor (CI once saw an asyncio transport without ``_closing``,
    whose ``__del__`` then printed "Exception ignored ... Traceback"): once the handler raises, such reports are
    dropped; ``HYDRA_FULL_ERROR=1`` keeps them."""

    class HalfBuilt:
        def __del__(self):
            raise AttributeError("'HalfBuilt' object has no attribute '_closing'")

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    if full_error is None:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    else:
        monkeypatch.setenv("HYDRA_FULL_ERROR", full_error)
    HalfBuilt()  # freed at once: reported before the signal
    assert len(seen) == 1
    with pytest.raises(Interrupted):
        interrupt_start_up(signal.SIGINT, None)
    HalfBuilt()
    assert len(seen) == 1 + reports


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("after", ["raised", "reported_and_exited"])
def test_a_start_up_signal_that_a_library_turned_into_another_error_is_still_one_line(capsys, signum, after):
    """CI once saw SIGINT land in omegaconf's ``flag_override`` while Hydra composed the config: its cleanup then
    failed on the half-changed flags (``AttributeError``), which replaced the interrupt; Hydra printed that with its
    traceback and exited 1. Whatever comes out of the start-up after its signal ends as the signal's one line."""

    @contextmanager
    def flags_restored():  # a cleanup that fails on the state the signal cut
        try:
            yield
        finally:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")

    def compose():
        with flags_restored():
            interrupt_start_up(signum, None)

    def hydra_main():  # as Hydra's run_and_report: an Exception is printed with its traceback, then exit 1
        try:
            compose()
        except Exception as error:
            print(f"Error executing job with overrides: []\nTraceback ...\n{error!r}", file=sys.stderr)
            sys.exit(1)

    with pytest.raises(SystemExit) as ended, exit_on_user_error(), start_up_interrupts():
        compose() if after == "raised" else hydra_main()
    assert ended.value.code == 128 + signum
    assert capsys.readouterr().err == f"tool: interrupted ({signal.Signals(signum).name}) while starting\n"


def test_the_start_up_handler_replaces_only_the_defaults_and_leaves_when_the_job_starts(monkeypatch):
    """Installed over Python's defaults (never over someone else's handler, never under torchrun, whose SIGTERM
    stops a rank for another's failure); ``started()`` gives SIGINT back to Python's default and SIGTERM to
    ``interrupt_job`` (not the silent kill of its default), and only where the start-up handler was installed."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stop_at_start_up(LINE)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [interrupt_start_up] * 2
    with pytest.raises(Interrupted) as stopped:
        signal.raise_signal(signal.SIGTERM)
    assert (stopped.value.exit_status, stopped.value.message) == (143, "tool: interrupted (SIGTERM) while starting")
    monkeypatch.setattr(_StartUp, "signum", None)  # that signal was handled: the start-up went on without it
    started()
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [signal.default_int_handler,
                                                                               interrupt_job]
    with pytest.raises(Interrupted) as stopped:
        signal.raise_signal(signal.SIGTERM)
    assert (stopped.value.exit_status, stopped.value.message) == (143, "error: interrupted (SIGTERM)")

    def theirs(signum, frame):
        pass

    signal.signal(signal.SIGTERM, theirs)
    stop_at_start_up(LINE)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [interrupt_start_up, theirs]
    started()
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [signal.default_int_handler, theirs]

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent/error.json")
    stop_at_start_up(LINE)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [signal.default_int_handler,
                                                                               signal.SIG_DFL]


def test_a_start_up_signal_whose_exception_a_finalizer_lost_stops_the_job_where_it_begins():
    """The handler runs wherever the main thread is; in a ``__del__`` what it raises is only reported (and dropped),
    so the start-up goes on (seen once: ``python -m opd.torchrun`` started its workers after a Ctrl-C). Where the
    job begins, it stops with the signal's line instead."""
    raise_if_signalled()  # no signal: nothing

    class Finalized:
        def __del__(self):
            interrupt_start_up(signal.SIGTERM, None)  # as if the signal came while this ran

    Finalized()  # freed at once; the Interrupted is lost
    with pytest.raises(Interrupted) as stopped:
        started()
    assert (stopped.value.exit_status, stopped.value.message) == (143, "tool: interrupted (SIGTERM) while starting")


# command -> its arguments and a library it maps while it starts: PyYAML's C extension (Hydra being imported, before
# torch), and for the torchrun launcher and the embedded server, which import torch first, torch's first one
STARTING = {"train": (["opd/train.py", "out_dir={out}", "hydra.run.dir={run}"], "_yaml"),
            "sft": (["opd/sft.py", "out_dir={out}", "hydra.run.dir={run}"], "_yaml"),
            "evaluate": (["opd/evaluate.py", "out_dir={out}", "hydra.run.dir={run}"], "_yaml"),
            "torchrun": (["-m", "opd.torchrun", "--standalone", "--nproc_per_node=2", "opd/train.py", "out_dir={out}",
                          "hydra.run.dir={run}"], "libtorch_global_deps"),
            "serve": (["-m", "launch.chat_server", "--checkpoint", "{out}/model.pth"], "libtorch_global_deps"),
            "study": (["-m", "experiments.study.study", "out_dir={out}"], "_yaml"),
            "recipe": (["-m", "experiments.recipe.recipe", "out_dir={out}"], "_yaml")}


@pytest.mark.parametrize("name, signum", [("train", signal.SIGINT), ("train", signal.SIGTERM), ("sft", signal.SIGTERM),
                                          ("evaluate", signal.SIGINT), ("torchrun", signal.SIGINT),
                                          ("torchrun", signal.SIGTERM), ("serve", signal.SIGINT),
                                          ("serve", signal.SIGTERM), ("study", signal.SIGINT),
                                          ("recipe", signal.SIGTERM)])
def test_a_signal_while_a_command_starts_is_one_line_and_130_or_143(tmp_path, name, signum):
    """Without the start-up handler, SIGINT was a ``KeyboardInterrupt`` traceback from inside an import and SIGTERM a
    silent kill; ``python -m opd.torchrun`` starts no worker (torchrun's own handlers come with them)."""
    arguments, library = STARTING[name]
    out, run = tmp_path / "out", tmp_path / "run"
    process = subprocess.Popen([sys.executable, *(argument.format(out=out, run=run) for argument in arguments)],
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: loaded(process.pid, library), process, f"{library} is mapped")
    process.send_signal(signum)
    _, stderr = communicate(process)
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert stderr.splitlines() == [f"error: interrupted ({signal.Signals(signum).name}) while starting"]
    assert not out.exists() and not run.exists()
