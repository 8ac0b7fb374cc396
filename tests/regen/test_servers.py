"""regen/servers.py: server lifecycle for server=vllm (launch/vllm.sh with a stand-in `vllm` first on PATH) and
server=local (the real embedded server): start, ready, reuse, stop on success/failure/interrupt, early death
with the log tail, keep_server, one shared server for a Hydra multirun, and the multi-node head's flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import asdict

import pytest
import torch

from common.minimind.model import build_model, save_native
from common.minimind.spec import MiniMindArch
from launch.server_process import ServerStartError, probe_models, start_detached, stop_process_group
from regen.servers import SharedServerCallback, local_command, log_path, provide_endpoints, vllm_command
from regen.settings import RegenSettings
from tests.helpers.configs import compose_config
from tests.helpers.paths import REPO_ROOT
from tests.helpers.standin_vllm_cli import (
    free_port,
    group_gone,
    install_standin_vllm,
    wait_for_file,
    wait_until_answers,
)


def regen_config(*overrides: str):
    return compose_config("regen", ["dataset=sample", *overrides])


def server_of(*overrides: str):
    """The checked ``server`` settings of a regen config with these overrides."""
    return RegenSettings.from_config(regen_config(*overrides)).server


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """`vllm` on PATH is the stand-in; returns a factory of vllm server configs logging into tmp_path."""
    install_standin_vllm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("VLLM_READY_POLL_S", "0.1")
    monkeypatch.setenv("STANDIN_VLLM_ARGV_LOG", str(tmp_path / "argv.jsonl"))
    monkeypatch.setenv("STANDIN_VLLM_STARTED", str(tmp_path / "started"))

    def config(*overrides: str, mode: str = "serve"):
        monkeypatch.setenv("STANDIN_VLLM_MODE", mode)
        return server_of("server=vllm", "server.model=org/model", f"server.port={free_port()}",
                         f"server.log_file={tmp_path / 'vllm.log'}", "server.stop_grace_s=5", *overrides)

    config.starts = lambda: len((tmp_path / "argv.jsonl").read_text().splitlines()) if (
        tmp_path / "argv.jsonl").exists() else 0
    config.pid = lambda: int((tmp_path / "vllm.pid").read_text())
    return config


def base_url(cfg) -> str:
    return f"http://{cfg.host}:{cfg.port}"


def test_vllm_command_carries_every_server_value():
    cfg = server_of("server=vllm", "server.model=Qwen/Qwen3-8B", "server.dp=4", "server.tp=2", "server.gpus=[0,1]",
                    "server.port=8100", "server.max_model_len=8192", "server.reasoning_parser=qwen3",
                    "server.extra_args=[--gpu-memory-utilization,0.9]", "server.log_file=logs/v.log")
    assert vllm_command(cfg) == [
        str(REPO_ROOT / "launch" / "vllm.sh"), "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8100",
        "--dp-size", "4", "--tp-size", "2", "--log-file", "logs/v.log", "--pid-file", "logs/v.pid",
        "--ready-timeout", "1800", "--stop-grace", "30", "--gpus", "0,1", "--max-model-len", "8192",
        "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--", "--gpu-memory-utilization", "0.9"]


def test_a_multi_node_head_maps_to_vllm_sh_and_on_to_vllm(standin, tmp_path):
    cfg = standin("server.dp=4", "server.dp_local=2", "server.dp_address=127.0.0.1", "server.dp_rpc_port=13345")
    command = vllm_command(cfg)
    assert command[command.index("--dp-size-local"):command.index("--tool-call-parser")] == [
        "--dp-size-local", "2", "--dp-address", "127.0.0.1", "--dp-rpc-port", "13345"]
    with provide_endpoints(cfg):
        pid = standin.pid()
    argv = json.loads((tmp_path / "argv.jsonl").read_text())
    assert argv == ["serve", "org/model", "--host", "127.0.0.1", "--port", str(cfg.port), "--data-parallel-size", "4",
                    "--data-parallel-size-local", "2", "--data-parallel-address", "127.0.0.1",
                    "--data-parallel-rpc-port", "13345", "--tensor-parallel-size", "1", "--enable-auto-tool-choice",
                    "--tool-call-parser", "hermes"]
    assert group_gone(pid)


def test_local_command_serves_the_teacher_preset(tokenizer_path, tmp_path, monkeypatch):
    for name in ("tiny/tiny_teacher.pth", "out/agent_768_moe.pth"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)  # after `make tiny` and a download (files the
        (tmp_path / name).write_text("{}\n")  # settings check): the tiny folder, and a path relative to the run's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ONPOLICY_TINY_DIR", str(tmp_path / "tiny"))  # where the tiny presets look
    teacher = str(tmp_path / "tiny" / "tiny_teacher.pth")
    cfg = server_of("server=local", f"tokenizer={tokenizer_path}")
    command = local_command(cfg)
    assert command[:3] == [sys.executable, "-m", "launch.chat_server"]
    assert "--no-use-moe" in command
    pairs = [a for a in command[3:] if a != "--no-use-moe"]
    flags = dict(zip(pairs[::2], pairs[1::2], strict=True))
    assert flags["--checkpoint"] == teacher and flags["--tokenizer"] == str(tokenizer_path)
    assert (flags["--hidden-size"], flags["--num-hidden-layers"], flags["--port"]) == ("128", "2", "8011")
    assert flags["--served-model-name"] == teacher
    assert flags["--parent-pid"] == str(os.getpid()) and flags["--tool-call-parser"] == "hermes"
    other = server_of("server=local", "model@server=agent_768_moe")
    spec = other.model_spec
    assert (spec.checkpoint, spec.hidden_size, spec.use_moe) == ("out/agent_768_moe.pth", 768, True)
    assert "--use-moe" in local_command(other)


def test_start_ready_and_stop_on_success(standin):
    cfg = standin("server.dp=2")
    with provide_endpoints(cfg) as endpoints:
        assert [e.base for e in endpoints] == [base_url(cfg)]
        assert probe_models(base_url(cfg)) == ["org/model"]
        pid = standin.pid()
        request = urllib.request.Request(endpoints[0].chat_url, data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["choices"][0]["message"]["content"] == "ok"
    assert group_gone(pid) and probe_models(base_url(cfg)) is None
    assert standin.starts() == 1
    assert not log_path(cfg).with_suffix(".pid").exists()  # no pid file naming a dead process is left behind


def test_stop_on_failure_inside_the_block(standin):
    cfg = standin()
    with pytest.raises(RuntimeError, match="job failed"), provide_endpoints(cfg):
        pid = standin.pid()
        raise RuntimeError("job failed")
    assert group_gone(pid)


def test_stubborn_server_is_killed_after_the_grace_period(standin):
    cfg = standin("server.stop_grace_s=1", mode="stubborn")
    with provide_endpoints(cfg):
        pid = standin.pid()
    assert group_gone(pid)


def test_early_death_is_reported_with_the_log_tail(standin):
    cfg = standin(mode="die")
    with pytest.raises(ServerStartError) as caught, provide_endpoints(cfg):
        pytest.fail("the block must not run")
    first_line, _, tail = str(caught.value).partition("\n")
    assert first_line == (f"launch/vllm.sh failed with status 1: vllm exited with status 3 before it was ready "
                          f"(log: {log_path(cfg)})")
    assert "CUDA out of memory while loading weights" in tail


def test_never_ready_is_bounded(standin):
    cfg = standin("server.ready_timeout_s=1", "server.stop_grace_s=1", mode="hang")
    with pytest.raises(ServerStartError, match="not ready after 1s"), provide_endpoints(cfg):
        pytest.fail("the block must not run")


def test_reuses_a_healthy_server_with_the_model_and_leaves_it_running(standin, tmp_path):
    cfg = standin()
    command = [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "standin_vllm_cli.py"), "serve", "org/model", "--port",
               str(cfg.port)]
    already = start_detached(command, tmp_path / "already.log")
    try:
        wait_until_answers(base_url(cfg), already)
        starts = standin.starts()
        with provide_endpoints(cfg) as endpoints:
            assert [e.base for e in endpoints] == [base_url(cfg)]
        assert standin.starts() == starts  # nothing new was launched
        assert already.poll() is None and probe_models(base_url(cfg)) is not None  # and it was left running
        other = server_of("server=vllm", "server.model=other/model", f"server.port={cfg.port}")
        with pytest.raises(ServerStartError) as refused, provide_endpoints(other):
            pytest.fail("the block must not run")
        assert str(refused.value).startswith(f"{base_url(cfg)} already serves ['org/model'], not 'other/model'")
    finally:
        stop_process_group(already.pid, grace_s=5, process=already)


def test_keep_server_leaves_it_running(standin):
    cfg = standin("server.keep_server=true")
    with provide_endpoints(cfg):
        pid = standin.pid()
    try:
        assert not group_gone(pid) and probe_models(base_url(cfg)) is not None
        assert standin.pid() == pid  # its pid file stays: it is how to stop the server later
    finally:
        stop_process_group(pid, grace_s=5)


HOLDER = """
import json, sys, time
from regen.servers import provide_endpoints
from common.config_schema import parse_config
from regen.settings import ServerSettings
with provide_endpoints(parse_config(ServerSettings, json.loads(sys.argv[1]), "server.")) as endpoints:
    print("READY", endpoints[0].base, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("signum,mode,whole_group", [
    (signal.SIGINT, "serve", False), (signal.SIGTERM, "serve", False), (signal.SIGINT, "hang", False),
    (signal.SIGTERM, "hang", False), (signal.SIGINT, "serve", True), (signal.SIGINT, "hang", True)])
def test_interrupt_stops_the_server(standin, tmp_path, signum, mode, whole_group):
    """Ctrl-C / SIGTERM while the job runs ("serve") or while it still waits for readiness ("hang"), sent to
    the regen process alone or, as a terminal's Ctrl-C does, to its whole process group (vllm.sh too)."""
    cfg = standin(mode=mode)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps({"kind": cfg.kind, **asdict(cfg)})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                              start_new_session=True)
    try:
        if mode == "serve":
            assert holder.stdout.readline().startswith("READY")
        else:
            wait_for_file(tmp_path / "started", holder)  # the stand-in runs; vllm.sh now waits for readiness
        pid = standin.pid()
        if whole_group:
            os.killpg(holder.pid, signum)
        else:
            holder.send_signal(signum)
        _, stderr = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode != 0 and f"Interrupted: received {signal.Signals(signum).name}" in stderr
    assert group_gone(pid)
    assert probe_models(base_url(cfg)) is None


def test_multirun_callback_shares_one_server(standin):
    cfg = standin()
    root = regen_config("server=vllm", "server.model=org/model", f"server.port={cfg.port}",
                        f"server.log_file={cfg.log_file}", "server.stop_grace_s=5")
    callback = SharedServerCallback()
    callback.on_multirun_start(root)
    try:
        pid = standin.pid()
        for _job in range(2):
            with provide_endpoints(cfg):
                assert probe_models(base_url(cfg)) is not None
            assert not group_gone(pid)  # jobs reuse it and leave it up
        assert standin.starts() == 1
    finally:
        callback.on_multirun_end(root)
    assert group_gone(pid)


def test_regen_config_registers_the_multirun_callback():
    hydra_cfg = compose_config("regen", ["dataset=sample"], hydra_config=True).hydra
    assert hydra_cfg.callbacks.shared_server._target_ == "regen.servers.SharedServerCallback"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(MiniMindArch(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2))
    return save_native(model, tmp_path_factory.mktemp("tiny") / "tiny_teacher.pth")


def test_local_server_lifecycle_with_the_embedded_server(tmp_path, tiny_checkpoint, tokenizer_path, tokenizer):
    cfg = server_of("server=local", f"server.checkpoint={tiny_checkpoint}", f"server.port={free_port()}",
                    f"tokenizer={tokenizer_path}", f"server.log_file={tmp_path / 'local.log'}")
    endpoint = cfg.base_url
    with provide_endpoints(cfg):
        assert probe_models(endpoint) == [str(tiny_checkpoint)]
        messages = [{"role": "user", "content": "Hello"}]
        body = json.dumps({"model": str(tiny_checkpoint), "messages": messages, "max_tokens": 5,
                           "return_token_ids": True}).encode()
        request = urllib.request.Request(f"{endpoint}/v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.load(response)
        assert reply["prompt_token_ids"] == list(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        assert 1 <= len(reply["choices"][0]["token_ids"]) <= 5
    assert probe_models(endpoint) is None
    assert "serving" in (tmp_path / "local.log").read_text()


def test_local_server_that_cannot_load_reports_why(tmp_path, tokenizer_path):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a torch file")  # a missing one is refused with the settings, before any start
    cfg = server_of("server=local", f"server.checkpoint={broken}", f"server.port={free_port()}",
                    f"tokenizer={tokenizer_path}", f"server.log_file={tmp_path / 'local.log'}")
    with pytest.raises(ServerStartError) as caught, provide_endpoints(cfg):
        pytest.fail("the block must not run")
    assert "server exited with status 1 before it was ready" in str(caught.value)
    assert "is not a readable torch state dict" in caught.value.details
