"""The capacity-model stand-in over HTTP (its own process on 127.0.0.1): vLLM's /metrics names and labels, the
chat dialect regen reads unchanged, and concurrency=auto steering by those metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from regen.endpoints.vllm_metrics import parse_load
from tests.helpers.paths import REPO_ROOT


@pytest.fixture
def capacity_server():
    """``python -m standins.capacity_server`` with small limits and a fast clock; yields its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "standins.capacity_server", "--max-num-seqs", "8", "--kv-cache-tokens", "4096",
         "--completion-words", "12", "--time-scale", "1000", "--model", "org/Cap {1}", "--max-lifetime-s", "120"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith("READY "), line
    yield line.split()[1]
    process.kill()
    process.wait(timeout=30)
    process.stdout.close()


def chat(url: str, messages: list[dict]) -> tuple[int, dict]:
    body = json.dumps({"model": "org/Cap {1}", "messages": messages, "return_token_ids": True}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as reply:
        return reply.read().decode()


def test_metrics_use_vllms_names_labels_and_counter_suffixes(capacity_server):
    status, body = chat(capacity_server, [{"role": "user", "content": "Hello there, how are you today?"}])
    assert status == 200 and body["usage"]["completion_tokens"] == len(body["choices"][0]["token_ids"])
    text = metrics(capacity_server)
    labels = '{model_name="org/Cap {1}",engine="0"}'
    for line in ("# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{labels} 0.0",
                 f"vllm:num_requests_waiting{labels} 0.0", "# TYPE vllm:kv_cache_usage_perc gauge",
                 "# TYPE vllm:num_preemptions counter", f"vllm:num_preemptions_total{labels} 0.0",
                 f"vllm:generation_tokens_total{labels} {float(body['usage']['completion_tokens'])!r}",
                 f"vllm:prompt_tokens_total{labels} {float(body['usage']['prompt_tokens'])!r}"):
        assert line in text.splitlines()
    assert f"vllm:num_preemptions_created{labels} " in text
    load = parse_load(text)
    assert (load.running, load.waiting, load.kv_usage, load.preemptions) == (0, 0, 0.0, 0)


def test_a_request_that_can_never_fit_the_kv_cache_is_refused(capacity_server):
    status, body = chat(capacity_server, [{"role": "user", "content": "word " * 20000}])
    assert status == 400 and "exceed the KV cache (4096 tokens)" in body["error"]["message"]


def test_regen_runs_against_it_unchanged_and_auto_steers_by_its_metrics(capacity_server, regen):
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i} " + "about things " * 20},
                                         {"role": "user", "content": f"and then {i}?"}]} for i in range(400)]
    summary, out, errors = regen([capacity_server], rows, "concurrency=auto", "concurrency_start=2",
                                 "concurrency_interval_s=0.05")
    # 400 conversations last ~0.6 s on the fast clock: many 0.05 s readings, not one (40 took 0.06 s)
    assert errors == [] and summary["conversations_done"] == 400 and len(out) == 800
    for row in out:
        generated = row["metadata"]["usage"]["completion_tokens"]
        assert row["loss_mask"] == [0] * (len(row["input_ids"]) - generated) + [1] * generated
    [endpoint] = summary["endpoints"].values()
    assert endpoint["concurrency_control"] == "metrics" and endpoint["completion_tokens"] > 0
    assert summary["concurrency"] == "auto" and summary["concurrency_chosen"] == endpoint["in_flight_limit"] >= 1
    served = parse_load(metrics(capacity_server))
    assert served.running == served.waiting == 0
