"""Shared pieces of the live tests against real vLLM (``make test-vllm``, marker ``vllm``).

The vLLM venv (``$VLLM_VENV``, default ``out/vllm-venv``, built by ``tests/vllm_live/venv.sh``) serves a tiny
random Qwen3-shaped model (``tiny_model.py``) with the MiniMind-3 tokenizer on 127.0.0.1. A random model
writes what a request's structured-output regex allows (``structured_outputs.regex``, sent through regen's
``extra_request_params``), and ``logit_bias`` on the marker tokens makes it spell ``<think>``, ``</think>``,
``<tool_call>`` and ``</tool_call>`` as the single tokens a trained model uses.

The replies seen are fixtures of the fast suite (``tests/fixtures/vllm/``): with ``VLLM_RECORD_FIXTURES=1``
a live run writes them; otherwise it checks that today's replies still have the recorded shape (the same
keys and value types), so a vLLM upgrade that changes a reply fails here before the stand-ins drift.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT, real_tokenizer_path

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "vllm"
VENV = Path(os.environ.get("VLLM_VENV") or REPO_ROOT / "out" / "vllm-venv")
WORK = REPO_ROOT / "out" / "vllm-live"
MODEL_NAME = "tiny-qwen3"
MAX_MODEL_LEN = 2048
API_KEY = "sk-live-test-4f2a"  # only ever on 127.0.0.1
RECORD = os.environ.get("VLLM_RECORD_FIXTURES") == "1"
# MiniMind-3's ids of <tool_call>, </tool_call>, <think>, </think> (the stand-in tokenizer has the same ones)
MARKER_BIAS = {"21": 100, "22": 100, "25": 100, "26": 100}
# vllm serve flags every live server gets besides launch/vllm.sh's own: fp32 on CPU, no torch.compile (minutes
# on 2 cores), a small batch, the grammar applied inside think blocks too (vLLM applies it only after the
# reasoning by default), request-level chat templates (the Qwen3-style one).
SERVE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "16",
               "--structured-outputs-config", '{"enable_in_reasoning": true}', "--trust-request-chat-template"]


def tokenizer_dir() -> Path:
    """The MiniMind-3 tokenizer the live server uses: $MINIMIND_TOKENIZER or ../shared (required here)."""
    found = real_tokenizer_path()
    if found is None:
        pytest.fail("the live vLLM tests need the MiniMind-3 tokenizer: set MINIMIND_TOKENIZER=DIR")
    return found


def vllm_env() -> dict[str, str]:
    """The environment for launch/vllm.sh and regen's server=vllm: the venv's ``vllm`` first on PATH, a 1 GiB
    KV cache (vLLM's CPU default is 4), no key in the environment."""
    if not (VENV / ".installed").is_file():
        pytest.fail(f"no vLLM venv at {VENV}: run make test-vllm (it builds it with tests/vllm_live/venv.sh)")
    env = {key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}
    return {**env, "PATH": f"{VENV / 'bin'}:{env['PATH']}", "VLLM_CPU_KVCACHE_SPACE": "1"}


def tiny_model() -> Path:
    """The model folder (written once with the venv's python; the same seed gives the same weights)."""
    folder = WORK / MODEL_NAME
    if not (folder / "model.safetensors").is_file():
        subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("tiny_model.py")), str(folder),
                        str(tokenizer_dir())], check=True, capture_output=True, timeout=600)
    return folder


def get(url: str, key: str | None = API_KEY) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post_chat(base_url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {API_KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def shape(value):
    """The keys and value types of a JSON value (lists by their first element), for the drift check."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def record_or_check(name: str, data) -> None:
    """Write fixture ``name`` (recording), or check that ``data`` has the recorded fixture's shape."""
    path = FIXTURES / name
    if RECORD:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        text = data if isinstance(data, str) else json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        path.write_text(text.replace(str(WORK / MODEL_NAME), MODEL_NAME))  # server=vllm names it by its folder
        return
    assert path.is_file(), f"no fixture {path}: record it with VLLM_RECORD_FIXTURES=1 make test-vllm"
    if isinstance(data, str):  # a /metrics page: the same metric families and label names
        assert metric_names(data) == metric_names(path.read_text())
    else:
        assert shape(data) == shape(json.loads(path.read_text())), f"vLLM's reply no longer has the shape of {path}"


def metric_names(page: str) -> set[str]:
    return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE vllm:")}


class MetricsPoller:
    """Reads ``base_url/metrics`` every 0.05 s in a thread; ``pages`` keeps each distinct page body. (At 0.2 s a
    24-conversation run on a loaded 2-core machine once ended between two loaded readings.)"""

    def __init__(self, base_url: str):
        self.base_url, self.pages, self._stop = base_url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, page = get(f"{self.base_url}/metrics", key=None)
            except OSError:
                status, page = 0, ""
            if status == 200 and (not self.pages or page != self.pages[-1]):
                self.pages.append(page)
            time.sleep(0.05)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.pages


def loaded_page(pages: list[str]) -> str | None:
    """The first page whose vllm:num_requests_running has a non-zero sample."""
    for page in pages:
        for line in page.splitlines():
            if line.startswith("vllm:num_requests_running{") and float(line.split()[-1]) > 0:
                return page
    return None


def unfilled_page(pages: list[str]) -> str | None:
    """The first page that declares vllm:num_requests_running without a sample."""
    for page in pages:
        if "# TYPE vllm:num_requests_running gauge" in page and "\nvllm:num_requests_running{" not in page:
            return page
    return None

