"""A stand-in for the `vllm` executable in lifecycle tests: `vllm serve MODEL --host H --port P ...`.

Tests put a `vllm` wrapper that runs this file first on PATH. It appends its argv (JSON) to
$STANDIN_VLLM_ARGV_LOG, then behaves as $STANDIN_VLLM_MODE says:
  serve    (default) answer /v1/models with MODEL and /v1/chat/completions with a fixed vLLM-shaped reply
  die      print an error and exit 3 before listening
  hang     never listen
  stubborn serve, but ignore SIGTERM (only SIGKILL stops it)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from aiohttp import web


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


def main() -> None:
    if os.environ.get("STANDIN_VLLM_ARGV_LOG"):
        with open(os.environ["STANDIN_VLLM_ARGV_LOG"], "a") as log:
            log.write(json.dumps(sys.argv[1:]) + "\n")
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _unknown = parser.parse_known_args()
    mode = os.environ.get("STANDIN_VLLM_MODE", "serve")
    print(f"INFO stand-in vllm pid {os.getpid()} mode {mode} loading {args.model}", flush=True)
    if mode == "die":
        print("ERROR stand-in: CUDA out of memory while loading weights", flush=True)
        sys.exit(3)
    if mode == "hang":
        while True:
            time.sleep(1)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": args.model, "object": "model", "root": args.model}]})

    async def chat(request):
        return web.json_response({
            "id": "chatcmpl-standin", "object": "chat.completion", "model": args.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok", "reasoning": None},
                         "finish_reason": "stop", "stop_reason": None, "token_ids": [1, 2]}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}, "prompt_token_ids": [5],
        })

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat)])
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=mode != "stubborn")


if __name__ == "__main__":
    main()
