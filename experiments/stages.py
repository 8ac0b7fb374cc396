"""Running an experiment as stages: each stage one real command of this repo, run as a subprocess once the stages
it reads are done, ``jobs`` at a time, timed, its output in ``logs/{name}.log``, and skipped on a rerun when
``stages/{name}.json`` records the same command, its outputs exist and none of the stages it reads ran again. Each
stage runs in a session of its own, so a stopped run (a failing stage, Ctrl-C, SIGTERM) stops every process a stage
started, not only the stage's own (a pick's SFT, say). Each stage that ends says how many of all are done (the
skipped ones too) and the time since the run began.

A stage has ``threads`` torch threads (``OMP_NUM_THREADS``), or, when ``wide``, all ``jobs × threads`` of the run: a
wide stage starts when nothing else runs, nothing starts beside it, and the stages listed after it wait while it is
ready, so it is never passed over. The thread count is how a stage runs, not what it is: it is recorded in the
stage's file but a different one does not make a done stage run again."""

from __future__ import annotations

import heapq
import itertools
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from common.atomic_write import atomic_write_json
from common.user_errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.2


@dataclass(frozen=True)
class Stage:
    """One step of an experiment: the command it runs, the files it must leave behind, and the stages it reads."""

    name: str
    command: list[str]
    outputs: list[Path]
    needs: tuple[str, ...] = ()
    wide: bool = False  # takes every core of the run (see the module doc): for a stage little else can run beside


def _is_done(stage: Stage, marker: Path) -> dict | None:
    done = json.loads(marker.read_text()) if marker.is_file() else None
    if done and done["command"] == stage.command and all(path.exists() for path in stage.outputs):
        return done
    return None


def _log_tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _skip_done(waiting: list[Stage], results: dict, ran: set[str], checked: set[str], out: Path, rerun: bool,
               console: Console) -> None:
    """Take every waiting stage that is done already (its needs done, none of them run again) out of ``waiting``,
    until none is left, so that the stages to start are chosen in listed order among all that can start. Each
    stage is checked once, when its needs are first done (``checked``)."""
    skipped = True
    while skipped:
        skipped = False
        for stage in [stage for stage in waiting
                      if stage.name not in checked and all(need in results for need in stage.needs)]:
            checked.add(stage.name)
            done = None if rerun or ran & set(stage.needs) else _is_done(stage, out / "stages" / f"{stage.name}.json")
            if done:
                waiting.remove(stage)
                results[stage.name], skipped = {"wall_s": done["wall_s"], "reused": True}, True
                console.print(f"[dim]{stage.name}: done earlier ({done['wall_s']:.0f} s), skipped[/]")


def stages_to_start(ready: list[Stage], running: list[Stage], jobs: int) -> list[Stage]:
    """Of the ``ready`` stages (in listed order), the ones to start now beside ``running``: the first ones, while a
    slot of ``jobs`` is free; a wide stage only alone, and while it waits none after it starts."""
    if any(stage.wide for stage in running):
        return []
    start = []
    for stage in ready:
        if len(running) + len(start) >= jobs or (stage.wide and (running or start)):
            break
        start.append(stage)
        if stage.wide:
            break
    return start


def replay(stages: list[Stage], wall: dict[str, float], jobs: int) -> float:
    """The wall time ``run_stages`` takes for ``stages`` from nothing when each runs ``wall[name]`` seconds: the same
    start rule (``stages_to_start``), without its polling. A study's stage times so give what it costs from nothing,
    also when it reused most of them (it reproduced the second full study's 8,754 s from that run's stage times)."""
    clock, done, waiting, running, started = 0.0, set(), list(stages), [], itertools.count()
    while waiting or running:
        ready = [stage for stage in waiting if set(stage.needs) <= done]
        for stage in stages_to_start(ready, [stage for _, _, stage in running], jobs):
            waiting.remove(stage)
            heapq.heappush(running, (clock + wall[stage.name], next(started), stage))  # ends, then start order
        if not running:
            raise RuntimeError(f"stages wait on stages that do not exist: {[stage.name for stage in waiting]}")
        clock, _, stage = heapq.heappop(running)
        done.add(stage.name)
    return clock


def run_stages(stages: list[Stage], out: Path, *, jobs: int, threads: int, rerun: bool,
               console: Console) -> dict[str, dict]:
    """Run every stage once the stages it needs are done, ``jobs`` at a time; returns name -> {wall_s, reused}.

    A failing stage stops the others and raises ``UserError`` naming it and its log.
    """
    if jobs < 1 or threads < 1:
        raise UserError(f"jobs and threads must be >= 1, got jobs={jobs}, threads={threads}")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    results, ran, checked, waiting, running = {}, set(), set(), list(stages), {}
    begun = time.perf_counter()
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)  # a terminated experiment stops its stages too
    try:
        while waiting or running:
            _skip_done(waiting, results, ran, checked, out, rerun, console)
            ready = [stage for stage in waiting if all(need in results for need in stage.needs)]
            for stage in stages_to_start(ready, [stage for stage, *_ in running.values()], jobs):
                waiting.remove(stage)
                count = threads * jobs if stage.wide else threads
                env = {**os.environ, "OMP_NUM_THREADS": str(count), "MKL_NUM_THREADS": str(count)}
                log = out / "logs" / f"{stage.name}.log"
                with log.open("w") as stream:
                    process = subprocess.Popen(stage.command, cwd=REPO_ROOT, env=env, stdout=stream,
                                               stderr=subprocess.STDOUT, start_new_session=True)
                running[stage.name] = (stage, process, time.perf_counter(), log, count)
                console.print(f"[bold]{stage.name}[/]: started ({count} thread{'s' * (count > 1)}, log {log})")
            if waiting and not running and not any(all(n in results for n in s.needs) for s in waiting):
                raise RuntimeError(f"stages wait on stages that do not exist: {[s.name for s in waiting]}")
            time.sleep(POLL_S)
            for name, (stage, process, started, log, count) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                wall = time.perf_counter() - started
                if process.returncode != 0:
                    console.print(_log_tail(log), style="dim", soft_wrap=True, markup=False)
                    raise UserError(f"stage {name!r} failed (exit {process.returncode}); its log: {log}")
                missing = [str(path) for path in stage.outputs if not path.exists()]
                if missing:
                    raise RuntimeError(f"stage {name!r} finished without writing {missing}")
                atomic_write_json(out / "stages" / f"{name}.json",
                                  {"command": stage.command, "wall_s": wall, "threads": count})
                results[name], ran = {"wall_s": wall, "reused": False}, ran | {name}
                elapsed = time.strftime("%H:%M:%S", time.gmtime(time.perf_counter() - begun))
                console.print(f"[bold]{name}[/]: done in {wall:.0f} s ({len(results)} of {len(stages)} stages done, "
                              f"{elapsed} since the start)")
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        for _, process, *_ in running.values():  # each stage is a process group: its own children stop too
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            process.wait()
    return {stage.name: results[stage.name] for stage in stages}
