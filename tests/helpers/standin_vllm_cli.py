"""Shared pieces of the serving tests: a stand-in `vllm` executable (`vllm serve MODEL --host H --port P ...`),
a `curl` that logs its arguments, free ports, and a wait for a file that the stand-in writes when it starts.

Tests put a `vllm` wrapper that runs this file first on PATH. It appends its argv (JSON) to
$STANDIN_VLLM_ARGV_LOG, writes its pid to $STANDIN_VLLM_STARTED (first thing, before slow imports), then
behaves as $STANDIN_VLLM_MODE says:
  serve    (default) answer /health, /v1/models with MODEL and /v1/chat/completions with a fixed vLLM-shaped
           reply (after $STANDIN_VLLM_CHAT_DELAY_S); with an API key (`--api-key KEY`, which vLLM prefers, else
           $VLLM_API_KEY; $STANDIN_VLLM_API_KEY stands for one from elsewhere, e.g. a --config file) /v1/* need
           it as bearer token (as vLLM does); every request's path and Authorization header go to
           $STANDIN_VLLM_REQUEST_LOG (a refused key gets $STANDIN_VLLM_AUTH_STATUS, default 401)
  die      print an error and exit 3 before listening
  hang     never listen
  stubborn serve, but ignore SIGTERM (only SIGKILL stops it)
With --headless it serves no HTTP at all and runs until it is stopped, as a vLLM headless node does.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def group_gone(pgid: int) -> bool:
    """Whether no process of process group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install_standin_vllm(bin_dir: Path) -> Path:
    """Write a `vllm` executable into ``bin_dir`` that runs this stand-in with the current interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "vllm"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def install_logging_curl(bin_dir: Path, log: Path) -> Path:
    """Write a `curl` into ``bin_dir`` that appends its arguments (one JSON line) to ``log``, then runs curl."""
    real = next(str(Path(d) / "curl") for d in os.environ["PATH"].split(os.pathsep)
                if (Path(d) / "curl").is_file() and Path(d) != bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "curl"
    wrapper.write_text(f'#!{sys.executable}\nimport json, os, sys\n'
                       f'open({str(log)!r}, "a").write(json.dumps(sys.argv[1:]) + "\\n")\n'
                       f'os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n')
    wrapper.chmod(0o755)
    return wrapper


def _running(process: subprocess.Popen | int) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    try:
        os.kill(process, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(condition: Callable[[], object], process: subprocess.Popen | int, what: str, *,
               limit_s: float = 600) -> object:
    """``condition()``'s first true value, polled while ``process`` (a child, or a pid) -- whose work makes it
    true -- still runs. Fails at once if ``process`` exits first; ``limit_s`` only bounds a wedged machine,
    it is no deadline a slow start can miss."""
    started = time.monotonic()
    while not (value := condition()):
        assert _running(process), f"{process} exited before {what}"
        assert time.monotonic() - started < limit_s, f"{what} never happened"
        time.sleep(0.05)
    return value


def wait_for_file(path: Path, process: subprocess.Popen | int) -> str:
    """The content of ``path`` once it exists (written, directly or not, by the running ``process``)."""
    wait_until(path.is_file, process, f"{path.name} appeared")
    return path.read_text()


def wait_until_answers(base_url: str, process: subprocess.Popen | int) -> None:
    """Return once ``base_url`` answers /health and /v1/models, while ``process`` (serving it) still runs."""
    from launch.server_process import probe_models

    wait_until(lambda: probe_models(base_url) is not None, process, f"{base_url} answered")


def _started() -> None:
    target = os.environ.get("STANDIN_VLLM_STARTED")
    if target:
        temporary = f"{target}.{os.getpid()}.tmp"
        Path(temporary).write_text(str(os.getpid()))
        os.replace(temporary, target)


def _serve(model: str, host: str, port: int, mode: str, api_key: str | None) -> None:
    import asyncio

    from aiohttp import web

    request_log = os.environ.get("STANDIN_VLLM_REQUEST_LOG")
    delay_s = float(os.environ.get("STANDIN_VLLM_CHAT_DELAY_S", "0"))

    @web.middleware
    async def guard(request, handler):
        if request_log:
            with open(request_log, "a") as log:
                log.write(json.dumps([request.path, request.headers.get("Authorization")]) + "\n")
        if api_key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {api_key}":
            return web.json_response({"error": "Unauthorized"}, status=int(os.environ.get("STANDIN_VLLM_AUTH_STATUS", 401)))
        return await handler(request)

    async def health(request):
        return web.Response(status=200)

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "root": model}]})

    async def chat(request):
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.json_response({
            "id": "chatcmpl-standin", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok", "reasoning": None},
                         "finish_reason": "stop", "stop_reason": None, "token_ids": [1, 2]}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}, "prompt_token_ids": [5],
        })

    app = web.Application(middlewares=[guard])
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.post("/v1/chat/completions", chat)])
    web.run_app(app, host=host, port=port, print=None, handle_signals=mode != "stubborn", shutdown_timeout=0.5)


def main() -> None:
    if os.environ.get("STANDIN_VLLM_ARGV_LOG"):
        with open(os.environ["STANDIN_VLLM_ARGV_LOG"], "a") as log:
            log.write(json.dumps(sys.argv[1:]) + "\n")
    _started()
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--api-key")
    args, _unknown = parser.parse_known_args()
    mode = os.environ.get("STANDIN_VLLM_MODE", "serve")
    print(f"INFO stand-in vllm pid {os.getpid()} mode {mode} loading {args.model}"
          + (" (headless)" if args.headless else ""), flush=True)
    if mode == "die":
        print("ERROR stand-in: CUDA out of memory while loading weights", flush=True)
        sys.exit(3)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "hang" or args.headless:
        while True:
            select.select([], [], [], 3600)
    api_key = args.api_key or os.environ.get("STANDIN_VLLM_API_KEY") or os.environ.get("VLLM_API_KEY")
    _serve(args.model, args.host, args.port, mode, api_key)


if __name__ == "__main__":
    main()
