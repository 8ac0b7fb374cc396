"""The embedded server over real HTTP (aiohttp on 127.0.0.1, ephemeral port) with a tiny random MiniMind model
and the MiniMind tokenizer: vLLM's reply shape, token bookkeeping, stop/length, tool calls, reasoning,
batching under concurrency, 400/404/413 errors (NaN anywhere, deep nesting, huge bodies) that never touch
other requests, and tokenization off the event loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import aiohttp
import pytest
import pytest_asyncio
import torch
from aiohttp.test_utils import TestServer
from transformers import Qwen3ForCausalLM

from common.minimind.spec import MiniMindArch
from launch.batch_engine import BatchEngine
from launch.chat_server import ChatService, create_app
from tests.helpers.paths import REPO_ROOT

EOS = 2
MODEL_NAME = "tiny-test"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


class ScriptedQwen3(Qwen3ForCausalLM):
    """A real (random) Qwen3 whose next tokens are forced: after a prompt of ``script_start`` tokens, the
    k-th generated token is ``script[k]``; past the script the model's own logits decide. The engine runs the body
    (``model.model``, whose position ids say where each row is) and then the output projection, whose logits are
    forced."""

    script_start: int = 0
    script: list[int] = []

    def __init__(self, config):
        super().__init__(config)
        self.model.register_forward_pre_hook(self._note_positions, with_kwargs=True)
        self.lm_head.register_forward_hook(self._force)

    def _note_positions(self, module, args, kwargs):
        self.positions = kwargs["position_ids"][:, -1].tolist()

    def _force(self, module, args, logits):
        for row, position in enumerate(self.positions):
            k = position + 1 - self.script_start
            if 0 <= k < len(self.script):
                logits[row] = float("-inf")
                logits[row, self.script[k]] = 0.0
        return logits


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    arch = MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    return ScriptedQwen3(arch.hf_config()).eval()


@pytest_asyncio.fixture
async def serve(model, tokenizer):
    started = []

    async def start(**options) -> tuple[str, ChatService]:
        max_model_len = options.pop("max_model_len", 2048)
        engine = BatchEngine(model, eos_token_ids={EOS}, max_model_len=max_model_len).start()
        service = ChatService(engine=engine, tokenizer=tokenizer, model_name=MODEL_NAME,
                              max_model_len=max_model_len, **options)
        server = TestServer(create_app(service), host="127.0.0.1")  # handler_cancellation=True, as RUNNER_OPTIONS
        await server.start_server()
        started.append(server)
        return str(server.make_url("")).rstrip("/"), service

    model.script, model.script_start = [], 0
    async with aiohttp.ClientSession() as session:
        start.session = session
        yield start
    for server in started:
        await server.close()


async def post(session, base, body) -> tuple[int, dict]:
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


def template_ids(tokenizer, messages, **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **kwargs))


def script_reply(model, tokenizer, prompt_ids, text: str, *, eos: bool = True) -> list[int]:
    model.script_start = len(prompt_ids)
    model.script = tokenizer.encode(text, add_special_tokens=False) + ([EOS] if eos else [])
    return model.script


@pytest.mark.asyncio
async def test_models_lists_the_served_name(serve):
    base, _ = await serve()
    async with serve.session.get(f"{base}/v1/models") as response:
        listing = await response.json()
    assert [card["id"] for card in listing["data"]] == [MODEL_NAME]
    assert listing["data"][0]["max_model_len"] == 2048


@pytest.mark.asyncio
async def test_reply_token_bookkeeping_matches_the_chat_template(serve, tokenizer):
    base, _ = await serve()
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    status, reply = await post(serve.session, base, {"model": MODEL_NAME, "messages": messages, "max_tokens": 12,
                                                     "temperature": 0, "return_token_ids": True})
    assert status == 200
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == template_ids(tokenizer, messages)
    assert len(choice["token_ids"]) == reply["usage"]["completion_tokens"] <= 12
    assert reply["usage"] == {"prompt_tokens": len(reply["prompt_token_ids"]), "completion_tokens":
                              len(choice["token_ids"]), "total_tokens": len(reply["prompt_token_ids"]) +
                              len(choice["token_ids"]), "prompt_tokens_details": None}
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert reply["id"].startswith("chatcmpl-") and reply["object"] == "chat.completion"
    assert reply["model"] == MODEL_NAME and choice["message"]["role"] == "assistant"
    assert choice["message"]["reasoning"] is None and "tool_calls" not in choice["message"]
    without = (await post(serve.session, base, {"messages": messages, "max_tokens": 12, "temperature": 0}))[1]
    assert without["prompt_token_ids"] is None and without["choices"][0]["token_ids"] is None
    assert without["choices"][0]["message"]["content"] == choice["message"]["content"]  # greedy: same text


@pytest.mark.asyncio
async def test_stop_on_eos_versus_length(serve, model, tokenizer):
    base, _ = await serve()
    prompt = template_ids(tokenizer, USER)
    script = script_reply(model, tokenizer, prompt, "It is sunny.")
    status, stopped = await post(serve.session, base, {"messages": USER, "max_tokens": 50, "return_token_ids": True})
    assert status == 200
    choice = stopped["choices"][0]
    assert choice["token_ids"] == script and choice["token_ids"][-1] == EOS
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    assert choice["message"]["content"] == "It is sunny."
    assert stopped["usage"]["completion_tokens"] == len(script)
    _, cut = await post(serve.session, base, {"messages": USER, "max_tokens": 3, "return_token_ids": True})
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "length" and choice["token_ids"] == script[:3]
    assert choice["message"]["content"] == tokenizer.decode(script[:3])


@pytest.mark.asyncio
async def test_scripted_tool_call_comes_back_as_tool_calls(serve, model, tokenizer):
    base, _ = await serve(tool_call_parser="hermes")
    prompt = template_ids(tokenizer, USER, tools=TOOLS)
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    script = script_reply(model, tokenizer, prompt, text)
    status, reply = await post(serve.session, base, {"messages": USER, "tools": TOOLS, "tool_choice": "auto",
                                                     "max_tokens": 80, "return_token_ids": True})
    assert status == 200
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == prompt and choice["token_ids"] == script
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check.\n"
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and len(call["id"]) > len("chatcmpl-tool-")
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    # the same text without tools in the request is plain content
    model.script_start = len(template_ids(tokenizer, USER))
    _, plain = await post(serve.session, base, {"messages": USER, "max_tokens": 80})
    assert plain["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in plain["choices"][0]["message"]
    assert plain["choices"][0]["message"]["content"] == text


@pytest.mark.asyncio
async def test_malformed_tool_call_stays_content(serve, model, tokenizer):
    base, _ = await serve(tool_call_parser="hermes")
    text = "<tool_call>\n{not json}\n</tool_call>"
    script_reply(model, tokenizer, template_ids(tokenizer, USER, tools=TOOLS), text)
    _, reply = await post(serve.session, base, {"messages": USER, "tools": TOOLS, "max_tokens": 40})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == text
    assert "tool_calls" not in choice["message"]


@pytest.mark.asyncio
async def test_reasoning_parser_and_chat_template_kwargs(serve, model, tokenizer):
    base, _ = await serve(reasoning_parser="qwen3")
    prompt = template_ids(tokenizer, USER, open_thinking=True)
    assert prompt != template_ids(tokenizer, USER)  # the kwarg reaches the template
    script_reply(model, tokenizer, prompt, "Oslo is cold in winter.\n</think>\n\nAbout 4 C.")
    _, reply = await post(serve.session, base, {"messages": USER, "max_tokens": 60, "return_token_ids": True,
                                                "chat_template_kwargs": {"open_thinking": True}})
    message = reply["choices"][0]["message"]
    assert reply["prompt_token_ids"] == prompt
    assert message["reasoning"] == "Oslo is cold in winter.\n" and message["content"] == "\n\nAbout 4 C."


@pytest.mark.asyncio
async def test_eight_concurrent_requests_take_fewer_passes_than_eight_sequential(serve):
    base, service = await serve()
    bodies = [{"messages": [{"role": "user", "content": f"Question {i}: " + "why " * i}], "max_tokens": 8,
               "temperature": 0, "ignore_eos": True, "return_token_ids": True} for i in range(8)]
    before = service.engine.stats()["forward_passes"]
    sequential = [(await post(serve.session, base, body))[1] for body in bodies]
    sequential_passes = service.engine.stats()["forward_passes"] - before
    assert sequential_passes == 8 * 8  # each alone: 1 prefill + 7 decode passes
    before = service.engine.stats()["forward_passes"]
    concurrent = await asyncio.gather(*(post(serve.session, base, body) for body in bodies))
    concurrent_passes = service.engine.stats()["forward_passes"] - before
    assert concurrent_passes < sequential_passes
    assert [r["choices"][0]["token_ids"] for _, r in concurrent] == [r["choices"][0]["token_ids"] for r in sequential]
    async with serve.session.get(f"{base}/stats") as response:
        assert (await response.json())["forward_passes"] == service.engine.stats()["forward_passes"]


@pytest.mark.asyncio
async def test_seed_makes_sampling_repeatable(serve):
    base, _ = await serve()
    body = {"messages": USER, "max_tokens": 10, "temperature": 1.0, "top_p": 0.95, "seed": 7, "ignore_eos": True,
            "return_token_ids": True}
    first = (await post(serve.session, base, body))[1]["choices"][0]["token_ids"]
    second = (await post(serve.session, base, body))[1]["choices"][0]["token_ids"]
    assert first == second and len(first) == 10


@pytest.mark.asyncio
@pytest.mark.parametrize("body,status,fragment", [
    ({}, 400, "'messages'"),
    ({"messages": []}, 400, "'messages'"),
    ({"messages": "hi"}, 400, "'messages'"),
    ([1, 2], 400, "JSON object"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "only text parts"),
    ({"messages": USER, "max_tokens": 0}, 400, "'max_tokens'"),
    ({"messages": USER, "max_tokens": "5"}, 400, "'max_tokens'"),
    ({"messages": USER, "temperature": -0.5}, 400, "'temperature'"),
    ({"messages": USER, "temperature": "hot"}, 400, "'temperature'"),
    ({"messages": USER, "top_p": 0}, 400, "'top_p'"),
    ({"messages": USER, "top_k": -2}, 400, "'top_k'"),
    ({"messages": USER, "seed": 1.5}, 400, "'seed'"),
    ({"messages": USER, "seed": 2**70}, 400, "'seed'"),
    ({"messages": USER, "stream": True}, 400, "streaming"),
    ({"messages": USER, "n": 2}, 400, "'n'"),
    ({"messages": USER, "stop": ["\n"]}, 400, "stop strings"),
    ({"messages": USER, "tool_choice": "auto"}, 400, "'tools' must be set"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": "required"}, 400, "'auto' and 'none'"),
    ({"messages": USER, "chat_template_kwargs": {"tokenize": False}}, 400, "may not set"),
    # before: a 500 (the template returned a tensor)
    ({"messages": USER, "chat_template_kwargs": {"return_tensors": "pt"}}, 400, "may not set ['return_tensors']"),
    ({"messages": USER, "chat_template_kwargs": {"tokenizer_kwargs": {"x": 1}}}, 400, "may not set"),
    ({"messages": USER, "max_tokens": 2040}, 400, "maximum context length is 2048"),
    ({"model": "other/model", "messages": USER}, 404, "`other/model` does not exist"),
])
async def test_bad_requests_get_a_clear_error(serve, body, status, fragment):
    base, _ = await serve()
    got, reply = await post(serve.session, base, body)
    assert got == status and fragment in reply["error"]["message"]
    assert reply["error"]["code"] == status


@pytest.mark.asyncio
@pytest.mark.parametrize("settings", [{"top_p": 1e-300}, {"repetition_penalty": 1e-40},
                                      {"repetition_penalty": 1e-40, "temperature": 0.5}, {"repetition_penalty": 1e30}],
                         ids=["top_p", "penalty", "penalty-cold", "penalty-large"])
async def test_values_inside_the_ranges_never_get_a_500(serve, settings):
    """Before: "probabilities are not finite" (a 500): fp32 read top_p 1e-300 as 0 and cut every token, and a
    penalty of 1e-40 divided the logits into infinity."""
    base, _ = await serve()
    got, reply = await post(serve.session, base, {"messages": USER, "max_tokens": 4, "ignore_eos": True,
                                                  "return_token_ids": True, "seed": 1, **settings})
    assert got == 200 and len(reply["choices"][0]["token_ids"]) == 4


@pytest.mark.asyncio
async def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized_while_others_are_answered(serve):
    """Before: a valid 63 MiB request was tokenized on the one prepare thread (13 GB and rising after 3 minutes)
    and a small request from another client got no answer."""
    base, service = await serve()
    huge = {"messages": [{"role": "user", "content": "word " * (12 * 1024 * 1024)}], "max_tokens": 4}  # 60 MiB
    small = {"messages": USER, "max_tokens": 2, "temperature": 0}
    (got_huge, refused), (got_small, answered) = await asyncio.gather(post(serve.session, base, huge),
                                                                      post(serve.session, base, small))
    assert got_huge == 400 and refused["error"]["param"] == "messages"
    assert ("maximum context length is 2048 tokens. However, your request holds 1 messages and 62914560 bytes of "
            "text (messages, tool calls, tools), at least") in refused["error"]["message"]
    assert got_small == 200 and answered["usage"]["completion_tokens"] == 2
    assert service.engine.stats()["prompt_tokens"] == answered["usage"]["prompt_tokens"]  # nothing else went in


TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}


@pytest.mark.asyncio
@pytest.mark.parametrize("body", [
    {"messages": USER, "tools": [{**TOOL, "function": {**TOOL["function"], "description": "x" * (8 << 20)}}]},
    {"messages": [{"role": "user", "content": ""}] * 200_000},
    {"messages": [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{" + "1" * (8 << 20) + "}"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "word " * (2 << 20)}]}]},
], ids=["tools", "empty-messages", "tool-calls", "content-parts"])
async def test_every_field_a_template_renders_counts_against_the_context_before_any_work(serve, body):
    """Issue 67: the size check counted message text only. The same 63 MiB as tools took the server past 10 GB and
    blocked every other client; 2.2 million empty messages took 112 s."""
    base, service = await serve()
    small = {"messages": USER, "max_tokens": 2, "temperature": 0}
    (got, refused), (got_small, answered) = await asyncio.gather(post(serve.session, base, {**body, "max_tokens": 4}),
                                                                 post(serve.session, base, small))
    assert got == 400 and refused["error"]["param"] == "messages", refused
    assert "maximum context length is 2048 tokens. However, your request holds" in refused["error"]["message"]
    assert got_small == 200 and service.engine.stats()["prompt_tokens"] == answered["usage"]["prompt_tokens"]


@pytest.mark.asyncio
async def test_a_request_with_tools_that_fits_is_answered(serve):
    base, _ = await serve()
    got, reply = await post(serve.session, base, {"messages": USER, "tools": [TOOL], "max_tokens": 2})
    assert got == 200 and reply["usage"]["prompt_tokens"] > 0


@pytest.mark.asyncio
async def test_a_client_that_goes_away_takes_its_sequences_out_of_the_batch(serve):
    """Before: 32 requests whose sockets were closed kept running (cancelled_requests 0) for minutes."""
    base, service = await serve()
    body = {"messages": USER, "max_tokens": 2000, "ignore_eos": True}
    clients = [asyncio.create_task(post(serve.session, base, body)) for _ in range(4)]
    for _ in range(2000):  # bounded: each round waits 10 ms for the four to be running
        if service.engine.stats()["running"] == 4:
            break
        await asyncio.sleep(0.01)
    assert service.engine.stats()["running"] == 4
    for client in clients:
        client.cancel()  # the connection closes with the task
    await asyncio.gather(*clients, return_exceptions=True)
    for _ in range(2000):
        if service.engine.stats()["running"] == 0:
            break
        await asyncio.sleep(0.01)
    stats = service.engine.stats()
    assert (stats["running"], stats["cancelled_requests"], stats["finished_requests"]) == (0, 4, 0)


@pytest.mark.asyncio
async def test_a_body_sent_too_slowly_is_a_408_and_its_connection_closed(serve):
    """Before: a body sent a byte a second never timed out; 500 such connections stayed open past 140 s."""
    base, _ = await serve(body_timeout_s=0.5)
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"messages\": ")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    rest = await reader.read()  # the server closes the connection after the reply
    writer.close()
    assert head.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in rest


def test_loop_errors_are_one_line_per_condition_not_a_traceback_each(capsys):
    from launch.chat_server import OneLinePerCondition

    handler = OneLinePerCondition()
    for _ in range(1000):
        handler(None, {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")})
    handler(None, {"message": "another condition"})
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["warning: socket.accept() out of system resource: OSError: [Errno 24] Too many open files (said "
                     "once a minute at most)", "warning: another condition (said once a minute at most)"]


@pytest.mark.asyncio
async def test_an_api_key_guards_every_route_but_health(serve):
    """vLLM's --api-key: 401 without the bearer token or with another one; /health stays open for probes."""
    base, _ = await serve(api_key="sk-embedded")
    body = {"messages": USER, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer sk-other"}, {"Authorization": "sk-embedded"}):
        async with serve.session.post(f"{base}/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status == 401 and await response.json() == {"error": "Unauthorized"}
        for path in ("/v1/models", "/stats"):
            async with serve.session.get(f"{base}{path}", headers=headers) as response:
                assert response.status == 401
    key = {"Authorization": "Bearer sk-embedded"}
    async with serve.session.post(f"{base}/v1/chat/completions", json=body, headers=key) as response:
        assert response.status == 200
    async with serve.session.get(f"{base}/v1/models", headers=key) as response:
        assert response.status == 200
    async with serve.session.get(f"{base}/health") as response:
        assert response.status == 200


@pytest.mark.asyncio
async def test_invalid_json_and_tool_choice_without_parser(serve):
    base, _ = await serve(tool_call_parser=None)
    async with serve.session.post(f"{base}/v1/chat/completions", data=b"{not json",
                                  headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400 and "not valid JSON" in (await response.json())["error"]["message"]
    status, reply = await post(serve.session, base, {"messages": USER, "tools": TOOLS, "tool_choice": "auto"})
    assert status == 400 and "--enable-auto-tool-choice" in reply["error"]["message"]


@pytest.mark.asyncio
@pytest.mark.parametrize("raw,fragment,param", [
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "'temperature' is NaN", "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', "'top_p' is Infinity", "top_p"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -Infinity}', "'seed' is -Infinity", "seed"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 1e999}',
     "'frequency_penalty' is 1e999", "frequency_penalty"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
     b'"parameters": {"type": "object", "default": NaN}}}]}', "'tools[0].function.parameters.default' is NaN", "tools"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 100 + b"]" * 100 + b"}",
     "nested more than 64 levels deep", None),
    (b"[" * 50_000 + b"]" * 50_000, "nested more than 64 levels deep", None),
])
async def test_non_finite_numbers_and_deep_nesting_are_a_400_naming_where(serve, raw, fragment, param):
    base, service = await serve()
    async with serve.session.post(f"{base}/v1/chat/completions", data=raw,
                                  headers={"Content-Type": "application/json"}) as response:
        reply = await response.json()
    assert response.status == 400 and fragment in reply["error"]["message"]
    assert reply["error"]["param"] == param
    assert service.engine.stats()["forward_passes"] == 0  # refused before it could join a batch


@pytest.mark.asyncio
async def test_a_body_over_the_size_limit_is_a_413(serve):
    base, _ = await serve()
    content = "x" * (65 * 1024 * 1024)
    async with serve.session.post(f"{base}/v1/chat/completions",
                                  json={"messages": [{"role": "user", "content": content}]}) as response:
        reply = await response.json()
    assert response.status == 413 and "larger than 67108864 bytes" in reply["error"]["message"]


@pytest.mark.asyncio
async def test_a_nan_request_in_a_batch_of_eight_fails_alone(serve):
    base, service = await serve()
    bodies = [{"messages": [{"role": "user", "content": f"Question {i}: " + "why " * i}], "max_tokens": 8,
               "temperature": 0, "ignore_eos": True, "return_token_ids": True} for i in range(8)]
    alone = [(await post(serve.session, base, body))[1]["choices"][0]["token_ids"] for body in bodies]
    raws = [json.dumps(body).encode() for body in bodies]
    raws[3] = raws[3].replace(b'"temperature": 0', b'"temperature": NaN')

    async def send(raw):
        async with serve.session.post(f"{base}/v1/chat/completions", data=raw,
                                      headers={"Content-Type": "application/json"}) as response:
            return response.status, await response.json()

    before = service.engine.stats()["forward_passes"]
    replies = await asyncio.gather(*(send(raw) for raw in raws))
    assert [status for status, _ in replies] == [200] * 3 + [400] + [200] * 4
    assert replies[3][1]["error"]["param"] == "temperature"
    assert [r["choices"][0]["token_ids"] for i, (_, r) in enumerate(replies) if i != 3] == alone[:3] + alone[4:]
    assert service.engine.stats()["forward_passes"] - before < 7 * 8  # the seven still shared passes


class HeldTokenizer:
    """The real tokenizer, except that rendering a prompt holding HOLD waits until ``release`` is set."""

    HOLD = "please hold this prompt"

    def __init__(self, tokenizer):
        self.tokenizer, self.entered, self.release = tokenizer, threading.Event(), threading.Event()

    def apply_chat_template(self, messages, **kwargs):
        if any(self.HOLD in (m.get("content") or "") for m in messages):
            self.entered.set()
            assert self.release.wait(timeout=120)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.mark.asyncio
async def test_tokenizing_a_long_prompt_does_not_hold_up_the_event_loop(serve, model, tokenizer):
    base, service = await serve()
    held = HeldTokenizer(tokenizer)
    service.tokenizer = held
    slow = asyncio.create_task(post(serve.session, base, {"messages": [{"role": "user", "content": held.HOLD}],
                                                          "max_tokens": 2, "temperature": 0}))
    assert await asyncio.to_thread(held.entered.wait, 120)  # the long prompt is being tokenized now
    async with serve.session.get(f"{base}/health") as health, serve.session.get(f"{base}/v1/models") as models:
        assert (health.status, models.status) == (200, 200)  # answered while that tokenization runs
    assert not slow.done()
    held.release.set()
    status, reply = await slow
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("written, message", [
    (None, "error: server checkpoint not found: {path} (MiniMind writes inference weights as "
           "{{save_dir}}/{{prefix}}_{{hidden}}{{_moe}}.pth, e.g. out/agent_768.pth)"),
    (b"not a torch file",
     "error: server checkpoint {path} is not a readable torch state dict (Unsupported operand 110)"),
])
def test_a_checkpoint_the_server_cannot_load_is_one_error_line(tmp_path, tokenizer_path, written, message):
    """``onpolicy-serve`` (``python -m launch.chat_server``) on a checkpoint that is missing or no state dict: its
    ``error:`` line and status 1 (regen shows it as the log tail of a local server that would not start)."""
    path = tmp_path / "model.pth"
    if written is not None:
        path.write_bytes(written)
    done = subprocess.run([sys.executable, "-m", "launch.chat_server", "--checkpoint", str(path), "--tokenizer",
                           str(tokenizer_path), "--hidden-size", "64", "--num-hidden-layers", "2",
                           "--num-attention-heads", "2", "--num-key-value-heads", "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines == [message.format(path=path)], done.stderr[-3000:]
