"""``python -m opd.torchrun [torchrun's options] opd/train.py ...``: ``torchrun`` that ends a failed job with its
``error:`` lines once, not with torchrun's ``ChildFailedError`` report and traceback; it exits with the status of the
rank whose error ended the job."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

from common.start_up import start_up_interrupts, started, stop_at_start_up
from common.user_errors import exit_on_user_error


def failure_lines(failures: dict) -> list[str]:
    """The lines beyond rank 0's that say why the job failed, each once; a rank SIGTERM killed before writing, in a job
    a rank's own error ended, was stopped by torchrun and gets none."""
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
    """The status of the rank whose error ended the job (torchrun SIGTERMs the rest): the first failure by (time, rank)
    that wrote its lines and exited on its own, else the first that wrote its lines, else the first failure."""
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
