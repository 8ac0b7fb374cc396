"""launch/vllm.sh: the exact `vllm serve` command for every option (multi-node head and headless nodes included),
and its start/ready/death/timeout/interrupt behaviour with a stand-in `vllm` (and a logging `curl`) first on
PATH: readiness is /health then /v1/models with the API key, which never appears on a command line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from launch.server_process import probe_models, stop_process_group
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import (
    free_port,
    install_logging_curl,
    install_standin_vllm,
    wait_for_file,
)

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
    (["--dp-size", "4", "--dp-size-local", "2"], BASE + " --data-parallel-size 4 --data-parallel-size-local 2"),
    (["--dp-address", "10.0.0.1"], BASE + " --data-parallel-address 10.0.0.1"),
    (["--dp-rpc-port", "13345"], BASE + " --data-parallel-rpc-port 13345"),
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


def test_dry_run_of_a_two_node_deployment():
    head = dry_run("m", "--dp-size", "4", "--dp-size-local", "2", "--dp-address", "10.0.0.1", "--dp-rpc-port", "13345")
    assert head == ("vllm serve m --host 127.0.0.1 --port 8000 --data-parallel-size 4 --data-parallel-size-local 2 "
                    "--data-parallel-address 10.0.0.1 --data-parallel-rpc-port 13345")
    worker = dry_run("m", "--headless", "--gpus", "0,1", "--dp-size", "4", "--dp-size-local", "2", "--dp-start-rank",
                     "2", "--dp-address", "10.0.0.1", "--dp-rpc-port", "13345", "--tp-size", "1")
    assert worker == ("CUDA_VISIBLE_DEVICES=0,1 vllm serve m --headless --data-parallel-size 4 "
                      "--data-parallel-size-local 2 --data-parallel-start-rank 2 --data-parallel-address 10.0.0.1 "
                      "--data-parallel-rpc-port 13345 --tensor-parallel-size 1")


@pytest.mark.parametrize("args,message", [
    ([], "no MODEL given"),
    (["m", "--headless", "--dp-size", "4"], "--headless needs --dp-size, --dp-address and --dp-rpc-port"),
    (["m", "--dp-start-rank", "2"], "--dp-start-rank is for --headless nodes"),
    (["m", "--head-url", "http://h:8000"], "--head-url is for --headless nodes only"),
    (["m", "--dp-size-local", "2"], "--dp-size-local needs --dp-size"),
    (["m", "--dp-size", "2", "--dp-size-local", "3"], "--dp-size-local 3 is more than --dp-size 2"),
    (["m", "--dp-rpc-port", "x"], "--dp-rpc-port must be a whole number"),
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
    install_logging_curl(tmp_path / "bin", tmp_path / "curl_argv.jsonl")
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "VLLM_READY_POLL_S": "0.1",
            "STANDIN_VLLM_ARGV_LOG": str(tmp_path / "argv.jsonl"), "STANDIN_VLLM_STARTED": str(tmp_path / "started"),
            "STANDIN_VLLM_REQUEST_LOG": str(tmp_path / "requests.jsonl")}


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
        assert probe_models(f"http://127.0.0.1:{port}") == ["org/model"]
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
        assert probe_models(f"http://127.0.0.1:{port}") == ["org/model"]
    finally:
        stop_process_group(pid, grace_s=5)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_waiting_stops_the_server(tmp_path, standin_env, signum):
    port = free_port()
    script = subprocess.Popen(
        [str(SCRIPT), "org/model", "--port", str(port), "--log-file", str(tmp_path / "v.log"),
         "--pid-file", str(tmp_path / "v.pid"), "--stop-grace", "5"],
        env={**standin_env, "STANDIN_VLLM_MODE": "hang"}, stderr=subprocess.PIPE, text=True)
    server_pid = int(wait_for_file(tmp_path / "started", script))  # written by the stand-in as it starts
    assert int((tmp_path / "v.pid").read_text()) == server_pid
    script.send_signal(signum)
    _, stderr = script.communicate(timeout=60)
    assert script.returncode == 130 and "interrupted; stopping the server" in stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)


def test_readiness_probes_health_without_the_key_then_models_with_it(tmp_path, standin_env):
    key = "sk-vllm-secret-42"
    port, result = launch(tmp_path, {**standin_env, "VLLM_API_KEY": key})
    pid = int((tmp_path / "v.pid").read_text())
    try:
        assert result.returncode == 0, result.stderr
        requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert requests[-2:] == [["/health", None], ["/v1/models", f"Bearer {key}"]]
        assert {path for path, auth in requests if auth is None} <= {"/health"}  # /v1 never asked without the key
    finally:
        stop_process_group(pid, grace_s=5)
    curl_calls = (tmp_path / "curl_argv.jsonl").read_text().splitlines()
    assert curl_calls and all(key not in call for call in curl_calls)  # the key went in on stdin
    assert key not in (tmp_path / "argv.jsonl").read_text()  # nor on vllm's command line (vllm reads the env)
    assert key not in result.stderr


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_a_key_passed_to_vllm_is_the_probes_key_and_is_never_printed(tmp_path, standin_env, form):
    key = "sk-passed-through-7"
    passed = ["--api-key", key] if form == "separate" else [f"--api-key={key}"]
    port, result = launch(tmp_path, standin_env, "--ready-timeout", "20", "--", *passed)
    pid_file = tmp_path / "v.pid"
    try:
        assert result.returncode == 0, result.stderr
        requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert requests[-1] == ["/v1/models", f"Bearer {key}"]
        assert json.loads((tmp_path / "argv.jsonl").read_text())[-len(passed):] == passed  # vLLM still gets it
    finally:
        if pid_file.exists():
            stop_process_group(int(pid_file.read_text()), grace_s=5)
    assert "starting: " in result.stderr and "--api-key" in result.stderr
    assert key not in result.stderr
    assert all(key not in call for call in (tmp_path / "curl_argv.jsonl").read_text().splitlines())
    dry = subprocess.run([str(SCRIPT), "--dry-run", "m", "--", *passed], capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0 and key not in dry.stdout + dry.stderr and "--api-key" in dry.stdout


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_fails_at_once_saying_so(tmp_path, standin_env, status):
    env = {**standin_env, "STANDIN_VLLM_API_KEY": "sk-from-a-config-file", "STANDIN_VLLM_AUTH_STATUS": str(status),
           "VLLM_API_KEY": "sk-wrong"}
    _, result = launch(tmp_path, env, "--ready-timeout", "600")  # subprocess timeout 60 s: it must not wait
    assert result.returncode == 1
    assert f"/v1/models answers HTTP {status}" in result.stderr and "API key" in result.stderr
    assert "sk-wrong" not in result.stderr and "sk-from-a-config-file" not in result.stderr
    assert not (tmp_path / "v.pid").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(int((tmp_path / "started").read_text()), 0)


def test_headless_node_is_ready_when_running_and_its_head_answers_health(tmp_path, standin_env):
    head_port, head = launch(tmp_path, standin_env)
    head_pid = int((tmp_path / "v.pid").read_text())
    worker_args = ["--headless", "--dp-size", "2", "--dp-size-local", "1", "--dp-start-rank", "1",
                   "--dp-address", "127.0.0.1", "--dp-rpc-port", "13345", "--head-url", f"http://127.0.0.1:{head_port}",
                   "--log-file", str(tmp_path / "w.log"), "--pid-file", str(tmp_path / "w.pid")]
    try:
        assert head.returncode == 0, head.stderr
        worker_env = {**standin_env, "STANDIN_VLLM_STARTED": str(tmp_path / "worker_started")}
        worker = subprocess.run([str(SCRIPT), "org/model", *worker_args], env=worker_env, capture_output=True,
                                text=True, timeout=120)
        assert worker.returncode == 0, worker.stderr
        worker_pid = int((tmp_path / "w.pid").read_text())
        assert f"headless node running (pid {worker_pid}) and its head" in worker.stderr
        wait_for_file(tmp_path / "worker_started", worker_pid)  # its argv is logged by now
        argv = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[-1])
        assert argv == ["serve", "org/model", "--headless", "--data-parallel-size", "2", "--data-parallel-size-local",
                        "1", "--data-parallel-start-rank", "1", "--data-parallel-address", "127.0.0.1",
                        "--data-parallel-rpc-port", "13345"]
        assert os.getpgid(worker_pid) == worker_pid
        stop_process_group(worker_pid, grace_s=5)
    finally:
        stop_process_group(head_pid, grace_s=5)
    lost = subprocess.run([str(SCRIPT), "org/model", *worker_args, "--ready-timeout", "1", "--stop-grace", "2"],
                          env=standin_env, capture_output=True, text=True, timeout=120)  # the head is gone now
    assert lost.returncode == 1
    assert f"not joined (the head http://127.0.0.1:{head_port} does not answer /health) after 1s" in lost.stderr
    assert not (tmp_path / "w.pid").exists()


def test_a_headless_node_that_dies_is_reported(tmp_path, standin_env):
    _, result = launch(tmp_path, standin_env, "--headless", "--dp-size", "2", "--dp-address", "127.0.0.1",
                       "--dp-rpc-port", "13345", mode="die")
    assert result.returncode == 1 and "vllm exited with status 3 before it was ready" in result.stderr
