"""launch/vllm.sh: the exact `vllm serve` command for every option, and its start/ready/death/timeout behaviour
with a stand-in `vllm` first on PATH."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from launch.server_process import probe_models, stop_process_group
from tests.conftest import REPO_ROOT
from tests.vllm_cli_standin import free_port, install_standin_vllm

SCRIPT = REPO_ROOT / "launch" / "vllm.sh"


def dry_run(*args: str) -> str:
    result = subprocess.run([str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


BASE = "vllm serve Qwen/Qwen3-8B --host 127.0.0.1 --port 8000"


@pytest.mark.parametrize("args,expected", [
    ([], BASE),
    (["--host", "0.0.0.0"], "vllm serve Qwen/Qwen3-8B --host 0.0.0.0 --port 8000"),
    (["--port", "9001"], "vllm serve Qwen/Qwen3-8B --host 127.0.0.1 --port 9001"),
    (["--gpus", "2,3"], "CUDA_VISIBLE_DEVICES=2,3 " + BASE),
    (["--dp-size", "4"], BASE + " --data-parallel-size 4"),
    (["--tp-size", "2"], BASE + " --tensor-parallel-size 2"),
    (["--max-model-len", "8192"], BASE + " --max-model-len 8192"),
    (["--reasoning-parser", "qwen3"], BASE + " --reasoning-parser qwen3"),
    (["--tool-call-parser", "hermes"], BASE + " --enable-auto-tool-choice --tool-call-parser hermes"),
    (["--gpu-memory-utilization", "0.85", "--enforce-eager"], BASE + " --gpu-memory-utilization 0.85 --enforce-eager"),
    (["--", "--served-model-name", "my model"], BASE + r" --served-model-name my\ model"),
    (["--log-file", "x.log", "--pid-file", "x.pid", "--ready-timeout", "5", "--stop-grace", "1"], BASE),
])
def test_dry_run_maps_each_option(args, expected):
    assert dry_run("Qwen/Qwen3-8B", *args) == expected


def test_dry_run_all_options_together_in_order():
    assert dry_run("--model", "m", "--gpus", "0,1,2,3", "--dp-size", "2", "--tp-size", "2", "--port", "8100",
                   "--max-model-len", "4096", "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                   "--seed", "7") == (
        "CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve m --host 127.0.0.1 --port 8100 --data-parallel-size 2 "
        "--tensor-parallel-size 2 --max-model-len 4096 --reasoning-parser qwen3 --enable-auto-tool-choice "
        "--tool-call-parser hermes --seed 7")


@pytest.mark.parametrize("args,message", [
    ([], "no MODEL given"),
    (["m", "--port", "80a"], "--port must be a whole number"),
    (["m", "--dp-size", "two"], "--dp-size must be a whole number"),
    (["m", "--gpus", "0;rm"], "--gpus must look like"),
    (["m", "--tp-size"], "--tp-size needs a value"),
])
def test_bad_arguments_exit_2_with_a_message(args, message):
    result = subprocess.run([str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr


@pytest.fixture
def standin_env(tmp_path):
    install_standin_vllm(tmp_path / "bin")
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "VLLM_READY_POLL_S": "0.1",
            "STANDIN_VLLM_ARGV_LOG": str(tmp_path / "argv.jsonl")}


def launch(tmp_path, env, *args, mode="serve", timeout=60):
    port = free_port()
    command = [str(SCRIPT), "org/model", "--port", str(port), "--log-file", str(tmp_path / "v.log"),
               "--pid-file", str(tmp_path / "v.pid"), *args]
    result = subprocess.run(command, env={**env, "STANDIN_VLLM_MODE": mode}, capture_output=True, text=True,
                            timeout=timeout)
    return port, result


def test_starts_waits_until_ready_and_leaves_the_server_running(tmp_path, standin_env):
    port, result = launch(tmp_path, standin_env, "--dp-size", "2", "--tool-call-parser", "hermes", "--foo", "1")
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / "v.pid").read_text())
    try:
        assert f"ready at http://127.0.0.1:{port}" in result.stderr
        assert probe_models(f"http://127.0.0.1:{port}") == ["org/model", "org/model"]
        assert os.getpgid(pid) == pid  # its own process group, so one signal stops it and its workers
        argv = json.loads((tmp_path / "argv.jsonl").read_text())
        assert argv == ["serve", "org/model", "--host", "127.0.0.1", "--port", str(port), "--data-parallel-size",
                        "2", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--foo", "1"]
        assert "loading org/model" in (tmp_path / "v.log").read_text()
    finally:
        stop_process_group(pid, grace_s=5)
    assert probe_models(f"http://127.0.0.1:{port}") is None


def test_early_death_prints_the_log_tail_and_exits_1(tmp_path, standin_env):
    _, result = launch(tmp_path, standin_env, mode="die")
    assert result.returncode == 1
    assert "vllm exited with status 3 before it was ready" in result.stderr
    assert "CUDA out of memory while loading weights" in result.stderr  # from the log's tail
    assert not (tmp_path / "v.pid").exists()


def test_never_ready_times_out_stops_it_and_exits_1(tmp_path, standin_env):
    _, result = launch(tmp_path, standin_env, "--ready-timeout", "1", "--stop-grace", "2", mode="hang")
    assert result.returncode == 1
    match = re.search(r"not ready after 1s; stopping it \(pid (\d+)\)", result.stderr)
    assert match and f"---- last 40 lines of {tmp_path / 'v.log'} ----" in result.stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(int(match.group(1)), 0)
    assert not (tmp_path / "v.pid").exists()


def test_refuses_a_port_where_a_server_already_answers(tmp_path, standin_env):
    port, first = launch(tmp_path, standin_env)
    pid = int((tmp_path / "v.pid").read_text())
    try:
        second = subprocess.run([str(SCRIPT), "other", "--port", str(port), "--log-file", str(tmp_path / "w.log"),
                                 "--pid-file", str(tmp_path / "w.pid")], env=standin_env, capture_output=True,
                                text=True, timeout=30)
        assert second.returncode == 1 and "already answers" in second.stderr
        assert probe_models(f"http://127.0.0.1:{port}") == ["org/model", "org/model"]
    finally:
        stop_process_group(pid, grace_s=5)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_waiting_stops_the_server(tmp_path, standin_env, signum):
    port = free_port()
    script = subprocess.Popen(
        [str(SCRIPT), "org/model", "--port", str(port), "--log-file", str(tmp_path / "v.log"),
         "--pid-file", str(tmp_path / "v.pid"), "--stop-grace", "5"],
        env={**standin_env, "STANDIN_VLLM_MODE": "hang"}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "v.log").is_file() or "mode hang" not in (tmp_path / "v.log").read_text():
        assert time.monotonic() < deadline, "stand-in never started"
        time.sleep(0.05)
    server_pid = int((tmp_path / "v.pid").read_text())
    script.send_signal(signum)
    _, stderr = script.communicate(timeout=30)
    assert script.returncode == 130 and "interrupted; stopping the server" in stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)
