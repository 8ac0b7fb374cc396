"""Helpers shared by the opd tests: tiny real-architecture models, tool-call text, hand-written template pieces."""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch

from common.chat_records import AgentRecord
from common.minimind.model import build_model
from common.minimind.spec import MiniMindArch
from common.minimind.tiny import tiny_arch
from opd import commands
from tests.helpers.entries import Ran, run_main
from tests.helpers.paths import REPO_ROOT
from tools.mock_tools import tool_schemas

TINY_STUDENT = MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
TINY_TEACHER = MiniMindArch(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

# What MiniMind-3's template (and the stand-in's) puts between an assistant turn's EOS and the next turn,
# written out by hand so the rollout's template-derived observation is checked independently.
OBSERVATION_OPEN = "\n<|im_start|>user"
OBSERVATION_CLOSE = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


# Two rows shaped like MiniMind's agent_rl.jsonl (Chinese prompts, tools in the system turn, gt lists).
MINIMIND_ROWS = [
    {"conversations": [
        {"role": "system", "content": "你是一个智能助手，可以调用工具来回答问题。",
         "tools": json.dumps(tool_schemas(["get_current_weather", "get_current_time"]), ensure_ascii=False)},
        {"role": "user", "content": "北京现在天气怎么样？"},
        {"role": "assistant", "content": ""}], "gt": ["28°C", "晴"]},
    {"conversations": [
        {"role": "system", "content": "你是一个智能助手。",
         "tools": json.dumps(tool_schemas(["calculate_math", "get_exchange_rate"]), ensure_ascii=False)},
        {"role": "user", "content": "100美元能换多少人民币？"},
        {"role": "assistant", "content": "100美元约合721元人民币。"}], "gt": ["721"]},
]


def tiny_model(arch: MiniMindArch = TINY_STUDENT, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(arch).eval()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def call_text(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def observation_text(*contents: str) -> str:
    return OBSERVATION_OPEN + "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents) + OBSERVATION_CLOSE


def agent_record(source: str, question: str, tools: list[str] | None = ("calculate_math",), *,
                 names_only: bool = False) -> AgentRecord:
    """A system + user prompt declaring ``tools`` (full schemas, or just their names to keep prompts short)."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": question}]
    schemas = [{"type": "function", "function": {"name": name}} for name in tools or ()] if names_only else (
        tool_schemas(list(tools)) if tools else None)
    return AgentRecord(messages=messages, tools=schemas or None, source=source)


def write_agent_data(path, count: int) -> str:
    """A JSONL file of ``count`` small arithmetic agent records."""
    rows = [{"conversations": [
        {"role": "system", "content": "You are a helpful assistant.", "tools": json.dumps(tool_schemas(["calculate_math"]))},
        {"role": "user", "content": f"What is {i} times 7?"}, {"role": "assistant", "content": str(7 * i)}],
        "gt": [str(7 * i)]} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def entry_command(entry: str, *arguments: str) -> list[str]:
    """``python opd/{entry}.py ARGUMENTS``, as a person runs it."""

    return [sys.executable, str(REPO_ROOT / "opd" / f"{entry}.py"), *arguments]


def entry_env() -> dict[str, str]:
    """The environment entries run in: this checkout importable from any folder, one thread."""

    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def run_entry(entry: str, *arguments: str, cwd=None) -> Ran:
    """``python opd/{entry}.py ARGUMENTS`` run to its end from ``cwd`` (the repository root by default), inside this
    process (``tests/helpers/entries.py``): what it printed and its exit status."""
    return run_main(partial(commands.run, entry), *arguments, cwd=cwd or REPO_ROOT, program=f"opd/{entry}.py")


def model_override(name: str, checkpoint, role: str = "student") -> str:
    """``+models.{name}={...}``: a tiny ``role`` checkpoint as one model block of an evaluation."""
    arch = tiny_arch(role)
    return (f"+models.{name}={{checkpoint: '{checkpoint}', hidden_size: {arch.hidden_size}, "
            f"num_hidden_layers: {arch.num_hidden_layers}, num_attention_heads: {arch.num_attention_heads}, "
            f"num_key_value_heads: {arch.num_key_value_heads}}}")


def not_a_checkpoint(key: str, path) -> str:
    """The error line for a ``*.checkpoint`` naming a file that is no checkpoint."""
    return (f"error: {key} {path} is not a checkpoint: a MiniMind checkpoint is a .pth (or .pt) state dict, an HF "
            "model a folder with config.json or a hub id")


# A process that holds an out_dir as an opd run does (its lock file), until killed; prints "held" once it does.
HOLD_OUT_DIR = """import sys, time
from pathlib import Path
from common.run_lock import OutputLock
out = Path(sys.argv[1])
OutputLock(out / ".lock", out, job="opd", hint="").acquire()
print("held", flush=True)
time.sleep(600)
"""


