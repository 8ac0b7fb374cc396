"""``common.stop_signals.handling``: a job's own handler takes SIGINT and SIGTERM for a block, each signal only over
Python's default handler or common.start_up's, in the main thread only, and the previous handlers are back after."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from common.start_up import interrupt_job, interrupt_start_up
from common.stop_signals import handling, held
from common.user_errors import Interrupted


def handler(signum, frame):
    raise AssertionError("never called")


def foreign(signum, frame):
    raise AssertionError("never called")


@pytest.fixture(autouse=True)
def defaults():
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, restored in previous.items():
        signal.signal(signum, restored)


@pytest.mark.parametrize("before", [None, interrupt_start_up, interrupt_job])
def test_the_handler_takes_both_signals_over_the_defaults_and_common_start_ups(before):
    """``interrupt_job``: SIGTERM once the job runs (``common.start_up.started``), e.g. before opd's step loop."""
    if before is not None:
        signal.signal(signal.SIGTERM, before)
    expected = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
    with handling(handler) as taken:
        assert taken == {signal.SIGINT, signal.SIGTERM}
        assert signal.getsignal(signal.SIGINT) is handler and signal.getsignal(signal.SIGTERM) is handler
    assert {signum: signal.getsignal(signum) for signum in expected} == expected


@pytest.mark.parametrize("other", [foreign, signal.SIG_IGN])
def test_a_signal_someone_else_handles_or_ignores_stays_so(other):
    """SIG_IGN: SIGINT of a job a shell started in the background; its SIGTERM is still the job's."""
    signal.signal(signal.SIGINT, other)
    with handling(handler) as taken:
        assert taken == {signal.SIGTERM}
        assert signal.getsignal(signal.SIGINT) is other and signal.getsignal(signal.SIGTERM) is handler
    assert signal.getsignal(signal.SIGINT) is other and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_outside_the_main_thread_nothing_changes():
    seen = []

    def block():
        with handling(handler) as taken:
            seen.append((taken, signal.getsignal(signal.SIGTERM)))

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == [(set(), signal.SIG_DFL)]


def test_held_signals_take_effect_when_the_block_ends_by_the_handlers_they_would_have_met():
    original = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt_job)
    ran = []
    try:
        with pytest.raises(KeyboardInterrupt) as caught, held():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            ran.append("the block ran on")
        assert ran == ["the block ran on"] and not isinstance(caught.value, Interrupted)  # one Ctrl-C, after it
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(Interrupted) as caught, held():  # a block that fails still gets its signal
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("the block's own")
        assert caught.value.exit_status == 143 and isinstance(caught.value.__context__, RuntimeError)
        assert signal.getsignal(signal.SIGTERM) is interrupt_job
    finally:
        for signum, handler in original.items():
            signal.signal(signum, handler)
