"""Shared pieces of the regen tests: a vLLM-dialect server scripted per conversation (on its own event-loop
thread, as ``regen.job.run`` calls ``asyncio.run`` itself), data files and composed configs.

A :class:`Script` maps a conversation's first user message to the replies its requests get, in order.
The fixtures built on these are in ``tests/regen/conftest.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

from standins.vllm_server import Reply, StandinServer, vllm_body
from tests.helpers.configs import compose_config

EOS = 2


def ok(content: str | None, prompt_ids: list[int], token_ids: list[int], **kwargs) -> Reply:
    """A 200 reply with vLLM's body shape."""
    return Reply(vllm_body(content, prompt_ids, token_ids, **kwargs))


def tool_call(name: str, arguments: str, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def first_user(payload: dict) -> str:
    return next(m["content"] for m in payload["messages"] if m["role"] == "user")


class Script:
    """Replies per conversation (keyed by its first user message), consumed in request order."""

    def __init__(self, plan: dict[str, list[Reply | Callable[[dict], Reply]]]):
        self.plan = {key: list(replies) for key, replies in plan.items()}
        self.seen: dict[str, list[dict]] = {}

    def __call__(self, payload: dict) -> Reply:
        key = first_user(payload)
        self.seen.setdefault(key, []).append(payload)
        replies = self.plan.get(key)
        if not replies:
            return Reply({"error": {"message": f"script has no reply left for {key!r}"}}, status=400)
        reply = replies.pop(0)
        return reply(payload) if callable(reply) else reply


class ServerThread:
    """A :class:`StandinServer` served from a daemon thread; ``url`` is ready after construction."""

    def __init__(self, responder=None, **server_kwargs):
        self.loop = asyncio.new_event_loop()
        self.server = StandinServer(responder, **server_kwargs)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=30)

    @property
    def requests(self) -> list[dict]:
        return self.server.requests

    @property
    def chat_url(self) -> str:
        return f"{self.url}/v1/chat/completions"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def regen_config(tmp_path: Path, urls: list[str], data: Path, tokenizer: Path, *overrides: str):
    """A composed regen config: local dataset, external endpoints, fast retries, output under tmp_path."""
    return compose_config("regen", [
        "dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{','.join(urls)}]",
        f"tokenizer={tokenizer}", f"output={tmp_path / 'out.jsonl'}", "retry_backoff_s=0.01", "max_backoff_s=0.05",
        "max_retries=2", "concurrency=4", *overrides,
    ], hydra_config=True)
