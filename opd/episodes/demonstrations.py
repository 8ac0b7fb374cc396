"""Fixed token sequences from a dataset's own conversations: the assistant turns are the targets.

A demonstration is an agent JSONL row that goes on past the prompt (the messages before the first assistant turn)
and ends with an assistant turn. Its ids are built exactly as a rollout's, each piece encoded on its own: the
templated prompt, then per assistant turn the template's rendering plus the EOS id (targets), then the context up
to the next generation prompt. An assistant message with ``"weight": 0`` stays in the sequence as context only.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path

from common.chat_records import (
    MESSAGE_COLUMNS,
    AgentRecord,
    RecordError,
    load_agent_records,
    message_column,
    parse_message,
    parse_record,
    read_rows,
)
from common.run_log import progress_bar, show
from common.stop_signals import held
from common.user_errors import UserError
from opd.episodes.chat_format import ChatFormat, PromptTooLongError
from opd.episodes.episode import ANSWER, MAX_TURNS, Episode, Turn
from tools.tool_calls import split_tool_calls
from tools.tool_environment import check_call


@dataclass(frozen=True)
class Demonstration:
    """A prompt record plus the whole conversation (prompt messages, then the demonstrated turns)."""

    record: AgentRecord
    messages: list[dict]


def parse_demonstration(row, source: str) -> Demonstration:
    """Validate one row as a demonstration; errors name ``source`` and the offending field."""
    key = (message_column(row) if isinstance(row, dict) else None) or MESSAGE_COLUMNS[0]
    raw = row.get(key) if isinstance(row, dict) else None
    if not isinstance(raw, list) or not raw:
        raise RecordError(f"{source}: needs a non-empty 'messages' or 'conversations' list")
    messages = [parse_message(message, f"{source}: {key}[{i}]") for i, message in enumerate(raw)]
    first = next((i for i, message in enumerate(messages) if message["role"] == "assistant"), None)
    if first is None:
        raise RecordError(f"{source}: {key} has no assistant turn to learn from")
    if first == 0:
        raise RecordError(f"{source}: {key}[0]: starts with an assistant turn; a demonstration needs a prompt first")
    if messages[-1]["role"] != "assistant":
        raise RecordError(f"{source}: {key}[{len(messages) - 1}]: a demonstration must end with an assistant turn")
    if all(message.get("weight", 1) == 0 for message in messages if message["role"] == "assistant"):
        raise RecordError(f"{source}: {key}: every assistant turn has weight 0, so there is nothing to learn from")
    record = parse_record({**row, key: raw[:first]}, source)
    return Demonstration(record, messages)


def load_demonstrations(path: str | Path) -> tuple[list[Demonstration], str]:
    """All demonstrations of a JSONL file, plus the file's sha256."""
    rows, sha256 = read_rows(path)
    return [parse_demonstration(row, source) for row, source in rows], sha256


def load_records(path: str | Path, *, demonstrated: bool) -> tuple[list[AgentRecord], str, list[Demonstration]]:
    """A data file's prompt records, its sha256, and (when ``demonstrated``) their demonstrations, else none."""
    if demonstrated:
        demonstrations, sha256 = load_demonstrations(path)
        return [demonstration.record for demonstration in demonstrations], sha256, demonstrations
    records, sha256 = load_agent_records(path)
    return records, sha256, []


def _continuation(before: str, after: str, source: str, where: str) -> str:
    if not after.startswith(before):
        raise RecordError(
            f"{source}: {where}: the chat template renders this conversation's earlier part differently once "
            "the turn is added (e.g. reasoning in an assistant turn while open_thinking=false), so the turn's "
            "tokens cannot be separated from its context")
    return after[len(before):]


class DemonstrationTooLongError(RecordError):
    """A demonstration longer than ``max_total_len``: fixed sequences are never truncated."""


def _too_long(record: AgentRecord, tokens, max_total_len: int) -> DemonstrationTooLongError:
    return DemonstrationTooLongError(f"{record.source}: the demonstration is {tokens} tokens, over "
                                f"max_total_len={max_total_len} (fixed sequences are never truncated)")


# fewer demonstrations are tokenized in this process: a spawned worker takes seconds to start, and 2 workers on
# 2 cores broke even at about 2,500 (benchmarks/README.md)
POOL_MIN = 2500
CHUNK = 64  # demonstrations per task of a worker


def tokenizing_processes(setting: int | str) -> int:
    """``dataset_num_proc`` as a number: ``auto`` is this process's CPUs shared among the node's ranks, at most 8;
    1 tokenizes in this process."""
    if setting != "auto":
        return int(setting)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS: no affinity
    return max(1, min(8, cpus // max(1, ranks)))


def fitting_episodes(demonstrations: list[Demonstration], chat_format: ChatFormat, max_total_len: int, *,
                     drop_too_long: bool, shown: bool = True, processes: int = 1) -> tuple[list[Demonstration],
                                                                                          list[Episode]]:
    """The demonstrations that fit ``max_total_len`` and their episodes. A longer one is an error, or with
    ``drop_too_long`` left out and logged (leaving out all is an error). ``processes`` > 1 builds them in worker
    processes: the same episodes, in the same order; ``shown`` adds a progress bar."""
    kept, episodes, dropped = [], [], []
    progress = progress_bar("demonstrations", "")
    task = progress.add_task("tokenized", total=len(demonstrations))
    # closing: a run stopped here (an error, Ctrl-C) shuts the pool down now, not at exit after every queued task
    with progress if shown else nullcontext(), closing(tokenized(demonstrations, chat_format, max_total_len,
                                                                 processes)) as built:
        for demonstration, episode in built:
            try:  # one a worker could not build is built here, to raise or be left out exactly as without workers
                if episode is None:
                    episode = demonstration_episode(demonstration, chat_format, max_total_len)
            except (DemonstrationTooLongError, PromptTooLongError):
                if not drop_too_long:
                    raise
                dropped.append(demonstration.record.source)
            else:
                kept.append(demonstration)
                episodes.append(episode)
            progress.advance(task)
    if dropped:
        if not kept:
            raise RecordError(f"every demonstration ({len(dropped)}, first {dropped[0]}) is over "
                              f"max_total_len={max_total_len}")
        show(f"left out {len(dropped)} of {len(demonstrations)} demonstrations over max_total_len={max_total_len} "
             f"(drop_too_long): {', '.join(dropped[:3])}{', ...' if len(dropped) > 3 else ''}")
    return kept, episodes


def tokenized(demonstrations: list[Demonstration], chat_format: ChatFormat, max_total_len: int,
              processes: int) -> Iterator[tuple[Demonstration, Episode | None]]:
    """Each demonstration, in order, with its episode built by a worker, or None where the caller must build it
    (small sets, one process, or a worker's failure). Workers are spawned, not forked (torch's threads run), and
    leave SIGINT/SIGTERM to the caller."""
    if processes < 2 or len(demonstrations) < POOL_MIN:
        yield from ((demonstration, None) for demonstration in demonstrations)
        return
    chunks = [demonstrations[start:start + CHUNK] for start in range(0, len(demonstrations), CHUNK)]
    pool = ProcessPoolExecutor(processes, multiprocessing.get_context("spawn"), _start_worker,
                               (chat_format, max_total_len))
    try:
        with held():  # every chunk is submitted here, and the workers spawned: a signal waits until they have started
            results = pool.map(_episodes, chunks)
        for chunk, built in zip(chunks, results, strict=True):
            for demonstration, episode in zip(chunk, built, strict=True):
                if episode is not None:  # sent without its record, which this process holds
                    episode.record = demonstration.record
                yield demonstration, episode
    except BrokenProcessPool:
        raise UserError("a process tokenizing the demonstrations died (out of memory?)",
                        "dataset_num_proc=1 tokenizes them in the training process") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_WORKER: tuple[ChatFormat, int] | None = None  # a worker's chat format and max_total_len (``_start_worker``)


def _start_worker(chat_format: ChatFormat, max_total_len: int) -> None:
    """A worker's start: ignore the run's signals, and exit within a second once the training process is gone (the
    task queue never reaches end of file: every worker holds its write end too)."""
    global _WORKER
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _WORKER = chat_format, max_total_len
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _episodes(chunk: list[Demonstration]) -> list[Episode | None]:
    """A worker's task: the chunk's episodes without their records, None for one that raised (the caller rebuilds
    it, to raise)."""
    chat_format, max_total_len = _WORKER
    built = []
    for demonstration in chunk:
        try:
            episode = demonstration_episode(demonstration, chat_format, max_total_len)
        except Exception:  # noqa: BLE001 - the caller raises it, from its own call
            episode = None
        else:
            episode.record = None
        built.append(episode)
    return built


def demonstration_episode(demonstration: Demonstration, chat_format: ChatFormat,
                          max_total_len: int | None = None) -> Episode:
    """The demonstration as a finished episode: exact ids, one turn per assistant message, its calls checked."""
    record, messages = demonstration.record, demonstration.messages
    if max_total_len is not None:  # far too long: refused before tokenizing it (seconds per megabyte)
        floor = chat_format.token_floor(chat_format.render(messages, record.tools, generation_prompt=False))
        if floor > max_total_len:
            raise _too_long(record, f"at least {floor}", max_total_len)
    eos, eos_id = chat_format.tokenizer.eos_token, chat_format.eos_token_id
    ids = chat_format.prompt_ids(record, max_total_len)
    episode = Episode(record, len(ids), list(ids))
    assistant_at = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    before = chat_format.render(messages[:assistant_at[0]], record.tools) if assistant_at else ""
    for number, index in enumerate(assistant_at):
        where = f"message {index}"
        rendered = _continuation(before, chat_format.render(messages[:index + 1], record.tools,
                                                            generation_prompt=False), record.source, where)
        text, found, _ = rendered.partition(eos)
        if not found:
            raise RecordError(f"{record.source}: {where}: the template did not end the assistant turn with {eos!r}")
        start = len(episode.ids)
        episode.ids += chat_format.encode(text) + [eos_id]
        _, calls = split_tool_calls(chat_format.decode(episode.ids[start:]))
        turn = Turn(start, len(episode.ids), [check_call(call, record.declared_tools) for call in calls],
                    trained=messages[index].get("weight", 1) == 1)
        episode.turns.append(turn)
        if number + 1 < len(assistant_at):
            following = chat_format.render(messages[:assistant_at[number + 1]], record.tools)
            episode.ids += chat_format.encode(_continuation(before + text + eos, following, record.source, where))
            turn.observation_end = len(episode.ids)
            before = following  # the next turn's context: each prefix is rendered once
    if max_total_len is not None and len(episode.ids) > max_total_len:
        raise _too_long(record, len(episode.ids), max_total_len)
    episode.stop_reason = MAX_TURNS if any(call.answered for call in episode.turns[-1].calls) else ANSWER
    return episode
