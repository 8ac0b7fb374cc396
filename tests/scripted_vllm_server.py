"""Test helpers: a vLLM-dialect server scripted per conversation, running on its own event-loop thread.

``regen.job.run`` calls ``asyncio.run`` itself, so the server lives on a background loop. A
:class:`Script` maps a conversation's first user message to the replies its requests get, in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from regen.standin_server import Reply, StandinServer, vllm_body

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

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()

