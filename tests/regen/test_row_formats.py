"""Every preset's row format on literal rows of that dataset's shape, and local-file row rules (no network)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from regen.rows.conversation import RowError, ToolResult, primary_id_of
from regen.rows.formats import FORMATS, to_conversation
from regen.settings import FORMAT_NAMES, REFUSED_FORMATS
from tests.helpers.configs import compose_config, options

SHAREGPT = {"id": "k3Qz_0", "conversations": [
    {"from": "human", "value": "Name a prime above 10."}, {"from": "gpt", "value": "11."},
    {"from": "human", "value": "One above 20?"}, {"from": "gpt", "value": "23."}]}
ULTRACHAT = {"prompt": "How do tides form?", "prompt_id": "a1b2c3d4", "messages": [
    {"content": "How do tides form?", "role": "user"}, {"content": "The Moon pulls.", "role": "assistant"},
    {"content": "Why twice?", "role": "user"}, {"content": "Two bulges.", "role": "assistant"}]}
GSM8K = {"question": "Ana has 3 bags of 4 pens. How many pens?", "answer": "She has 3*4=<<3*4=12>>12 pens.\n#### 12"}
MAGPIE = {"uuid": "5e0c9a8e-1111-4c2d-9d7e-0a1b2c3d4e5f", "instruction": "Sum 2 and 2.", "response": "4",
          "conversations": [{"from": "human", "value": "Sum 2 and 2."}, {"from": "gpt", "value": "4"}],
          "task_category": "Math", "other_task_category": ["Reasoning"], "difficulty": "very easy",
          "instruct_reward": 0.12, "language": "EN"}
NEMOTRON = {"input": [{"role": "user", "content": "Synonym for quick?"}],
            "output": "<think>Simple word task.</think>Fast.", "category": "chat", "license": "cc-by-4.0",
            "reasoning": "on", "generator": "DeepSeek-R1", "used_in_training": "Ultra, Nano", "version": "v1.1",
            "system_prompt": "detailed thinking on"}
PERFECTBLEND = {"conversations": [
    {"from": "human", "value": "Define entropy briefly."}, {"from": "gpt", "value": "Disorder measure."},
    {"from": "human", "value": "Unit?"}, {"from": "gpt", "value": "J/K."}], "source": "example-source"}
HERMES_SYSTEM = ("You are a function calling AI model. <tools>\n[{'type': 'function', 'function': "
                 "{'name': 'get_weather', ...}}]\n</tools>\nUse <tool_call> tags.")
HERMES_TOOLS = ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
                '"properties": {"city": {"type": "string"}}}}}]')
HERMES = {"id": "0b6e2f4a-2222-4e1f-8c3b-111111111111", "conversations": [
    {"from": "system", "value": HERMES_SYSTEM}, {"from": "human", "value": "Weather in Oslo?"},
    {"from": "gpt", "value": "<tool_call>\n{'arguments': {'city': 'Oslo'}, 'name': 'get_weather'}\n</tool_call>\n"},
    {"from": "tool", "value": "<tool_response>\n{\"name\": \"get_weather\", \"content\": {\"temp_c\": 4}}\n</tool_response>\n"},
    {"from": "gpt", "value": "It is 4 C in Oslo."}],
    "tools": HERMES_TOOLS, "category": "Utilities", "subcategory": "Weather", "task": "Current weather lookup"}


def speculators_hash(row: dict) -> str:
    return "hash_" + hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def preset_format(preset: str) -> str:
    return compose_config("regen", [f"dataset={preset}"], hydra_config=True).dataset.format


@pytest.mark.parametrize("preset,row,primary_id,turns", [
    ("sharegpt", SHAREGPT, "k3Qz_0", [("user", "Name a prime above 10."), ("user", "One above 20?")]),
    ("ultrachat", ULTRACHAT, None, [("user", "How do tides form?"), ("user", "Why twice?")]),
    ("gsm8k", GSM8K, None, [("user", "Ana has 3 bags of 4 pens. How many pens?")]),
    ("magpie", MAGPIE, "5e0c9a8e-1111-4c2d-9d7e-0a1b2c3d4e5f", [("user", "Sum 2 and 2.")]),
    ("nemotron", NEMOTRON, None, [("user", "Synonym for quick?")]),
    ("open-perfectblend", PERFECTBLEND, None, [("user", "Define entropy briefly."), ("user", "Unit?")]),
    ("hermes-fc", HERMES, "0b6e2f4a-2222-4e1f-8c3b-111111111111",
     [("system", HERMES_SYSTEM), ("user", "Weather in Oslo?")]),
])
def test_preset_rows_normalize(preset, row, primary_id, turns):
    conversation = to_conversation(row, preset_format(preset), 7, primary_id_of(row))
    assert [(t["role"], t["content"]) for t in conversation.turns] == turns
    assert conversation.primary_id == (primary_id or speculators_hash(row))
    assert conversation.idx == 7
    if preset == "hermes-fc":
        assert conversation.tools == json.loads(HERMES_TOOLS)
        assert conversation.tool_results == [ToolResult('{"name": "get_weather", "content": {"temp_c": 4}}', ("get_weather",))]
    else:
        assert conversation.tools is None and conversation.tool_results == []


def test_every_preset_has_a_known_or_refused_format():
    for preset in options("dataset"):
        block = compose_config("regen", [f"dataset={preset}"] + (["dataset.path=x.jsonl"] if preset == "local" else []), hydra_config=True).dataset
        assert block.format in FORMATS or block.format in REFUSED_FORMATS, preset


def test_every_format_the_settings_accept_has_a_reader():
    """The schema names the formats (it imports no runtime module); this module reads each of them."""
    assert sorted(FORMATS) == sorted(FORMAT_NAMES)


def test_sharegpt_odd_roles_and_tool_blocks():
    row = {"conversations": [
        {"from": "gpt", "value": "Hi, ask me."}, {"from": "human", "value": "Q1"}, {"from": "chatgpt", "value": "A1"},
        {"from": "human", "value": ""}, {"from": "bard", "value": "A2"}, {"from": "human", "value": "Q3"},
        {"from": "tool", "value": "<tool_response>\n{\"name\": \"a\", \"content\": 1}\n</tool_response>\n"
                                  "<tool_response>\n{\"name\": \"b\", \"content\": 2}\n</tool_response>"},
        {"from": "tool", "value": "plain result"}]}
    conversation = to_conversation(row, "sharegpt", 0, "k")
    assert [t["content"] for t in conversation.turns] == ["Q1", "Q3"]  # assistant turns and the empty one dropped
    assert conversation.tool_results == [
        ToolResult('{"name": "a", "content": 1}', ("a",)), ToolResult('{"name": "b", "content": 2}', ("b",)),
        ToolResult("plain result", ())]


@pytest.mark.parametrize("row,turns", [
    ({"prompt": "Just this."}, [("user", "Just this.")]),
    ({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}, [("system", "S"), ("user", "U")]),
    ({"messages": [{"role": "user", "content": "M"}], "prompt": "ignored"}, [("user", "M")]),
    ({"conversations": [{"from": "human", "value": "C"}, {"from": "gpt", "value": "x"}]}, [("user", "C")]),
])
def test_local_rows(row, turns):
    assert [(t["role"], t["content"]) for t in to_conversation(row, "auto", 0, "k").turns] == turns


def test_local_row_keeps_tools_and_named_tool_results():
    row = {"id": 5, "tools": [{"type": "function", "function": {"name": "f"}}], "messages": [
        {"role": "user", "content": "go"}, {"role": "tool", "name": "f", "content": {"v": 1}}]}
    conversation = to_conversation(row, "auto", 0, primary_id_of(row))
    assert conversation.primary_id == "5"
    assert conversation.tools == row["tools"]
    assert conversation.tool_results == [ToolResult('{"v": 1}', ("f",))]


@pytest.mark.parametrize("row,message", [
    ({"instruction": "Do it", "output": "done"}, "found 'instruction', which regen does not read"),
    ({"question": "Why?"}, "found 'question'"),
    ({"text": "raw"}, "found 'text'"),
    ({"other": 1}, re.escape("expected a 'prompt' (string or message list), 'messages' or 'conversations' column") + "$"),
    ({"messages": []}, "'messages' is empty"),
    ({"messages": "hello"}, "'messages' must be a list of messages, got str"),
    ({"messages": ["hello"]}, r"'messages'\[0\] is str"),
    ({"messages": [{"role": "user", "content": 3}]}, r"'messages'\[0\] \(user\) content must be a string, got int"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown role 'narrator'"),
    ({"messages": [{"content": "x"}]}, "no string 'role' or 'from'"),
    ({"messages": [{"role": "assistant", "content": "only me"}]}, "no user turn with text"),
    ({"prompt": "  "}, "'prompt' is an empty string"),
    ({"prompt": "x", "tools": "{not json"}, "'tools': a string that is not JSON"),
    ({"prompt": "x", "tools": {"a": 1}}, "'tools': expected a list of tool schemas"),
])
def test_bad_local_rows_say_what_was_expected(row, message):
    with pytest.raises(RowError, match=message):
        to_conversation(row, "auto", 0, "k")
