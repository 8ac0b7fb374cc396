"""What a person sees from ``python regen/main.py``: one or two ``error:`` lines and exit 1 for a mistake they can
fix (no traceback unless HYDRA_FULL_ERROR=1), and for Ctrl-C / SIGTERM with every server kind a summary with
status ``interrupted``, no traceback, exit 130 / 143."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
import torch

from common.minimind.model import build_model, save_native
from common.minimind.spec import MiniMindArch
from tests.helpers.entries import Ran, run_main
from tests.helpers.paths import REPO_ROOT, small_tmpfs
from tests.helpers.processes import communicate, loaded
from tests.helpers.regen_support import EOS, ok, read_jsonl, write_jsonl
from tests.helpers.standin_vllm_cli import free_port, install_standin_vllm, wait_until


def regen_cli(*overrides: str, env: dict | None = None, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "regen" / "main.py"), *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True)


def regen_main(*overrides: str, env: dict | None = None) -> Ran:
    """``regen_cli`` inside this process (``tests/helpers/entries.py``), where no separate process is the point."""
    from regen.main import main

    return run_main(main, *overrides, env=env, cwd=REPO_ROOT, program="regen/main.py")


def error_lines(result: subprocess.CompletedProcess | Ran) -> list[str]:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_the_readme_command_without_a_model_says_what_to_add(tmp_path):
    result = regen_main("dataset=magpie", "server.dp=4", f"hydra.run.dir={tmp_path / 'h'}")
    assert error_lines(result) == [
        "error: server.model is required",
        "error: add server.model=<hub id or model folder> (e.g. server.model=Qwen/Qwen3-8B) for server=vllm, "
        "or use server=external 'server.endpoints=[URL]'"]
    assert result.stderr.startswith("error:")  # nothing before it: no server was started, nothing was read
    full = regen_cli("dataset=magpie", "server.dp=4", f"hydra.run.dir={tmp_path / 'h'}",
                     env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr and "ConfigError: server.model is required" in full.stderr


@pytest.mark.parametrize("setup,overrides,expected", [
    (None, ["concurrency=0"], ["error: concurrency must be auto or an integer >= 1, got 0",
                               "error: set it like concurrency=auto (adapts to each endpoint) or concurrency=64"]),
    (None, ["extra_request_params={n: 4}"], ["error: extra_request_params.n=4 is refused: regen writes one row per "
                                             "generation and reads choices[0] only; for several samples per prompt "
                                             "run a multirun over sampling.seed"]),
    ("object", [], ["error: {data} is not a top-level JSON array of rows",
                    "error: wrap the rows in [...], or write one row per line in a .jsonl file"]),
    ("existing", [], ["error: {out} exists from an earlier run",
                      "error: pass resume=true to continue it, or choose another output= (or remove the old files)"]),
    ("blocked", [], ["error: cannot write the output {tmp}/blocked/out.jsonl (File exists)",
                     "error: choose another output= or output_dir="]),
    ("directory", [], ["error: output={out} is a folder, not a file",
                       "error: name a file in it (output={out}/rows.jsonl), or set output_dir={out} instead"]),
], ids=["config-value", "n>1", "json-object", "existing-output", "unwritable-output", "output-is-a-folder"])
def test_user_errors_are_one_or_two_error_lines_before_any_request(serve, tmp_path, tokenizer_path, setup, overrides,
                                                                   expected):
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    data = tmp_path / ("rows.json" if setup == "object" else "rows.jsonl")
    data.write_text('{"prompt": "a"}' if setup == "object" else '{"id": "a", "prompt": "a"}\n')
    out = tmp_path / {"blocked": "blocked/out.jsonl", "directory": "folder"}.get(setup, "out.jsonl")
    if setup == "directory":
        out.mkdir()
    if setup == "existing":
        out.write_text('{"id": "z_gen0", "primary_id": "z"}\n')
    if setup == "blocked":
        (tmp_path / "blocked").write_text("a file where the folder should be")
    result = regen_main("dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{server.url}]",
                       "server.model=standin", f"tokenizer={tokenizer_path}", f"output={out}", *overrides,
                       f"hydra.run.dir={tmp_path / 'h'}")
    assert error_lines(result) == [line.format(data=data, out=out, tmp=tmp_path) for line in expected]
    assert server.requests == []
    assert list(tmp_path.glob("*.lock")) == []  # a refused run leaves no lock file behind


def test_a_missing_local_checkpoint_is_refused_before_anything_starts(tmp_path, tokenizer_path):
    log = tmp_path / "local.log"
    result = regen_main("dataset=sample", "server=local", f"server.checkpoint={tmp_path / 'missing.pth'}",
                       f"server.log_file={log}", f"tokenizer={tokenizer_path}", f"output={tmp_path / 'out.jsonl'}",
                       f"hydra.run.dir={tmp_path / 'h'}")
    assert error_lines(result)[0] == f"error: server.checkpoint={tmp_path / 'missing.pth'}: no such file"
    assert result.stderr.startswith("error:")  # nothing before it: no server was started
    assert not log.exists() and not (tmp_path / "out.jsonl").exists()


def test_a_server_that_fails_to_start_is_an_error_line_after_its_log(tmp_path, tokenizer_path):
    install_standin_vllm(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STANDIN_VLLM_MODE": "die",
           "VLLM_READY_POLL_S": "0.1"}
    log = tmp_path / "vllm.log"
    result = regen_main("dataset=sample", "server.model=org/m", f"server.port={free_port()}", f"server.log_file={log}",
                       f"tokenizer={tokenizer_path}", f"output={tmp_path / 'out.jsonl'}",
                       f"hydra.run.dir={tmp_path / 'h'}", env=env)
    assert error_lines(result) == [
        f"error: launch/vllm.sh failed with status 1: vllm exited with status 3 before it was ready (log: {log})"]
    assert "CUDA out of memory while loading weights" in result.stderr  # the log's tail, shown above the error
    # the run stopped at its checks (the server never served): before, empty out.jsonl, its manifest and errors
    # file stayed in the folder, which existed before the run
    assert not list(tmp_path.glob("out*")) and log.is_file()


def test_checks_run_before_a_vllm_server_would_start(tmp_path, tokenizer_path):
    install_standin_vllm(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "STANDIN_VLLM_ARGV_LOG": str(tmp_path / "argv.jsonl")}
    (tmp_path / "out.jsonl").write_text('{"id": "z_gen0", "primary_id": "z"}\n')
    result = regen_main("dataset=sample", "server.model=org/m", f"server.port={free_port()}", f"tokenizer={tokenizer_path}",
                       f"output={tmp_path / 'out.jsonl'}", f"hydra.run.dir={tmp_path / 'h'}", env=env)
    assert error_lines(result)[0] == f"error: {tmp_path / 'out.jsonl'} exists from an earlier run"
    assert not (tmp_path / "argv.jsonl").exists()  # vllm was never started


class Held:
    """Answers every request only after ``release`` (so a run is mid-way when it is interrupted)."""

    def __init__(self):
        self.count, self.event = 0, None

    async def __call__(self, payload):
        self.count += 1
        self.event = self.event or asyncio.Event()
        await self.event.wait()
        return ok("late", [1, 5], [6, EOS])


def interrupt(process: subprocess.Popen, signum: int, ready) -> tuple[int, str]:
    wait_until(ready, process, "the run has requests in flight")
    process.send_signal(signum)
    _, stderr = communicate(process)
    return process.returncode, stderr


def start(tmp_path, data, *overrides, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "regen/main.py", "dataset=local", f"dataset.path={data}",
                             f"output={tmp_path / 'out.jsonl'}", f"hydra.run.dir={tmp_path / 'h'}", *overrides],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def assert_interrupted(tmp_path, status: int, stderr: str, signum: int) -> None:
    assert status == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr
    assert f"regen: interrupted ({signal.Signals(signum).name}); finished conversations are kept" in stderr
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["conversations_failed"] == 0
    assert read_jsonl(tmp_path / "out.errors.jsonl") == []  # in-flight conversations are not failures


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_run_on_external_endpoints(serve, tmp_path, tokenizer_path, signum):
    held = Held()
    server = serve(held)
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(20)])
    process = start(tmp_path, data, "server=external", f"server.endpoints=[{server.url}]", f"tokenizer={tokenizer_path}",
                    "concurrency=4")
    status, stderr = interrupt(process, signum, lambda: held.count >= 4)
    assert_interrupted(tmp_path, status, stderr, signum)
    held.event and server.loop.call_soon_threadsafe(held.event.set)


def test_interrupting_a_run_on_a_vllm_server_stops_it(tmp_path, tokenizer_path):
    install_standin_vllm(tmp_path / "bin")
    requests = tmp_path / "requests.jsonl"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "VLLM_READY_POLL_S": "0.1",
           "STANDIN_VLLM_CHAT_DELAY_S": "300", "STANDIN_VLLM_REQUEST_LOG": str(requests)}
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(5)])
    log = tmp_path / "vllm.log"
    process = start(tmp_path, data, "server.model=org/m", f"server.port={free_port()}", f"server.log_file={log}",
                    f"tokenizer={tokenizer_path}", env=env)
    status, stderr = interrupt(process, signal.SIGTERM,
                               lambda: requests.is_file() and "/v1/chat/completions" in requests.read_text())
    assert_interrupted(tmp_path, status, stderr, signal.SIGTERM)
    stopped = re.search(r"\[server\] stopping the server at \S+ \(pid (\d+)\)", stderr)
    assert stopped and not log.with_suffix(".pid").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(int(stopped.group(1)), 0)


def test_interrupting_a_run_on_the_embedded_server(tmp_path, tokenizer_path):
    torch.manual_seed(0)
    checkpoint = save_native(build_model(MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2)), tmp_path / "tiny.pth")
    port = free_port()
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(40)])
    process = start(tmp_path, data, "server=local", f"server.checkpoint={checkpoint}", "server.hidden_size=64",
                    f"server.port={port}", f"server.log_file={tmp_path / 'local.log'}", f"tokenizer={tokenizer_path}",
                    "max_tokens=2000", "+extra_request_params={ignore_eos: true}", "concurrency=2")

    def generating() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as reply:
                return json.load(reply)["running"] > 0
        except OSError:
            return False

    status, stderr = interrupt(process, signal.SIGINT, generating)
    assert_interrupted(tmp_path, status, stderr, signal.SIGINT)
    assert not generating()  # the embedded server was stopped with the run


@pytest.mark.parametrize("moment", ["imports", "models"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_start_up_is_one_line_and_130_or_143(tmp_path, tokenizer_path, signum, moment):
    """While Hydra is still being imported (PyYAML's C extension is mapped: omegaconf is on its way) and while
    regen waits for the endpoints' first answer (one that accepts and never answers), SIGINT / SIGTERM end the
    run with one line, no traceback."""
    mute = socket.create_server(("127.0.0.1", 0))  # accepts connections (the backlog), never answers
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "a"}])
    process = start(tmp_path, data, "server=external", f"server.endpoints=[http://127.0.0.1:{mute.getsockname()[1]}]",
                    f"tokenizer={tokenizer_path}")
    mute.settimeout(0.05)
    held = []

    def connected() -> bool:
        try:
            held.append(mute.accept()[0])  # held open, never answered
        except TimeoutError:
            return False
        return True

    try:
        wait_until(lambda: loaded(process.pid, "_yaml"), process, "Hydra is being imported")
        if moment == "models":
            wait_until(connected, process, "regen asks /v1/models")
        process.send_signal(signum)
        _, stderr = communicate(process)
    finally:
        for connection in held:
            connection.close()
        mute.close()
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"regen: interrupted ({signal.Signals(signum).name})"), stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_full_disk_is_one_error_and_the_output_stays_resumable(serve, tmp_path, tokenizer_path):
    """Output on a 64 KiB tmpfs: the run ends with one error (the file, the space its write needed) and a hint, no
    traceback; the output holds whole conversations only; a resume on the still-full disk is the same one error;
    once there is room, resume finishes every conversation exactly once."""
    server = serve(lambda payload: ok("a fairly long answer " * 20, list(range(3, 60)), list(range(60, 260)) + [EOS]))
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"c{i}", "prompt": f"p{i}"} for i in range(200)])
    with small_tmpfs(tmp_path / "disk", 64 << 10) as disk:
        out = disk / "out.jsonl"
        command = ["dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{server.url}]",
                   f"tokenizer={tokenizer_path}", f"output={out}", "concurrency=4", f"hydra.run.dir={tmp_path / 'h'}"]
        for attempt in range(2):
            result = regen_cli(*command, *(["resume=true"] if attempt else []))
            lines = error_lines(result)
            assert len(lines) == 2, result.stderr
            assert re.fullmatch(rf"error: no space left on device for {re.escape(str(disk))}/out\S*: the write needs "
                                r"\d+ bytes free, \d+ bytes are free", lines[0]), lines
            assert lines[1].startswith("error: make room on that disk, then run again with resume=true")
            rows = read_jsonl(out)  # every line whole, every conversation with all its rows
            assert all(row["metadata"]["num_generations"] == 1 for row in rows)
            if attempt == 0:
                assert 0 < len(rows) < 200
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        result = regen_cli(*command, "resume=true")
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert sorted(row["primary_id"] for row in read_jsonl(out)) == sorted(f"c{i}" for i in range(200))
        assert json.loads((disk / "out.summary.json").read_text())["status"] == "completed"


def test_running_out_of_file_descriptors_is_two_error_lines_and_nothing_from_asyncio(serve, tmp_path,
                                                                                      tokenizer_path):
    """``ulimit -n 64`` with 100 conversations wanted in flight: the run stops with the two lines of
    OutOfFileDescriptorsError; no traceback, nothing asyncio reports about tasks or futures."""
    import resource

    held = Held()
    server = serve(held)
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(1000)])
    try:
        result = subprocess.run(
            [sys.executable, "regen/main.py", "dataset=local", f"dataset.path={data}", f"output={tmp_path / 'out.jsonl'}",
             f"hydra.run.dir={tmp_path / 'h'}", "server=external", f"server.endpoints=[{server.url}]",
             f"tokenizer={tokenizer_path}", "concurrency=auto", "concurrency_start=100"], cwd=REPO_ROOT, capture_output=True, text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    finally:
        held.event and server.loop.call_soon_threadsafe(held.event.set)
    lines = error_lines(result)
    assert lines[0] == "error: this process ran out of file descriptors (ulimit -n is 64) while connecting to " \
        f"{server.url}/v1/chat/completions" or "ran out of file descriptors" in lines[0], result.stderr
    assert len(lines) == 2 and "never retrieved" not in result.stderr and "asyncio" not in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["dev-null", "fifo", "link-to-dev-null"])
def test_an_output_that_is_not_a_regular_file_is_refused_before_any_file_is_made(serve, tmp_path, tokenizer_path,
                                                                                  kind):
    """/dev/null (named, or through a symlink) and a FIFO: one error and its hint, exit 1, nothing created beside
    it (before: the run 'completed' into /dev/null and left /dev/null.errors.jsonl, .manifest.json, .summary.json)."""
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "a"}])
    out = {"dev-null": "/dev/null", "fifo": str(tmp_path / "pipe.jsonl"), "link-to-dev-null": str(tmp_path / "l.jsonl")}[kind]
    if kind == "fifo":
        os.mkfifo(out)
    if kind == "link-to-dev-null":
        os.symlink("/dev/null", out)
    before = set(os.listdir("/dev")), set(os.listdir(tmp_path))
    result = regen_cli("dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{server.url}]",
                       f"tokenizer={tokenizer_path}", f"output={out}", f"hydra.run.dir={tmp_path / 'h'}")
    real = os.path.realpath(out)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert error_lines(result) == [
        f"error: {real} is {what}, not a regular file: regen writes its rows, error file, summary and manifest as "
        "files beside the output, to be resumed",
        "error: choose an output= that is a new or regular file (e.g. output=out/regen/rows.jsonl)"]
    assert (set(os.listdir("/dev")), set(os.listdir(tmp_path)) - {"h"}) == before
    assert server.requests == []
