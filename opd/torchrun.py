"""``python -m opd.torchrun [torchrun's options] opd/train.py ...``: ``torchrun`` that ends a failed job with its
``error:`` lines once, not with torchrun's ``ChildFailedError`` report and traceback.

It runs ``torch.distributed.run`` itself, so every torchrun option and environment variable works as with
``torchrun``. A rank that stops on a user error writes its lines to torchrun's error file and only rank 0 prints
them (``common.user_errors``); when the job fails this prints, from those files, the lines of the other failed
ranks that differ from rank 0's, one line for a rank killed by a signal (not for one torchrun stopped because
another rank's error ended the job) or one that exited without writing any (its own output says why: a
traceback), then exits with the status of the rank whose error ended the job
(``job_status``; 128 + N for signal N).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

from common.start_up import start_up_interrupts, started, stop_at_start_up
from common.user_errors import exit_on_user_error


def failure_lines(failures: dict) -> list[str]:
    """The lines that tell a person why the job failed, beyond what rank 0 printed: ``failures`` maps a global rank
    to torchrun's ``ProcessFailure`` (its ``exitcode`` and ``error_file``); each text is shown once. A rank that
    SIGTERM killed before it wrote anything, in a job that a rank's own error ended, is one torchrun stopped for that
    error (a rank slower to reach it than torchrun's poll), and gets no line."""
    shown, lines = {written_message(failures[0])} if 0 in failures else set(), []
    ended_by_an_error = any(failure.exitcode >= 0 and written_message(failure) is not None
                            for failure in failures.values())
    for rank, failure in sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0])):
        text = written_message(failure)
        if text is None and ended_by_an_error and failure.exitcode == -signal.SIGTERM:
            continue
        if text is None:
            text = (f"error: rank {rank} was killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
                    else f"error: rank {rank} exited with status {failure.exitcode} (its output above says why)")
        if text not in shown:
            shown.add(text)
            lines.append(text)
    return lines


def written_message(failure) -> str | None:
    """What the rank wrote to its error file as it stopped on a user error (``common.user_errors.report``)."""
    path = Path(failure.error_file)
    if not path.is_file():
        return None
    record = json.loads(path.read_text()).get("message")
    return record.get("message") if isinstance(record, dict) else None


def exit_status(failure) -> int:
    return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode


def job_status(failures: dict) -> int:
    """The job's exit status: that of the rank whose error ended the job. torchrun stops the other ranks with
    SIGTERM once one fails, so a stopped rank can be the first failure (its timestamps are whole seconds), and a rank
    that had written its error lines can be stopped while it exits (CI saw 143 for a job that ended on a user error,
    both times). So the first failure (by time, then rank) that wrote its lines and exited with a status of its own
    gives it, else the first that wrote its lines, else the first failure."""
    ordered = [failure for _, failure in sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0]))]
    written = [failure for failure in ordered if written_message(failure) is not None]
    return exit_status(next((failure for failure in written if failure.exitcode >= 0), (written or ordered)[0]))


def main(argv: list[str] | None = None) -> None:
    stop_at_start_up()  # Ctrl-C while torch imports: one line (torchrun's own handlers come with the workers)
    with exit_on_user_error(), start_up_interrupts():
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        # the failure is reported here, not as torchrun's "failed (exitcode: 1) local_rank: 0 ..." log line
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
        # nor a signal as "Received 15 death signal, shutting down workers": rank 0's line says what it stopped
        logging.getLogger("torch.distributed.elastic.agent.server.api").addFilter(
            lambda record: "death signal" not in record.getMessage())
        arguments = parse_args(argv)
        started()
        try:
            run(arguments)
        except ChildFailedError as failed:
            lines = failure_lines(failed.failures)
            if lines:
                print("\n".join(lines), file=sys.stderr)
            sys.exit(job_status(failed.failures))
        except SignalException as stopped:  # Ctrl-C or SIGTERM: torchrun has stopped the workers, rank 0 said so
            sys.exit(128 + stopped.sigval)


if __name__ == "__main__":
    main()
