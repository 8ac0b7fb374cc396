"""A recording HTTP proxy in front of a real vLLM server, for the live tests (``make test-vllm``).

Every request regen sends goes through unchanged (headers included) and every reply comes back unchanged;
each chat exchange is kept as ``{"request", "status", "reply"}``, so a test can check what regen sent
(the history it built) and save the literal exchange as a fixture that the fast suite replays.
"""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
from aiohttp import web

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


class RecordingProxy:
    """``url`` forwards to ``target``; ``exchanges`` holds the chat requests and replies in arrival order."""

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.exchanges: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)

    async def _start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._session.request(request.method, self.target + request.path_qs, data=body or None,
                                         headers=headers) as reply:
            data = await reply.read()
            status, content_type = reply.status, reply.headers.get("Content-Type", "application/json")
        if request.path == "/v1/chat/completions":
            self.exchanges.append({"request": json.loads(body), "status": status, "reply": json.loads(data)})
        return web.Response(body=data, status=status, headers={"Content-Type": content_type})

    def clear(self) -> None:
        self.exchanges.clear()

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()
