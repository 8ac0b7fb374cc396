"""The embedded CPU server: an OpenAI-compatible aiohttp app speaking vLLM's dialect, on transformers.

    python -m launch.chat_server --checkpoint out/tiny/tiny_teacher.pth --tokenizer TOKENIZER \\
        --hidden-size 128 --num-hidden-layers 2 --num-attention-heads 4 --num-key-value-heads 2

Serves a MiniMind ``.pth`` or an HF model on ``/v1/models``, ``/v1/chat/completions`` (non-streaming), ``/health``
and ``/stats``. Requests are prepared on one worker thread (the tokenizer is never shared between threads) and share
forward passes (``launch.batch_engine``). Binds 127.0.0.1 by default; ``--api-key`` guards all but ``/health``.
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the command's start-up (launch.serve)
    from launch.serve import main

    main()
    raise SystemExit

import argparse
import asyncio
import errno
import hmac
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

from aiohttp import web
from jinja2 import TemplateError

from common.minimind.tokenizer import max_token_bytes, token_floor
from common.start_up import started
from common.user_errors import UserError
from launch.batch_engine import BatchEngine, SamplingParams
from launch.chat_reply import build_reply
from launch.chat_request import SAMPLING_DEFAULTS, ChatRequest, RequestError, decode_body, parse_chat_request
from launch.connection_cap import CappedListener, default_limit, listen
from launch.serve import build_parser

SERVICE_KEY = web.AppKey("chat_service", object)
# aiohttp does not cancel a handler whose client went away unless told to: with it, the handler's CancelledError
# cancels the engine's future, and the sequence leaves the batch at the next step (counted as cancelled_requests)
RUNNER_OPTIONS = {"handler_cancellation": True}
MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class ChatService:
    """Everything a request handler needs: the engine, the tokenizer and the serving options."""

    engine: BatchEngine
    tokenizer: object
    model_name: str
    max_model_len: int
    reasoning_parser: str | None = None
    tool_call_parser: str | None = "hermes"
    sampling_defaults: dict | None = None
    created: int = 0
    api_key: str | None = None  # requests must carry it as a bearer token (vLLM's --api-key); None: open
    longest_token: int | None = None  # UTF-8 bytes of the longest vocabulary entry (check_body_fits), read once
    body_timeout_s: float = 30.0  # a body not read whole by then is a 408 and the connection is closed
    listener: CappedListener | None = None  # the listening socket, with its connection cap's counters
    preparer: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="prepare"))

    def prepare(self, raw: bytes) -> tuple[ChatRequest, list[int], SamplingParams]:
        """Decode, check and tokenize one request body (on the ``preparer`` thread); raises ``RequestError``."""
        chat = parse_chat_request(decode_body(raw, self.check_body_fits), sampling_defaults=self.sampling_defaults,
                                  tool_parser=self.tool_call_parser)
        if chat.model is not None and chat.model != self.model_name:
            raise RequestError(f"The model `{chat.model}` does not exist.", status=404, param="model")
        prompt_ids = self.prompt_ids(chat)
        return chat, prompt_ids, chat.sampling_params(self.check_length(len(prompt_ids), chat.max_tokens))

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The chat template's token ids for this request (what vLLM returns as ``prompt_token_ids``)."""
        try:
            ids = self.tokenizer.apply_chat_template(
                request.messages, tools=request.tools, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, tokenize=True, return_dict=False,
                **request.chat_template_kwargs,
            )
        except (TemplateError, ValueError, TypeError) as error:
            raise RequestError(f"the chat template could not render these messages: {str(error)[:300]}",
                               param="messages") from None
        if not (isinstance(ids, list) and all(type(i) is int for i in ids)):  # a template kwarg changed what it returns
            raise RequestError("chat_template_kwargs made the chat template return something other than token ids",
                               param="chat_template_kwargs")
        return ids

    def check_body_fits(self, body) -> None:
        """A 400 before any per-message work when what the template renders must hold more tokens than the context
        (``token_floor`` of its bytes, plus a token per message): every message's content, tool calls and reasoning,
        and the tools, counted, so no field of a huge body is validated, rendered or tokenized."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return  # parse_chat_request names what is wrong
        messages, text_bytes = body["messages"], _rendered_bytes(body.get("tools"))
        for message in messages:
            if isinstance(message, dict):
                text_bytes += sum(_rendered_bytes(message.get(key)) for key in RENDERED_KEYS if key != "content")
                content = message.get("content")  # a string, or parts whose text the template joins
                text_bytes += sum(_rendered_bytes(part.get("text")) for part in content if isinstance(part, dict)) if (
                    isinstance(content, list)) else _rendered_bytes(content)
                calls = message.get("tool_calls")
                for call in calls if isinstance(calls, list) else []:  # the template renders name and arguments
                    function = call.get("function") if isinstance(call, dict) else None
                    if isinstance(function, dict):
                        text_bytes += _rendered_bytes(function.get("name")) + _rendered_bytes(function.get("arguments"))
        if self.longest_token is None:
            self.longest_token = max_token_bytes(self.tokenizer)
        floor = token_floor(text_bytes, self.longest_token) + len(messages)
        if floor >= self.max_model_len:
            raise RequestError(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                               f"request holds {len(messages)} messages and {text_bytes} bytes of text (messages, "
                               f"tool calls, tools), at least {floor} tokens. Please reduce the length of the input "
                               "messages.", param="messages")

    def check_length(self, prompt_len: int, max_tokens: int | None) -> int:
        """The completion budget for a prompt, or a 400 like vLLM's when the context is too small."""
        limit = self.max_model_len
        if prompt_len >= limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens. However, your request "
                               f"has {prompt_len} input tokens. Please reduce the length of the input messages.")
        if max_tokens is None:
            return limit - prompt_len
        if prompt_len + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.", param="max_tokens")
        return max_tokens


RENDERED_KEYS = ("content", "reasoning", "reasoning_content", "name")  # a message's fields the template writes out


def _rendered_bytes(value) -> int:
    """UTF-8 bytes of a string, or of a JSON value written compactly (the least the template can render of it)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    try:  # a non-finite number or a too-deep value: decode_body's walk names it next
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())
    except RecursionError:
        return 0


def _error(message: str, status: int, param: str | None = None) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeout", 413: "RequestEntityTooLarge",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


async def list_models(request: web.Request) -> web.Response:
    service: ChatService = request.app[SERVICE_KEY]
    card = {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "embedded",
            "root": service.model_name, "parent": None, "max_model_len": service.max_model_len}
    return web.json_response({"object": "list", "data": [card]})


async def chat_completions(request: web.Request) -> web.Response:
    service: ChatService = request.app[SERVICE_KEY]
    try:
        raw = await asyncio.wait_for(request.read(), service.body_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        return _error(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
    except asyncio.TimeoutError:  # a body sent a byte at a time holds a connection (and a descriptor) forever
        response = _error(f"the request body did not arrive within {service.body_timeout_s:g} s", 408)
        response.force_close()
        return response
    try:
        chat, prompt_ids, params = await asyncio.get_running_loop().run_in_executor(service.preparer,
                                                                                    service.prepare, raw)
        future = service.engine.submit(prompt_ids, params)
    except RequestError as error:
        return _error(error.message, error.status, error.param)
    except RuntimeError as error:  # the engine is shutting down
        return _error(str(error), 503)
    try:
        generation = await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()  # the client went away: the engine drops the sequence at its next step
        raise
    except Exception as error:
        return _error(f"generation failed: {error}", 500)
    reply = build_reply(
        model=service.model_name, prompt_ids=prompt_ids, generation=generation, tokenizer=service.tokenizer,
        return_token_ids=chat.return_token_ids, skip_special_tokens=chat.skip_special_tokens,
        reasoning_parser=service.reasoning_parser,
        parse_tool_calls=bool(chat.tools) and chat.tool_choice == "auto" and service.tool_call_parser is not None,
    )
    return web.json_response(reply)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def stats(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    listener = service.listener
    connections = {} if listener is None else {"open_connections": listener.open_connections,
                                               "max_connections": listener.limit,
                                               "refused_connections": listener.refused}
    return web.json_response({**service.engine.stats(), **connections})


@web.middleware
async def _require_key(request: web.Request, handler) -> web.StreamResponse:
    """vLLM's ``--api-key``: a request without ``Authorization: Bearer KEY`` gets 401 (``/health`` stays open)."""
    if request.path != "/health":
        expected = f"Bearer {request.app[SERVICE_KEY].api_key}".encode()
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


def create_app(service: ChatService) -> web.Application:
    """The aiohttp application around a started engine; the engine stops when the app shuts down."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_require_key] if service.api_key else [])
    app[SERVICE_KEY] = service
    app.add_routes([
        web.get("/v1/models", list_models),
        web.post("/v1/chat/completions", chat_completions),
        web.get("/health", health),
        web.get("/stats", stats),
    ])

    async def stop_engine(_app: web.Application) -> None:  # first thing on shutdown: in-flight requests fail fast
        await asyncio.to_thread(service.engine.stop)
        service.preparer.shutdown(wait=False, cancel_futures=True)

    app.on_shutdown.append(stop_engine)
    return app


def generation_defaults(checkpoint: str) -> dict:
    """Sampling defaults from an HF folder's generation_config.json (vLLM's ``--generation-config auto``)."""
    path = Path(checkpoint).expanduser() / "generation_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return {k: config[k] for k in SAMPLING_DEFAULTS if config.get(k) is not None}


def load_service(args: argparse.Namespace) -> ChatService:
    """Load the model and tokenizer named by the CLI arguments and wrap them in a started engine."""
    import torch

    from common.minimind.model import load_model
    from common.minimind.spec import MiniMindArch, ModelSpec

    if args.threads:
        torch.set_num_threads(args.threads)
    block = {"checkpoint": args.checkpoint, "tokenizer": args.tokenizer,
             **{f.name: getattr(args, f.name) for f in fields(MiniMindArch)}}
    model, tokenizer = load_model(ModelSpec(**block), role="server")
    layer_types = set(getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"the embedded server batches full-attention models only; this one has {layer_types}")
    max_model_len = args.max_model_len or model.config.max_position_embeddings
    eos = model.generation_config.eos_token_id
    eos_ids = {tokenizer.eos_token_id, *([] if eos is None else [eos] if isinstance(eos, int) else eos)}
    engine = BatchEngine(model, eos_token_ids=eos_ids, max_model_len=max_model_len,
                         max_batch_size=args.max_batch_size, max_prefill_tokens=args.max_prefill_tokens,
                         pad_token_id=tokenizer.pad_token_id)
    return ChatService(
        engine=engine.start(), tokenizer=tokenizer, model_name=args.served_model_name or args.checkpoint,
        max_model_len=max_model_len, reasoning_parser=args.reasoning_parser,
        tool_call_parser=None if args.tool_call_parser == "none" else args.tool_call_parser,
        sampling_defaults=generation_defaults(args.checkpoint), created=int(time.time()),
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None, body_timeout_s=args.body_timeout_s,
    )


def bind_error(host: str, port: int, error: OSError) -> UserError:
    """The one line for a server that could not listen on ``host:port``, naming the flag that changes it."""
    reason = os.strerror(error.errno) if error.errno and error.errno > 0 else error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        hint = "another program listens there: choose another --port"
    elif error.errno == errno.EACCES:
        hint = "ports below 1024 need privileges: choose another --port"
    else:  # a name that does not resolve, an address not of this machine
        hint = "--host takes an address of this machine, as 127.0.0.1 or 0.0.0.0"
    return UserError(f"cannot serve on {host}:{port}: {reason.lower()} ({hint})")


class OneLinePerCondition:
    """The event loop's exception handler: one ``warning:`` line per condition a minute, not a traceback per
    connection (past ``ulimit -n`` that was megabytes of log a second)."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s, self.last = every_s, {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        key = (context.get("message", ""), type(error).__name__)
        now = time.monotonic()
        if now - self.last.get(key, -self.every_s) >= self.every_s:
            self.last[key] = now
            print(f"warning: {key[0]}" + (f": {type(error).__name__}: {error}" if error else "")
                  + " (said once a minute at most)", file=sys.stderr, flush=True)


async def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    """Load the model, then serve until SIGINT / SIGTERM (aiohttp's handlers from then on)."""
    args = build_parser().parse_args(argv)  # launch.serve parsed them once before the imports
    service = load_service(args)
    app = create_app(service)

    async def quiet_loop(_app: web.Application) -> None:
        asyncio.get_running_loop().set_exception_handler(OneLinePerCondition())

    app.on_startup.append(quiet_loop)
    if args.parent_pid:
        async def watch_parent(_app: web.Application) -> None:
            _app["parent_watch"] = asyncio.create_task(_exit_with_parent(args.parent_pid))
        app.on_startup.append(watch_parent)
    def serving(_banner: str) -> None:  # run_app's print: called once the site is up on the socket
        print(f"serving {service.model_name} on http://{args.host}:{args.port} "
              f"(max batch {args.max_batch_size}, max model len {service.max_model_len}, "
              f"max connections {service.listener.limit})", flush=True)

    try:
        service.listener = listen(args.host, args.port, args.max_connections or default_limit())
    except OSError as error:  # socket.gaierror included: a --host that does not resolve
        raise bind_error(args.host, args.port, error) from None
    started()
    web.run_app(app, sock=service.listener, print=serving, access_log=None, **RUNNER_OPTIONS)
