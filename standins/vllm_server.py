"""A stand-in for a vLLM chat server (aiohttp): the benchmark's fixed-latency target and the tests' scripted one.

It speaks the parts of vLLM's dialect regen depends on: ``GET /health``, ``GET /v1/models`` and ``POST
/v1/chat/completions`` answering with top-level ``prompt_token_ids``, ``choices[0].token_ids`` and
``usage``; with a ``metrics`` callable also ``GET /metrics`` (Prometheus text); ``models`` replaces its
``/v1/models`` listing (one recorded from vLLM, say). What each request gets is
decided by a *responder* (payload -> :class:`Reply`); the default one answers every request after a fixed
latency with a deterministic text, tokenized with a real ``tokenizer.json`` when given one, cut at the request's
``max_tokens`` with ``finish_reason`` "length" as vLLM cuts it.
``standins.capacity_server`` builds the capacity-model server on it.

    python -m standins.vllm_server --port 0 --latency-ms 20 --tokenizer PATH   # prints "READY http://..."

``--unavailable-share 0.2`` answers a fifth of the chat requests with HTTP 503 (a kill-and-resume loop's flaky
server); ``--content-bytes N`` pads every answer to N bytes (a server sending huge replies). A reply with
``stream_bytes`` streams that many bytes without ``Content-Length`` (a body a client must stop reading).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import random
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Reply:
    """What the server does with one chat request."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as-is instead of JSON (e.g. a malformed reply)
    drop: bool = False  # close the connection without answering
    delay_s: float = 0.0
    stream_bytes: int = 0  # sent instead: that many bytes in 64 KiB chunks, no Content-Length (a reply too big to hold)


Responder = Callable[[dict], "Reply | Awaitable[Reply]"]


def vllm_body(content: str | None, prompt_ids: list[int], token_ids: list[int], *, finish_reason: str = "stop",
              tool_calls: list[dict] | None = None, reasoning: str | None = None, model: str = "standin",
              with_usage: bool = True) -> dict:
    """A chat-completion body shaped like vLLM's with ``return_token_ids: true``."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning": reasoning}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-standin", "object": "chat.completion", "created": 1760000000, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None, "token_ids": token_ids}],
        "prompt_token_ids": prompt_ids,
    }
    if with_usage:
        body["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids),
                         "total_tokens": len(prompt_ids) + len(token_ids), "prompt_tokens_details": None}
    return body


def top_logprobs_content(token_ids: list[int], k: int, vocab: int = 6400) -> list[dict]:
    """``choices[0].logprobs.content`` as vLLM's chat API gives it with ``return_tokens_as_token_ids``: per generated
    id, its log-probability and the top ``k`` (made up, a valid distribution: the id itself with 1/2, the next ids
    with 1/4, 1/8, ...)."""
    def entry(token: int, logprob: float) -> dict:
        return {"token": f"token_id:{token}", "logprob": logprob, "bytes": None}

    half = -math.log(2)
    return [{**entry(token, half), "top_logprobs": [entry((token + j) % vocab, half * (j + 1)) for j in range(k)]}
            for token in token_ids]


class SyntheticResponder:
    """Answers every request with a deterministic text of ``completion_words`` words (each answer's length
    drawn within +-``length_spread`` of it from a hash of the messages); ids from ``tokenizer_file`` if given."""

    WORDS = "the model writes a fresh answer here so the client has real tokens to carry".split()

    def __init__(self, tokenizer_file: str | None = None, completion_words: int = 48, model: str = "standin",
                 length_spread: float = 0.0, content_bytes: int = 0, unavailable_share: float = 0.0):
        self.tokenizer = None
        if tokenizer_file:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(tokenizer_file)
        self.completion_words = completion_words
        self.model = model
        self.length_spread = length_spread
        self.content_bytes = content_bytes  # > 0: each answer's content padded to that many bytes (a huge reply)
        self.unavailable_share = unavailable_share  # that share of requests (drawn from a seeded generator) gets 503
        self._draws = random.Random(0)

    def _ids(self, text: str) -> list[int]:
        if self.tokenizer is not None:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return [36 + byte % 6000 for byte in text.encode("utf-8")[::4]]

    def __call__(self, payload: dict) -> Reply:
        if self.unavailable_share and self._draws.random() < self.unavailable_share:
            return Reply({"error": {"message": "stand-in: service unavailable", "code": 503}}, status=503)
        messages = payload.get("messages") or []
        prompt = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        draw = zlib.crc32(prompt.encode("utf-8")) / 0xFFFFFFFF  # the same prompt, the same length
        count = max(1, round(self.completion_words * (1 + self.length_spread * (2 * draw - 1))))
        words = [self.WORDS[(turn + i) % len(self.WORDS)] for i in range(count)]
        content = f"Answer {turn}: " + " ".join(words)
        prompt_ids = self._ids(prompt + "<|im_start|>assistant\n")
        token_ids = self._ids(content + "<|im_end|>")
        finish_reason = "stop"
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        if isinstance(limit, int) and 0 < limit < len(token_ids):  # as vLLM: cut at max_tokens, finish "length"
            token_ids, finish_reason = token_ids[:limit], "length"
            content = (self.tokenizer.decode(token_ids) if self.tokenizer is not None
                       else content.encode("utf-8")[:4 * limit].decode("utf-8", "ignore"))
        if self.content_bytes:
            content = content.ljust(self.content_bytes, "x")
        body = vllm_body(content, prompt_ids, token_ids, finish_reason=finish_reason, model=self.model)
        if payload.get("logprobs") and payload.get("top_logprobs"):
            body["choices"][0]["logprobs"] = {"content": top_logprobs_content(token_ids, payload["top_logprobs"])}
        return Reply(body)


class StandinServer:
    """An aiohttp server on 127.0.0.1 answering with ``responder``; ``requests`` holds the payloads seen."""

    def __init__(self, responder: Responder | None = None, *, model: str = "standin", latency_s: float = 0.0,
                 host: str = "127.0.0.1", keep_requests: bool = True, die_after: int | None = None,
                 metrics: Callable[[], str] | None = None, models: dict | None = None,
                 completions: Responder | None = None):
        self.responder = responder or SyntheticResponder(model=model)
        self.completions = completions  # answers /v1/completions (e.g. standins.teacher_scores.PromptLogprobs)
        self.metrics = metrics
        self.models = models  # a /v1/models body to answer with (e.g. one recorded from vLLM)
        self.model, self.latency_s, self.host = model, latency_s, host
        self.keep_requests, self.die_after = keep_requests, die_after
        self.requests: list[dict] = []
        self.streamed_bytes = 0  # bytes of ``stream_bytes`` replies written before the client stopped reading
        self.authorizations: list[str | None] = []
        self.request_count = 0
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        if self.keep_requests:
            self.authorizations.append(request.headers.get("Authorization"))
        if self.models is not None:
            return web.json_response(self.models)
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 1760000000, "owned_by": "vllm", "root": self.model,
             "parent": None, "max_model_len": 32768}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics(), content_type="text/plain", charset="utf-8")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, self.responder)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, self.completions)

    async def _answer(self, request: web.Request, responder: Responder) -> web.StreamResponse:
        try:
            payload = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON", "code": 400}}, status=400)
        self.request_count += 1
        if self.die_after is not None and self.request_count > self.die_after:
            os._exit(17)  # a crashed server: in-flight connections reset, later ones refused
        if self.keep_requests:
            self.requests.append(payload)
            self.authorizations.append(request.headers.get("Authorization"))
        reply = responder(payload)
        if inspect.isawaitable(reply):
            reply = await reply
        if self.latency_s or reply.delay_s:
            await asyncio.sleep(self.latency_s + reply.delay_s)
        if reply.drop:
            request.transport.abort()
            return web.Response(status=500)
        if reply.stream_bytes:
            return await self._stream(request, reply.stream_bytes)
        if reply.raw is not None:
            return web.Response(body=reply.raw, status=reply.status, headers=reply.headers,
                                content_type="application/json")
        return web.json_response(reply.body, status=reply.status, headers=reply.headers)

    async def _stream(self, request: web.Request, size: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b'{"pad": "' + b"x" * ((1 << 16) - 9)
        try:
            while self.streamed_bytes < size:
                await response.write(chunk)
                self.streamed_bytes += len(chunk)
        except (ConnectionError, RuntimeError):  # the client stopped reading and closed the connection
            pass
        return response

    async def start(self, port: int = 0) -> str:
        """Listen on ``host:port`` (0 = any free port); returns the base URL."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.completions is not None:
            app.router.add_post("/v1/completions", self._completions)
        if self.metrics is not None:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port)
        await site.start()
        bound_port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _serve(args: argparse.Namespace) -> None:
    responder = SyntheticResponder(args.tokenizer, args.completion_words, args.model,
                                   content_bytes=args.content_bytes, unavailable_share=args.unavailable_share)
    server = StandinServer(responder, model=args.model, latency_s=args.latency_ms / 1000, host=args.host,
                           keep_requests=False, die_after=args.die_after)
    url = await server.start(args.port)
    print(f"READY {url}", flush=True)
    try:
        await asyncio.sleep(args.max_lifetime_s)
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="standin")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--tokenizer", help="tokenizer.json used to turn prompts and answers into ids")
    parser.add_argument("--completion-words", type=int, default=48)
    parser.add_argument("--die-after", type=int, help="exit abruptly on the request after this many")
    parser.add_argument("--content-bytes", type=int, default=0, help="pad each answer's content to this many bytes")
    parser.add_argument("--unavailable-share", type=float, default=0.0,
                        help="answer this share of chat requests with HTTP 503 (seeded draws)")
    parser.add_argument("--max-lifetime-s", type=float, default=3600.0, help="stop on its own after this long")
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
