"""Running an experiment as stages: each stage one or more real commands of this repo, run as subprocesses once the
stages it reads are done, ``jobs`` at a time, timed, their output in ``logs/{name}.log``. A finished stage is recorded
in the run folder's manifest (``experiments.stage_manifest``) and never runs again there: a later invocation, in any
folder or on any machine, skips it when its commands (free of this machine's paths) and the hashes of its inputs and
outputs match the manifest, and stops with one error naming the file when they do not; a run with other settings
needs a new folder. Each stage runs in a session of its own, so a stopped run (a failing stage, Ctrl-C, SIGTERM)
stops every process a stage started. Each stage that ends says how many of all are done and the time since the
run began.

``max_wall_s`` bounds one invocation: no stage starts whose projected end (its kind's mean measured time, from the
manifest or this invocation, else the caller's estimate) falls past it; the stages started finish and are recorded.

A stage has ``threads`` torch threads (``OMP_NUM_THREADS``), or, when ``wide``, all ``jobs × threads`` of the run: a
wide stage starts when nothing else runs, nothing starts beside it, and the stages listed after it wait while it is
ready, so it is never passed over. The thread count is how a stage runs, not what it is: it is recorded in the
manifest but is not compared."""

from __future__ import annotations

import heapq
import itertools
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from common.run_lock import OutputLock
from common.user_errors import UserError
from experiments.stage_manifest import Hashes, Manifest, entry, normalized

REPO_ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.2


@dataclass(frozen=True)
class Stage:
    """One step of an experiment: the command it runs (and ``then``, run after it in the same stage), the files it
    must leave behind, and the stages it reads."""

    name: str
    command: list[str]
    outputs: list[Path]
    needs: tuple[str, ...] = ()
    wide: bool = False  # takes every core of the run (see the module doc): for a stage little else can run beside
    then: tuple[list[str], ...] = ()
    estimate_s: float | None = None  # the projected wall time before any stage of its kind was measured
    # its outputs are a pure function of its command (no torch): git does not keep them; a folder without them runs
    # the stage again, and its outputs must then equal the manifest's
    rebuilt: bool = False

    @property
    def commands(self) -> list[list[str]]:
        return [self.command, *self.then]

    @property
    def kind(self) -> str:
        """Stages of one kind take about as long (the seeds' copies of one stage): the name without ``seed{n}-``."""
        return re.sub(r"^seed\d+-", "", self.name)


def _log_tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class _Record:
    """What the runner knows of the stages: the manifest, the hashes, and each stage's outputs by name."""

    def __init__(self, stages: list[Stage], out: Path, places: dict[str, Path]) -> None:
        self.out, self.places, self.manifest, self.hashes = out, {"run": out, **places}, Manifest(out), Hashes()
        self.by_name = {stage.name: stage for stage in stages}
        for stage in stages:
            outside = [path for path in stage.outputs if not path.resolve().is_relative_to(out)]
            if outside:
                raise RuntimeError(f"stage {stage.name!r} writes outside its run folder {out}: {outside}")

    def commands(self, stage: Stage) -> list[list[str]]:
        return [normalized(command, self.places) for command in stage.commands]

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.out).as_posix()

    def inputs(self, stage: Stage) -> dict[str, str]:
        """sha256 of what ``stage`` reads: the outputs of every stage before it, and each named place its commands
        mention."""
        upstream, todo = set(), list(stage.needs)
        while todo:
            name = todo.pop()
            if name not in upstream:
                upstream.add(name)
                todo.extend(self.by_name[name].needs)
        found = {self.relative(path): self.hashes.of(path) for name in sorted(upstream)
                 for path in self.by_name[name].outputs}
        words = " ".join(word for command in stage.commands for word in command)
        found.update({f"{{{name}}}": self.hashes.of(path) for name, path in self.places.items()
                      if name != "run" and str(path) in words})
        return found

    def finished(self, stage: Stage) -> dict | None:
        """The manifest's line of ``stage`` when it finished with these commands, inputs and outputs; None when it
        never finished; a ``UserError`` naming the file when anything differs (finished work is never redone)."""
        if stage.name not in self.manifest.entries:
            return None
        where, (_, done) = self.manifest.where(stage.name), self.manifest.entries[stage.name]
        commands = self.commands(stage)
        if done["commands"] != commands:
            recorded, now = next((a, b) for a, b in itertools.zip_longest(
                (w for c in done["commands"] for w in c), (w for c in commands for w in c)) if a != b)
            raise UserError(f"stage {stage.name} finished with other settings ({where}: {recorded!r}, now {now!r}); "
                            "its outputs are kept as they are", "run the changed study in a new out_dir")
        if stage.rebuilt and not all(path.is_file() for path in stage.outputs):
            return None  # run again: record() checks that it wrote the same bytes
        for label, recorded, paths in (("input", done["inputs"], None), ("output", done["outputs"], stage.outputs)):
            current = self.inputs(stage) if paths is None else {
                self.relative(path): self.hashes.of(path) for path in paths if path.exists()}
            for key in sorted(recorded.keys() | current.keys()):
                if recorded.get(key) != current.get(key):
                    state = ("is missing" if key not in current else "is not in it" if key not in recorded else
                             f"no longer matches it (sha256 {recorded[key][:12]} recorded, {current[key][:12]} now)")
                    raise UserError(f"stage {stage.name}: its {label} {key} {state} ({where})",
                                    "restore it from git, or run the study in a new out_dir")
        return done

    def record(self, stage: Stage, wall_s: float, threads: int, keep: tuple[str, ...]) -> None:
        missing = [str(path) for path in stage.outputs if not path.is_file()]
        if missing:
            raise RuntimeError(f"stage {stage.name!r} finished without writing {missing}")
        outputs = {self.relative(path): self.hashes.of(path) for path in stage.outputs}
        if stage.name in self.manifest.entries:  # a rebuilt stage (``finished``): the same bytes, or an error
            recorded = self.manifest.entries[stage.name][1]["outputs"]
            differ = sorted(key for key in outputs if outputs[key] != recorded.get(key))
            if differ:
                raise UserError(f"stage {stage.name} was run again and wrote {differ[0]} other than "
                                f"{self.manifest.where(stage.name)} records", "run the study in a new out_dir")
            return
        self.manifest.append({**entry(stage.name, self.commands(stage), self.inputs(stage), outputs, wall_s, threads),
                              "rebuilt": stage.rebuilt})
        self.manifest.write_gitignore(keep)

    def projected(self, stage: Stage, measured: dict[str, float]) -> float | None:
        """``stage``'s projected wall seconds: the mean of its kind's measured times, else its estimate."""
        times = [measured[name] for name, other in self.by_name.items() if other.kind == stage.kind and name in measured]
        return sum(times) / len(times) if times else stage.estimate_s


def _skip_done(waiting: list[Stage], results: dict, checked: set[str], record: _Record, console: Console) -> None:
    """Take every waiting stage that finished earlier (its needs done) out of ``waiting``, until none is left, so
    that the stages to start are chosen in listed order among all that can start. Each stage is checked once,
    when its needs are first done (``checked``)."""
    skipped = True
    while skipped:
        skipped = False
        for stage in [stage for stage in waiting
                      if stage.name not in checked and all(need in results for need in stage.needs)]:
            checked.add(stage.name)
            done = record.finished(stage)
            if done:
                waiting.remove(stage)
                results[stage.name], skipped = {"wall_s": done["wall_s"], "reused": True}, True
                console.print(f"[dim]{stage.name}: done earlier ({done['wall_s']:.0f} s on {done['machine']['cpu']}), "
                              "skipped[/]")


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
    names = {stage.name for stage in stages}
    while waiting or running:
        ready = [stage for stage in waiting if set(stage.needs) & names <= done]
        for stage in stages_to_start(ready, [stage for _, _, stage in running], jobs):
            waiting.remove(stage)
            heapq.heappush(running, (clock + wall[stage.name], next(started), stage))  # ends, then start order
        if not running:
            raise RuntimeError(f"stages wait on stages that do not exist: {[stage.name for stage in waiting]}")
        clock, _, stage = heapq.heappop(running)
        done.add(stage.name)
    return clock


def _start(stage: Stage, index: int, log: Path, count: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(count), "MKL_NUM_THREADS": str(count)}
    with log.open("w" if index == 0 else "a") as stream:
        return subprocess.Popen(stage.commands[index], cwd=REPO_ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run_stages(stages: list[Stage], out: Path, *, jobs: int, threads: int, console: Console,
               places: dict[str, Path] | None = None, max_wall_s: float | None = None,
               keep: tuple[str, ...] = ()) -> dict[str, dict]:
    """Run every stage not finished before once the stages it needs are done, ``jobs`` at a time; returns name ->
    {wall_s, reused} of the stages done, every stage unless ``max_wall_s`` left some. ``places`` names the paths
    outside the run folder that commands read (hashed as inputs); ``keep``: files git keeps beside the outputs.

    A failing stage stops the others and raises ``UserError`` naming it and its log.
    """
    if jobs < 1 or threads < 1:
        raise UserError(f"jobs and threads must be >= 1, got jobs={jobs}, threads={threads}")
    out = out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    lock = OutputLock(out / ".lock", out, job="experiment", hint="wait for it to end, or use another out_dir",
                      remove_on_release=True).acquire()
    record = _Record(stages, out, {name: Path(path).resolve() for name, path in (places or {}).items()})
    measured = {name: done["wall_s"] for name, (_, done) in record.manifest.entries.items()}
    results, checked, waiting, running, held = {}, set(), list(stages), {}, []
    begun = time.perf_counter()
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)  # a terminated experiment stops its stages too
    try:
        while waiting or running:
            _skip_done(waiting, results, checked, record, console)
            ready = [stage for stage in waiting if all(need in results for need in stage.needs) and stage not in held]
            if max_wall_s is not None:
                left = max_wall_s - (time.perf_counter() - begun)
                for stage in ready:
                    projected = record.projected(stage, measured)
                    if projected is None or projected > left:
                        held.append(stage)
                ready = [stage for stage in ready if stage not in held]
            for stage in stages_to_start(ready, [stage for stage, *_ in running.values()], jobs):
                waiting.remove(stage)
                count = threads * jobs if stage.wide else threads
                log = out / "logs" / f"{stage.name}.log"
                running[stage.name] = [stage, _start(stage, 0, log, count), time.perf_counter(), log, count, 0]
                console.print(f"[bold]{stage.name}[/]: started ({count} thread{'s' * (count > 1)}, log {log})")
            if not running:
                if waiting and not held:
                    raise RuntimeError(f"stages wait on stages that do not exist: {[s.name for s in waiting]}")
                break  # the rest wait on stages held by max_wall_s
            time.sleep(POLL_S)
            for name, (stage, process, started, log, count, index) in list(running.items()):
                if process.poll() is None:
                    continue
                if process.returncode != 0:
                    del running[name]
                    console.print(_log_tail(log), style="dim", soft_wrap=True, markup=False)
                    raise UserError(f"stage {name!r} failed (exit {process.returncode}); its log: {log}")
                if index + 1 < len(stage.commands):
                    running[name][1], running[name][5] = _start(stage, index + 1, log, count), index + 1
                    continue
                del running[name]
                wall = time.perf_counter() - started
                record.record(stage, wall, count, keep)
                results[name], measured[name] = {"wall_s": wall, "reused": False}, wall
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
        lock.release()
    left = [stage for stage in stages if stage.name not in results]
    if left:
        projected = {stage.name: record.projected(stage, measured) for stage in left}
        unknown = [name for name, wall in projected.items() if wall is None]
        known = {name: wall for name, wall in projected.items() if wall is not None}
        total = replay([stage for stage in left if stage.name in known], known, jobs) if known else 0.0
        console.print(f"max_wall_s={max_wall_s:g}: {len(left)} stage(s) remain, projected {total:,.0f} s with "
                      f"jobs={jobs}{f' (no time known for {unknown})' if unknown else ''}: "
                      + ", ".join(stage.name for stage in left))
    return results
