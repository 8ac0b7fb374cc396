"""Who provides the chat endpoint(s) for a regen job: ``provide_endpoints(server)`` yields ready addresses.

``vllm`` (``launch/vllm.sh``) and ``local`` (``launch.chat_server``) servers are started and their process group
stopped when the block ends, however it ends, unless ``keep_server``; ``external`` is left alone. A server already
answering on the port with the asked model is reused and left running. Multiruns share one (``SharedServerCallback``).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback

from common.endpoints.address import EndpointAddress
from common.run_log import printable
from common.user_errors import exit_on_user_error
from launch.server_process import (
    ServerStartError,
    log_tail,
    probe_models,
    start_detached,
    stop_process_group,
    wait_until_ready,
)
from regen.cancel_on_signal import stop_signals
from regen.outputs.hydra_runtime import run_folder
from regen.settings import (
    LOCAL_ARCH_KEYS,
    ExternalServer,
    LocalServer,
    RegenSettings,
    ServerSettings,
    VllmServer,
)

VLLM_SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "vllm.sh"


@contextmanager
def provide_endpoints(server: ServerSettings) -> Iterator[tuple[EndpointAddress, ...]]:
    """Yield ready endpoints for ``server``; what was started is stopped when the block exits, on a signal too."""
    if isinstance(server, ExternalServer):
        yield server.endpoints
        return
    with stop_signals(), _managed_server(server):
        yield server.endpoints


@contextmanager
def _managed_server(server: VllmServer | LocalServer) -> Iterator[None]:
    base_url, model = server.base_url, server.served_model
    served = probe_models(base_url)
    if served is not None:
        if model not in served:
            raise ServerStartError(f"{base_url} already serves {served}, not {model!r}: stop that server or "
                                   "choose another server.port")
        print(f"[server] reusing the server already answering at {base_url} ({printable(model)}); leaving it running",
              file=sys.stderr)
        yield
        return
    pid, process = _start_vllm(server) if isinstance(server, VllmServer) else _start_local(server)
    print(f"[server] {server.kind} server ready at {base_url} (pid {pid}, log {log_path(server)})", file=sys.stderr)
    try:
        yield
    finally:
        if server.keep_server:
            print(f"[server] keep_server: leaving {base_url} running; stop it with: kill -TERM -- -{pid}",
                  file=sys.stderr)
        else:
            print(f"[server] stopping the server at {base_url} (pid {pid})", file=sys.stderr)
            stop_process_group(pid, grace_s=float(server.stop_grace_s), process=process)
            if isinstance(server, VllmServer):
                _pid_file(server).unlink(missing_ok=True)  # it named a process that is gone now


def log_path(server: VllmServer | LocalServer) -> Path:
    """``server.log_file``, else ``server-<kind>-<port>.log`` in the run's Hydra folder (``out/servers/`` outside one)."""
    if server.log_file:
        return Path(server.log_file)
    return (run_folder() or Path("out/servers")) / f"server-{server.kind}-{server.port}.log"


def _pid_file(server: VllmServer) -> Path:
    """Where ``launch/vllm.sh`` writes the server's pid (its process group): beside its log."""
    return log_path(server).with_suffix(".pid")


def vllm_command(server: VllmServer) -> list[str]:
    """The ``launch/vllm.sh`` command line for ``server=vllm`` settings."""
    log = log_path(server)
    command = [str(VLLM_SCRIPT), server.model, "--host", server.host, "--port", str(server.port),
               "--dp-size", str(server.dp), "--tp-size", str(server.tp), "--log-file", str(log),
               "--pid-file", str(_pid_file(server)), "--ready-timeout", str(int(server.ready_timeout_s)),
               "--stop-grace", str(int(server.stop_grace_s))]
    if server.gpus is not None:
        command += ["--gpus", ",".join(str(g) for g in server.gpus)]
    for key in ("dp_local", "dp_address", "dp_rpc_port", "max_model_len", "reasoning_parser", "tool_call_parser"):
        value = getattr(server, key)
        if value is not None:
            flag = {"dp_local": "--dp-size-local"}.get(key, "--" + key.replace("_", "-"))
            command += [flag, str(value)]
    return command + ["--", *server.extra_args]


def _start_vllm(server: VllmServer) -> tuple[int, None]:
    log, pid_file = log_path(server), _pid_file(server)
    pid_file.unlink(missing_ok=True)
    # Same process group, so Ctrl-C reaches it too; its messages are echoed live and kept for the error.
    script = subprocess.Popen(vllm_command(server), stderr=subprocess.PIPE, text=True, errors="replace")
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
            stop_process_group(int(pid_file.read_text()), grace_s=float(server.stop_grace_s))
        raise
    if status != 0:
        reasons = "; ".join(line.strip().removeprefix("vllm.sh: ") for line in said if line.startswith("vllm.sh:")
                            and "starting:" not in line and "log:" not in line)
        raise ServerStartError(f"launch/vllm.sh failed with status {status}: {reasons} (log: {log})",
                               details=f"last lines of {log}:\n{log_tail(log)}")
    return int(pid_file.read_text()), None


def local_command(server: LocalServer) -> list[str]:
    """The ``python -m launch.chat_server`` command line for ``server=local`` settings."""
    command = [sys.executable, "-m", "launch.chat_server"]
    spec = server.model_spec
    values = [(key, getattr(spec, key)) for key in ("checkpoint", "tokenizer", *LOCAL_ARCH_KEYS)]
    values += [(key, getattr(server, key)) for key in ("host", "port", "max_batch_size", "max_prefill_tokens",
                                                       "max_model_len", "reasoning_parser", "threads")]
    for key, value in values:
        if value is not None:
            command += ["--" + key.replace("_", "-"), str(value)]
    command.append("--use-moe" if spec.use_moe else "--no-use-moe")
    command += ["--served-model-name", server.served_model, "--tool-call-parser", server.tool_call_parser or "none"]
    if not server.keep_server:
        command += ["--parent-pid", str(os.getpid())]  # no orphaned server if this process is killed
    return command


def _start_local(server: LocalServer) -> tuple[int, subprocess.Popen]:
    log = log_path(server)
    process = start_detached(local_command(server), log)
    try:
        wait_until_ready(server.base_url, process, timeout_s=float(server.ready_timeout_s), log_path=log)
    except BaseException:
        stop_process_group(process.pid, grace_s=float(server.stop_grace_s), process=process)
        raise
    return process.pid, process


class SharedServerCallback(Callback):
    """Hydra callback: a multirun's ``vllm``/``local`` server comes up before the first job and down after the last."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        if config.server.kind == ExternalServer.kind:
            return
        self._stack = ExitStack()
        atexit.register(self._release)  # Hydra skips on_multirun_end when a job raises
        with exit_on_user_error():  # a bad server setting or a failed start: error lines, not a traceback
            self._stack.enter_context(stop_signals())  # held for every job: they share its handler
            self._stack.enter_context(provide_endpoints(RegenSettings.from_config(config).server))

    def on_multirun_end(self, config, **kwargs) -> None:
        self._release()

    def _release(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
