"""The progress bar of a regen run: the conversations dealt with out of the run's total when it is known (a
``.jsonl``'s rows up to ``limit``, less what a resumed run skips), and the time remaining at the recent rate."""

from __future__ import annotations

import io
import re

from rich.console import Console

from regen.outputs.progress_view import ProgressView, to_do
from regen.outputs.run_stats import RunStats
from regen.pipeline import SourceRows
from regen.rows.sources import open_source
from regen.settings import DatasetSettings
from tests.helpers.regen_support import EOS, ok, write_jsonl


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording_console(clock: Clock) -> Console:
    return Console(file=io.StringIO(), record=True, width=200, force_terminal=True, get_time=clock)


def test_the_bar_shows_the_total_and_the_time_remaining():
    """8 conversations to do (10 records, 2 done before): 2 dealt with at t+1 s, 6 at t+5 s, so 1/s and 2 s left;
    the records a resumed run skips are not counted."""
    clock, stats = Clock(), RunStats(skipped_done=2)
    console = recording_console(clock)
    view = ProgressView(stats, [], to_do(10, 2), console)
    clock.now += 1
    stats.done, stats.failed = 1, 1
    view.update()
    clock.now += 4
    stats.done, stats.input_errors = 4, 1
    view.update()
    console.print(view.progress.make_tasks_table(view.progress.tasks))
    shown = console.export_text()
    assert " 6/8 | done 4 failed 1 " in shown and "0:00:05 0:00:02" in shown  # elapsed, then remaining
    assert re.match(r"\[regen\] 6/8 eta 0:00:02 \| done 4 failed 1 ", view.log_line())


def test_a_dataset_that_grew_raises_the_total_instead_of_passing_it():
    """Before: 5051/5000 after rows were appended to the file mid-run."""
    clock, stats = Clock(), RunStats()
    view = ProgressView(stats, [], 5, recording_console(clock))
    stats.done = 7
    view.update()
    assert view.log_line().startswith("[regen] 7/7 ")


def test_the_count_agrees_with_the_done_count_beside_it_between_updates():
    """Before: ``60/400 | done 61``: the count was the bar's last update (every 0.5 s), the counters live."""
    clock, stats = Clock(), RunStats()
    console = recording_console(clock)
    view = ProgressView(stats, [], 400, console)
    stats.done = 60
    view.update()
    stats.done = 61  # a conversation finishes before the next update
    console.print(view.progress.make_tasks_table(view.progress.tasks))
    assert " 61/400 | done 61 " in console.export_text()
    assert view.log_line().startswith("[regen] 61/400 ")


def test_without_a_total_the_bar_shows_the_count_and_no_time_remaining():
    clock, stats = Clock(), RunStats()
    view = ProgressView(stats, [], None, recording_console(clock))
    for done in (1, 3):
        clock.now += 1
        stats.done = done
        view.update()
    assert view.log_line().startswith("[regen] 3 | done 3 ")


def test_the_total_is_the_rows_to_read_less_those_done_before(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": str(i)} for i in range(5)])
    source = open_source(DatasetSettings(source="local", path=str(data), format="auto"))
    assert [SourceRows(source, "auto", limit, None).count() for limit in (None, 3, 9)] == [5, 3, 5]
    assert SourceRows(source, "auto", None, "EN").count() is None  # how many pass the filter shows only as read
    assert SourceRows(source, "auto", 3, "EN").count() == 3
    assert (to_do(5, 2), to_do(5, 7), to_do(None, 2)) == (3, 0, None)


def test_a_run_logs_its_total_off_a_terminal(serve, regen, capfd):
    """A resumed run of 5 rows, 2 done before: its status lines count to 3, each whole on one line (the server
    answers in 0.3 s, one request at a time, so the run lasts past the first 0.5 s line)."""
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]), latency_s=0.3)
    rows = [{"id": str(i), "prompt": str(i)} for i in range(5)]
    regen([server.url], rows, "limit=2")
    capfd.readouterr()
    summary, _, _ = regen([server.url], rows, "resume=true", "concurrency=1", "progress_log_s=0.5")
    assert (summary["skipped_already_done"], summary["conversations_done"]) == (2, 3)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[regen] ")]
    assert lines and all(re.fullmatch(r"\[regen\] [0-3]/3( eta \S+)? \| done .* tok/s", line) for line in lines), lines


def test_off_a_terminal_a_long_warning_stays_one_line():
    """Before: the run's console cut lines at rich's 80 columns in a log file or a pipe."""
    from regen.job import run_console, warner

    out = io.StringIO()
    message = "concurrency=auto settled on 64 conversations in flight (the sum of the endpoints' limits): " * 2
    warner(run_console(out))(message)
    assert out.getvalue() == f"warning: {message}\n"
