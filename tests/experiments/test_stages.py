"""The stage runner (experiments.stages): order and parallelism, the manifest that recognises a finished stage by its
settings and the contents of what it read and wrote (in any folder), the refusals that keep finished work, rebuilt
stages, the per-sitting time limit, the folder's .gitignore, and how a run stops."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from common.user_errors import UserError
from experiments.stages import Stage, replay, run_stages, stages_to_start
from tests.helpers.paths import REPO_ROOT

QUIET = Console(quiet=True)


def script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def writer(path: Path, text: str = "x", sleep: float = 0.0) -> list[str]:
    return script(f"import time, pathlib; time.sleep({sleep}); pathlib.Path({str(path)!r}).write_text({text!r})")


def manifest(run: Path) -> dict[str, dict]:
    return {entry["stage"]: entry for entry in map(json.loads, (run / "manifest.jsonl").read_text().splitlines())}


def test_stages_run_after_what_they_read_two_at_a_time_and_are_skipped_when_done(tmp_path):
    log = tmp_path / "order.txt"

    def step(name: str, needs=(), sleep=1.0):  # long enough for both of a pair to start on a loaded machine
        body = (f"import time, pathlib; p = pathlib.Path({str(log)!r}); "
                f"p.open('a').write('start {name}\\n'); time.sleep({sleep}); p.open('a').write('end {name}\\n'); "
                f"pathlib.Path({str(tmp_path / name)!r}).write_text('done')")
        return Stage(name, script(body), [tmp_path / name], tuple(needs))

    stages = [step("a"), step("b"), step("c", ["a"]), step("d", ["a", "b"])]
    shown = Console(file=io.StringIO(), width=200)
    first = run_stages(stages, tmp_path, jobs=2, threads=1, console=shown)
    events = log.read_text().splitlines()
    assert {name for name, result in first.items() if not result["reused"]} == {"a", "b", "c", "d"}
    assert events.index("end a") < events.index("start c") and events.index("end b") < events.index("start d")
    running, most = 0, 0
    for event in events:
        running += 1 if event.startswith("start") else -1
        most = max(most, running)
    assert most == 2  # a and b ran together, never three at once
    # each stage that ends says how far the run is: stages done of all, time since the start
    done = {name: int(count) for name, count in re.findall(
        r"(\w): done in \d+ s \((\d) of 4 stages done, \d\d:\d\d:\d\d since the start\)", shown.file.getvalue())}
    assert sorted(done.values()) == [1, 2, 3, 4] and done["c"] > done["a"] and done["d"] > max(done["a"], done["b"])
    again = run_stages(stages, tmp_path, jobs=2, threads=1, console=QUIET)
    assert all(result["reused"] for result in again.values()) and len(log.read_text().splitlines()) == 8
    # stages start in listed order among all that can start, also behind skipped ones: with a reused, c (listed
    # first, reading a) takes the one slot before e, which reads nothing
    lines = manifest(tmp_path)
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(lines[name]) + "\n" for name in "abd"))
    log.write_text("")
    run_stages([stages[0], stages[2], step("e")], tmp_path, jobs=1, threads=1, console=QUIET)
    assert log.read_text().splitlines() == ["start c", "end c", "start e", "end e"]


def test_the_manifest_records_what_a_stage_read_and_wrote_without_this_machines_paths(tmp_path):
    run, tokenizer = tmp_path / "run", tmp_path / "elsewhere" / "tok"
    tokenizer.mkdir(parents=True)
    (tokenizer / "vocab.json").write_text("{}")
    stages = [Stage("a", writer(run / "a.txt", "A"), [run / "a.txt"]),
              Stage("b", script(f"import pathlib; t = pathlib.Path({str(tokenizer)!r}); "
                                f"pathlib.Path({str(run / 'sub' / 'b.txt')!r}).parent.mkdir(); "
                                f"pathlib.Path({str(run / 'sub' / 'b.txt')!r}).write_text('B')"),
                    [run / "sub" / "b.txt"], ("a",))]
    run_stages(stages, run, jobs=1, threads=2, console=QUIET, places={"tokenizer": tokenizer})
    lines = manifest(run)
    sha = {name: __import__("hashlib").sha256(text.encode()).hexdigest() for name, text in (("A", "A"), ("B", "B"))}
    assert lines["a"]["outputs"] == {"a.txt": sha["A"]} and lines["a"]["inputs"] == {}
    assert lines["b"]["outputs"] == {"sub/b.txt": sha["B"]}
    assert set(lines["b"]["inputs"]) == {"a.txt", "{tokenizer}"} and lines["b"]["inputs"]["a.txt"] == sha["A"]
    command = lines["b"]["commands"][0]
    assert command[0] == "python" and "{tokenizer}" in command[2] and "{run}/sub/b.txt" in command[2]
    assert str(tmp_path) not in json.dumps(lines["b"]["commands"])
    assert lines["b"]["threads"] == 2 and lines["b"]["wall_s"] >= 0 and lines["b"]["machine"]["cpu"]
    assert {"torch", "python", "finished"} <= lines["b"].keys()

    # a clone in another folder, the tokenizer elsewhere: every stage is recognised and skipped
    moved, moved_tokenizer = tmp_path / "clone" / "run", tmp_path / "other" / "tok"
    shutil.copytree(run, moved, ignore=shutil.ignore_patterns("logs", ".lock"))
    shutil.copytree(tokenizer, moved_tokenizer)
    there = [Stage("a", writer(moved / "a.txt", "A"), [moved / "a.txt"]),
             Stage("b", [part.replace(str(run), str(moved)).replace(str(tokenizer), str(moved_tokenizer))
                         for part in stages[1].command], [moved / "sub" / "b.txt"], ("a",))]
    assert all(r["reused"] for r in run_stages(there, moved, jobs=1, threads=1, console=QUIET,
                                               places={"tokenizer": moved_tokenizer}).values())

    # a changed input is refused, naming it; so is a changed output or a changed setting: nothing is overwritten
    (moved_tokenizer / "vocab.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match=r"stage b: its input \{tokenizer\} no longer matches it .*manifest.jsonl:2"):
        run_stages(there, moved, jobs=1, threads=1, console=QUIET, places={"tokenizer": moved_tokenizer})
    (moved / "a.txt").write_text("edited")
    with pytest.raises(UserError, match=r"stage a: its output a.txt no longer matches it"):
        run_stages(there, moved, jobs=1, threads=1, console=QUIET, places={"tokenizer": moved_tokenizer})
    (moved / "a.txt").unlink()
    with pytest.raises(UserError, match=r"stage a: its output a.txt is missing"):
        run_stages(there, moved, jobs=1, threads=1, console=QUIET, places={"tokenizer": moved_tokenizer})
    changed = [Stage("a", writer(moved / "a.txt", "other"), [moved / "a.txt"])]
    with pytest.raises(UserError, match=r"stage a finished with other settings .*manifest.jsonl:1"):
        run_stages(changed, moved, jobs=1, threads=1, console=QUIET)
    assert not (moved / "a.txt").exists()


def test_the_folders_gitignore_keeps_the_manifest_and_outputs_only(tmp_path):
    run = tmp_path / "run"
    stages = [Stage("data", writer(run / "data.txt", "D"), [run / "data.txt"], rebuilt=True),
              Stage("model", script(f"import pathlib; r = pathlib.Path({str(run)!r}); (r / 'scratch').mkdir(); "
                                    "(r / 'scratch' / 'resume.pth').write_text('R'); (r / 'm').mkdir(); "
                                    "(r / 'm' / 'w.safetensors').write_text('W')"), [run / "m" / "w.safetensors"],
                    ("data",))]
    run_stages(stages, run, jobs=1, threads=1, console=QUIET, keep=("README.md",))
    (run / "README.md").write_text("why")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    tracked = subprocess.run(["git", "-C", str(tmp_path), "ls-files"], capture_output=True, text=True).stdout.split()
    assert sorted(tracked) == ["run/.gitignore", "run/README.md", "run/m/w.safetensors", "run/manifest.jsonl"]


def test_a_rebuilt_stage_runs_again_where_its_outputs_are_missing_and_must_write_the_same_bytes(tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("one")
    command = script(f"import pathlib; pathlib.Path({str(tmp_path / 'data.txt')!r}).write_text("
                     f"pathlib.Path({str(source)!r}).read_text())")
    stages = [Stage("data", command, [tmp_path / "data.txt"], rebuilt=True),
              Stage("use", writer(tmp_path / "use.txt"), [tmp_path / "use.txt"], ("data",))]
    run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)
    (tmp_path / "data.txt").unlink()
    again = run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)
    assert not again["data"]["reused"] and again["use"]["reused"] and len(manifest(tmp_path)) == 2
    (tmp_path / "data.txt").unlink()
    source.write_text("two")  # the same command writes other bytes: refused, the manifest kept
    with pytest.raises(UserError, match=r"stage data was run again and wrote data.txt other than .*manifest.jsonl:1"):
        run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)


def test_then_commands_run_in_order_in_the_same_stage_and_a_failing_one_records_nothing(tmp_path):
    out = tmp_path / "out.txt"
    append = [script(f"import pathlib; p = pathlib.Path({str(out)!r}); p.write_text("
                     f"(p.read_text() if p.exists() else '') + {word!r}); print({word!r})") for word in "abc"]
    run_stages([Stage("s", append[0], [out], then=(append[1], append[2]))], tmp_path, jobs=1, threads=1,
               console=QUIET)
    assert out.read_text() == "abc" and (tmp_path / "logs" / "s.log").read_text().split() == ["a", "b", "c"]
    failing = Stage("f", writer(tmp_path / "f.txt"), [tmp_path / "f.txt"], then=(script("import sys; sys.exit(4)"),))
    with pytest.raises(UserError, match=r"stage 'f' failed \(exit 4\)"):
        run_stages([failing], tmp_path, jobs=1, threads=1, console=QUIET)
    assert "f" not in manifest(tmp_path)


def test_a_sitting_limit_starts_no_stage_it_cannot_finish_and_names_what_remains(tmp_path):
    def stage(name: str, estimate: float | None, needs=()):
        return Stage(name, writer(tmp_path / name), [tmp_path / name], tuple(needs), estimate_s=estimate)

    stages = [stage("seed0-short", 1.0), stage("seed0-long", 500.0), stage("seed1-short", 2.0),
              stage("after", 1.0, ("seed0-long",)), stage("unknown", None)]
    shown = Console(file=io.StringIO(), width=300)
    done = run_stages(stages, tmp_path, jobs=1, threads=1, console=shown, max_wall_s=100)
    assert set(done) == {"seed0-short", "seed1-short"}
    assert not (tmp_path / "seed0-long").exists() and not (tmp_path / "unknown").exists()
    said = shown.file.getvalue()
    assert "max_wall_s=100: 3 stage(s) remain, projected 501 s with jobs=1 (no time known for ['unknown'])" in said
    assert "seed0-long, after, unknown" in said
    # the next sitting, without a limit, runs the rest; a measured kind projects its other seeds
    assert set(run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)) == {s.name for s in stages}
    measured = manifest(tmp_path)["seed0-short"]["wall_s"]
    again = [*stages, stage("seed2-short", 10_000.0)]
    shown = Console(file=io.StringIO(), width=300)
    assert "seed2-short" in run_stages(again, tmp_path, jobs=1, threads=1, console=shown, max_wall_s=measured + 60)


def test_a_wide_stage_starts_alone_and_the_stages_after_it_wait():
    a, b, c, x = (Stage(name, [], []) for name in "abcx")
    wide = Stage("w", [], [], wide=True)
    assert stages_to_start([a, b, c], [], jobs=2) == [a, b]
    assert stages_to_start([a, b], [x], jobs=2) == [a]
    assert stages_to_start([a, wide, b], [], jobs=2) == [a]  # w is next: b, listed after it, does not pass it
    assert stages_to_start([wide, b], [], jobs=2) == [wide]
    assert stages_to_start([wide, b], [x], jobs=2) == []  # w waits for x, and b waits for w
    assert stages_to_start([a, b], [wide], jobs=2) == []
    assert stages_to_start([wide], [], jobs=1) == [wide]


def test_replay_gives_the_wall_time_of_the_runners_start_rule():
    def stages(wide: bool) -> list[Stage]:
        return [Stage("a", [], []), Stage("b", [], []), Stage("c", [], [], ("a",)),
                Stage("w", [], [], ("b",), wide), Stage("d", [], [], ("w",))]

    wall = {"a": 3.0, "b": 1.0, "c": 2.0, "w": 4.0, "d": 1.0}
    # a, b at 0; w ready at 1 but waits for a; at 3 c (listed first) starts, w waits for it; w 5-9 alone; d 9-10
    assert replay(stages(True), wall, jobs=2) == 10.0
    # narrow: w starts at 1 beside a, ends at 5 with c (3-5); d 5-6
    assert replay(stages(False), wall, jobs=2) == 6.0
    assert replay(stages(False), wall, jobs=1) == sum(wall.values())
    # the stages left by a sitting: needs outside the list are done
    assert replay(stages(False)[2:], wall, jobs=2) == 5.0  # c and w at 0, d 4-5


def test_a_wide_stage_gets_every_thread_and_a_thread_change_reruns_nothing(tmp_path):
    def threads_of(name: str, needs=(), wide=False):
        body = (f"import os, pathlib; pathlib.Path({str(tmp_path / name)!r})"
                ".write_text(os.environ['OMP_NUM_THREADS'] + ' ' + os.environ['MKL_NUM_THREADS'])")
        return Stage(name, script(body), [tmp_path / name], tuple(needs), wide)

    stages = [threads_of("a"), threads_of("w", ["a"], wide=True), threads_of("b", ["w"])]
    run_stages(stages, tmp_path, jobs=2, threads=3, console=QUIET)
    assert [(tmp_path / name).read_text() for name in "awb"] == ["3 3", "6 6", "3 3"]
    assert [manifest(tmp_path)[name]["threads"] for name in "awb"] == [3, 6, 3]
    again = run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)
    assert all(result["reused"] for result in again.values())


def test_a_failing_stage_stops_the_run_naming_its_log(tmp_path):
    stages = [Stage("fine", writer(tmp_path / "fine"), [tmp_path / "fine"]),
              Stage("broken", script("import sys; print('it broke'); sys.exit(3)"), [tmp_path / "never"]),
              Stage("after", writer(tmp_path / "after"), [tmp_path / "after"], ("broken",))]
    with pytest.raises(UserError, match=r"stage 'broken' failed \(exit 3\); its log: .*broken.log"):
        run_stages(stages, tmp_path, jobs=1, threads=1, console=QUIET)
    assert "it broke" in (tmp_path / "logs" / "broken.log").read_text()
    assert not (tmp_path / "after").exists() and set(manifest(tmp_path)) == {"fine"}


def test_a_malformed_manifest_line_is_named(tmp_path):
    (tmp_path / "manifest.jsonl").write_text('{"stage": "a"}\n')
    with pytest.raises(UserError, match=r"manifest.jsonl:1: a stage line lacks \['commands'"):
        run_stages([Stage("a", writer(tmp_path / "a"), [tmp_path / "a"])], tmp_path, jobs=1, threads=1, console=QUIET)


def _runner(tmp_path, stage: list[str]) -> subprocess.Popen:
    """A process running ``stage`` as the only stage of a run in ``tmp_path``, as the recipe and study do."""
    return subprocess.Popen([sys.executable, "-c", (
        "from pathlib import Path; from rich.console import Console; "
        "from experiments.stages import Stage, run_stages; from common.user_errors import exit_on_user_error\n"
        f"with exit_on_user_error(): run_stages([Stage('stage', {stage!r}, [])], Path({str(tmp_path)!r}), jobs=1, "
        "threads=1, console=Console(quiet=True))")], cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)


def test_a_terminated_run_stops_the_stages_it_runs(tmp_path):
    pid_file = tmp_path / "stage.pid"
    stage = script(f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); "
                   "time.sleep(120)")
    runner = _runner(tmp_path, stage)
    while not pid_file.exists() or not pid_file.read_text():
        assert runner.poll() is None, runner.stderr.read()
        time.sleep(0.05)
    runner.terminate()
    assert runner.wait(timeout=60) == 130 and "error: interrupted" in runner.stderr.read()
    assert not Path(f"/proc/{int(pid_file.read_text())}").exists()  # the stage was stopped and reaped


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie its new parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_terminated_run_stops_what_its_stages_started_too(tmp_path):
    """A stage that runs a command of its own (warm_start runs the SFT it picks from) dies at SIGTERM without
    stopping it: the runner stops the stage's whole process group, so no orphan keeps training."""
    pid_file = tmp_path / "child.pid"
    stage = script("import pathlib, subprocess, sys, time\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                   f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\nchild.wait()")
    runner = _runner(tmp_path, stage)
    while not pid_file.exists() or not pid_file.read_text():
        assert runner.poll() is None, runner.stderr.read()
        time.sleep(0.05)
    runner.terminate()
    assert runner.wait(timeout=60) == 130
    child = int(pid_file.read_text())
    for _ in range(600):  # the signal is sent before the runner exits; the child's exit may lag on a loaded machine
        if _gone(child):
            break
        time.sleep(0.1)
    assert _gone(child)
