"""Who provides the chat endpoint(s) for a regen job: the ``server`` config group.

``provide_endpoints(server_cfg)`` is a context manager yielding the base URLs (``http://host:port``) that
are ready to serve; it owns the whole lifecycle for ``vllm`` and ``local`` and none for ``external``:

- ``vllm``: runs ``launch/vllm.sh`` with the group's values (it starts ``vllm serve`` in its own process
  group and returns once ``/v1/models`` answers), then stops that group (SIGTERM, SIGKILL after
  ``stop_grace_s``) when the block ends -- on success, on an error, on Ctrl-C or SIGTERM -- unless
  ``keep_server``.
- ``local``: the same for the embedded CPU server (``python -m launch.chat_server``).
- A healthy server already answering on the port with the asked model is reused and left running; one
  serving another model is an error. Hydra multiruns share one server through ``SharedServerCallback``.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback

from launch.server_process import (
    ServerStartError,
    log_tail,
    probe_models,
    start_detached,
    stop_process_group,
    wait_until_ready,
)

VLLM_SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "vllm.sh"
MANAGED_KINDS = ("vllm", "local")
# Keys of a server block that become the embedded server's CLI flags (values of None are left out).
_LOCAL_FLAGS = ("checkpoint", "tokenizer", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "num_experts", "num_experts_per_tok", "vocab_size", "host", "port",
                "max_batch_size", "max_prefill_tokens", "max_model_len", "reasoning_parser", "threads")


@contextmanager
def provide_endpoints(server_cfg: Mapping) -> Iterator[list[str]]:
    """Yield ready base URLs for ``server_cfg`` and release what was started when the block exits."""
    kind = server_cfg.get("kind")
    if kind == "external":
        endpoints = server_cfg.get("endpoints")
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("server.endpoints is empty: give one or more base URLs, e.g. [http://127.0.0.1:8000]")
        yield [str(e).rstrip("/") for e in endpoints]
        return
    if kind not in MANAGED_KINDS:
        raise ValueError(f"server.kind={kind!r} is not one of external, {', '.join(MANAGED_KINDS)}")
    with _sigterm_as_interrupt(), _managed_server(server_cfg) as base_url:
        yield [base_url]


def served_model_name(server_cfg: Mapping) -> str:
    """The model id the server lists in /v1/models: ``model``, else (local) the checkpoint path."""
    name = server_cfg.get("model") or (server_cfg.get("checkpoint") if server_cfg.get("kind") == "local" else None)
    if not name:
        raise ValueError(f"server.model is not set for server.kind={server_cfg.get('kind')}")
    return str(name)


def server_log_path(server_cfg: Mapping) -> Path:
    """``server.log_file``, else ``out/servers/<kind>-<port>.log``."""
    return Path(server_cfg.get("log_file") or f"out/servers/{server_cfg['kind']}-{server_cfg['port']}.log")


@contextmanager
def _managed_server(server_cfg: Mapping) -> Iterator[str]:
    base_url = f"http://{server_cfg['host']}:{server_cfg['port']}"
    model = served_model_name(server_cfg)
    served = probe_models(base_url)
    if served is not None:
        if model not in served:
            raise ServerStartError(f"{base_url} already serves {served}, not {model!r}: stop that server or "
                                   "choose another server.port")
        print(f"[server] reusing the server already answering at {base_url} ({model}); leaving it running",
              file=sys.stderr)
        yield base_url
        return
    start = _start_vllm if server_cfg["kind"] == "vllm" else _start_local
    pid, process = start(server_cfg, base_url)
    print(f"[server] {server_cfg['kind']} server ready at {base_url} (pid {pid}, log {server_log_path(server_cfg)})",
          file=sys.stderr)
    try:
        yield base_url
    finally:
        if server_cfg.get("keep_server"):
            print(f"[server] keep_server: leaving {base_url} running; stop it with: kill -TERM -- -{pid}",
                  file=sys.stderr)
        else:
            print(f"[server] stopping the server at {base_url} (pid {pid})", file=sys.stderr)
            stop_process_group(pid, grace_s=float(server_cfg["stop_grace_s"]), process=process)


def vllm_command(server_cfg: Mapping) -> list[str]:
    """The ``launch/vllm.sh`` command line for a ``vllm`` server block."""
    log = server_log_path(server_cfg)
    command = [str(VLLM_SCRIPT), str(server_cfg["model"]), "--host", str(server_cfg["host"]),
               "--port", str(server_cfg["port"]), "--dp-size", str(server_cfg["dp"]),
               "--tp-size", str(server_cfg["tp"]), "--log-file", str(log), "--pid-file", str(log.with_suffix(".pid")),
               "--ready-timeout", str(int(server_cfg["ready_timeout_s"])),
               "--stop-grace", str(int(server_cfg["stop_grace_s"]))]
    gpus = server_cfg.get("gpus")
    if gpus is not None:
        command += ["--gpus", str(gpus) if isinstance(gpus, (str, int)) else ",".join(str(g) for g in gpus)]
    for key in ("max_model_len", "reasoning_parser", "tool_call_parser"):
        if server_cfg.get(key) is not None:
            command += ["--" + key.replace("_", "-"), str(server_cfg[key])]
    return command + ["--", *[str(a) for a in server_cfg.get("extra_args") or []]]


def _start_vllm(server_cfg: Mapping, base_url: str) -> tuple[int, None]:
    log = server_log_path(server_cfg)
    pid_file = log.with_suffix(".pid")
    pid_file.unlink(missing_ok=True)
    # Same process group, so Ctrl-C reaches it too; its messages are echoed live and kept for the error.
    script = subprocess.Popen(vllm_command(server_cfg), stderr=subprocess.PIPE, text=True, errors="replace")
    said = []
    try:
        for line in script.stderr:
            sys.stderr.write(line)
            said.append(line)
        status = script.wait()
    except BaseException:  # interrupted while waiting: vllm.sh stops what it started (TERM if it missed the signal)
        if script.poll() is None:
            script.terminate()
        script.wait()
        if pid_file.is_file():
            stop_process_group(int(pid_file.read_text()), grace_s=float(server_cfg["stop_grace_s"]))
        raise
    if status != 0:
        reasons = "".join(line for line in said if line.startswith("vllm.sh:"))
        raise ServerStartError(f"launch/vllm.sh failed with status {status}:\n{reasons}"
                               f"last lines of {log}:\n{log_tail(log)}")
    return int(pid_file.read_text()), None


def local_command(server_cfg: Mapping) -> list[str]:
    """The ``python -m launch.chat_server`` command line for a ``local`` server block."""
    command = [sys.executable, "-m", "launch.chat_server"]
    for key in _LOCAL_FLAGS:
        if server_cfg.get(key) is not None:
            command += ["--" + key.replace("_", "-"), str(server_cfg[key])]
    command.append("--use-moe" if server_cfg.get("use_moe") else "--no-use-moe")
    command += ["--served-model-name", served_model_name(server_cfg),
                "--tool-call-parser", server_cfg.get("tool_call_parser") or "none"]
    if not server_cfg.get("keep_server"):
        command += ["--parent-pid", str(os.getpid())]  # no orphaned server if this process is killed
    return command


def _start_local(server_cfg: Mapping, base_url: str) -> tuple[int, subprocess.Popen]:
    log = server_log_path(server_cfg)
    process = start_detached(local_command(server_cfg), log)
    try:
        wait_until_ready(base_url, process, timeout_s=float(server_cfg["ready_timeout_s"]), log_path=log)
    except BaseException:
        stop_process_group(process.pid, grace_s=float(server_cfg["stop_grace_s"]), process=process)
        raise
    return process.pid, process


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt (like Ctrl-C), so cleanup still happens.

    Only in the main thread and only when nobody else handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"received signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class SharedServerCallback(Callback):
    """Hydra callback: a multirun brings its ``vllm``/``local`` server up once, before the first job, and
    down after the last; every job finds it healthy on the port and reuses it."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        if config.server.kind not in MANAGED_KINDS:
            return
        self._stack = ExitStack()
        atexit.register(self._release)  # Hydra skips on_multirun_end when a job raises
        self._stack.enter_context(provide_endpoints(config.server))

    def on_multirun_end(self, config, **kwargs) -> None:
        self._release()

    def _release(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
