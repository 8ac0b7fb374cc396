"""How fast SFT and offline KD turn demonstrations into token sequences (``make bench-tokenize``): ``fitting_episodes``
in the training process and spread over worker processes (``dataset_num_proc``), on the study's checked chain
demonstrations (H = 1, 2, 4, 6, equally many of each), with a check that every setting builds the same episodes.

    python -m benchmarks.demonstration_tokenizing [--count 6000] [--processes 1,2] [--repeats 2] [--tokenizer PATH]

Each setting is timed ``--repeats`` times, alternating, and the fastest run kept; a run with workers includes
starting them (spawned processes that import torch and receive the tokenizer). The tokenizer is ``--tokenizer``,
$MINIMIND_TOKENIZER, ../shared/minimind3-tokenizer, or the stand-in.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import fitting_episodes, load_demonstrations

HORIZONS = (1, 2, 4, 6)


def demonstrations_file(folder: Path, count: int) -> Path:
    """``count`` checked chain demonstrations (rounded down to a multiple of the horizons), written by the study's
    own task command."""
    from experiments.study import chain_task

    chain_task.main(["--out", str(folder), "--train", str(count // len(HORIZONS)), "--distill", "1",
                     "--horizons", ",".join(map(str, HORIZONS)), "--checked", "--checked-operand"])
    return folder / "train_demonstrations.jsonl"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=6000, help="demonstrations (the study's SFT files hold 6,000)")
    parser.add_argument("--processes", default="1,2", help="comma list of dataset_num_proc values to time")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--out", default="out/bench/demonstration_tokenizing.json")
    args = parser.parse_args(argv)
    # imported here, not above: each spawned worker imports this module again, and should import what a training
    # run's workers import (opd.episodes.demonstrations), not the other benchmark's models
    from benchmarks.opd_training import bench_tokenizer

    console = Console()
    tokenizer, source = bench_tokenizer(args.tokenizer)
    chat_format = ChatFormat(tokenizer)
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as folder:
        demonstrations, _ = load_demonstrations(demonstrations_file(Path(folder), args.count))
    settings = [int(value) for value in args.processes.split(",")]
    seconds: dict[int, float] = {}
    built: dict[int, str] = {}  # a digest of the episodes: a run's own objects are freed before the next is timed
    for _ in range(args.repeats):
        for processes in settings:
            gc.collect()  # (a heap full of the last run's lists makes the collector slow down the next)
            started = time.perf_counter()
            _, episodes = fitting_episodes(demonstrations, chat_format, 4096, drop_too_long=False, shown=False,
                                           processes=processes)
            seconds[processes] = min(seconds.get(processes, float("inf")), time.perf_counter() - started)
            built[processes] = hashlib.sha256(repr([(episode.record.source, episode.ids, episode.turns,
                                                     episode.stop_reason) for episode in episodes]).encode()).hexdigest()
            tokens = sum(len(episode.ids) for episode in episodes)
            del episodes
    same = {processes: digest == built[settings[0]] for processes, digest in built.items()}
    table = Table(title=f"{len(demonstrations)} demonstrations, {tokens} tokens ({source})")
    for column in ("dataset_num_proc", "seconds", "demonstrations/s", f"vs {settings[0]}", "same episodes"):
        table.add_column(column, justify="right")
    for processes in settings:
        table.add_row(str(processes), f"{seconds[processes]:.2f}", f"{len(demonstrations) / seconds[processes]:.0f}",
                      f"{seconds[settings[0]] / seconds[processes]:.2f}x", str(same[processes]))
    console.print(table)
    result = {"demonstrations": len(demonstrations), "tokens": tokens, "tokenizer": source, "repeats": args.repeats,
              "seconds": seconds, "same_episodes": same}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not all(same.values()):
        raise SystemExit("error: the settings built different episodes")
    return result


if __name__ == "__main__":
    main()
