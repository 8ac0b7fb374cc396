"""Agent records: both conversation keys, both tool locations and encodings, dropped answers, errors naming line and field."""

from __future__ import annotations

import json

import pytest

from common.chat_records import RecordError, load_agent_records
from opd.episodes.demonstrations import load_demonstrations
from tests.helpers.opd_support import MINIMIND_ROWS
from tools.mock_tools import tool_schemas


def write_lines(path, rows) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def test_records_read_tools_from_system_or_top_level(tmp_path):
    schemas = tool_schemas(["calculate_math", "get_current_time"])
    path = write_lines(tmp_path / "agent.jsonl", [
        {"conversations": [{"role": "system", "content": "Be brief.", "tools": json.dumps(schemas)},
                           {"role": "user", "content": "12*7?"}, {"role": "assistant", "content": "84"}],
         "gt": ["84"]},
        "",
        {"messages": [{"role": "user", "content": "time?"}], "tools": schemas[1:]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                         "tool_calls": [{"name": "x", "arguments": {}}]},
                      {"role": "tool", "content": "{}"}], "gt": "5"},
    ])
    records, sha = load_agent_records(path)
    assert len(records) == 3 and len(sha) == 64
    first, second, third = records
    assert first.source == f"{path}:1" and third.source == f"{path}:4"
    assert [m["role"] for m in first.messages] == ["system", "user"]  # trailing answer dropped
    assert "tools" not in first.messages[0]
    assert first.tools == schemas and first.declared_tools == {"calculate_math", "get_current_time"}
    assert first.gt == ["84"]
    assert second.tools == schemas[1:] and second.gt == []
    assert third.tools is None and third.declared_tools == frozenset() and third.gt == ["5"]
    assert [m["role"] for m in third.messages] == ["user", "assistant", "tool"]


@pytest.mark.parametrize("row,message", [
    ("{not json", ":2: invalid JSON"),
    ([1, 2], ":2: expected a JSON object, got list"),
    ({"messages": []}, ":2: needs a non-empty 'messages' or 'conversations' list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, ":2: messages[0].role: 'robot' is not one of"),
    ({"conversations": [{"role": "user", "content": 3}]}, ":2: conversations[0].content: expected a string, got int"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": "[{"}, ":2: tools: a string that is not JSON"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": {"name": "x"}}, ":2: tools: expected a list of tool schemas"),
    ({"messages": [{"role": "system", "content": "s", "tools": [{"function": {}}]}, {"role": "user", "content": "q"}]},
     ":2: messages[0].tools[0]: a tool needs a string 'name'"),
    ({"messages": [{"role": "assistant", "content": "a"}]}, ":2: messages must end with a user or tool turn"),
    ({"messages": [{"role": "user", "content": "q"}], "gt": {"a": 1}}, ":2: gt must be a string or a list"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = write_lines(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "fine"}]}, row])
    with pytest.raises(RecordError) as caught:
        load_agent_records(path)
    assert str(caught.value).startswith(path) and message in str(caught.value)


def test_empty_file_and_missing_file(tmp_path):
    with pytest.raises(RecordError, match="no records"):
        load_agent_records(write_lines(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(FileNotFoundError, match="agent data file not found"):
        load_agent_records(tmp_path / "absent.jsonl")


# agent_rl.jsonl as MiniMind's AgentRLDataset reads it (trainer/train_agent.py, dataset/lm_dataset.py at d65ef2c):
# tools as a JSON string in the system message, Chinese text, gt from its tool world, a last message it drops
def test_minimind_agent_rl_rows_load_as_minimind_reads_them(tmp_path):
    path = write_lines(tmp_path / "agent_rl.jsonl", [json.dumps(row, ensure_ascii=False) for row in MINIMIND_ROWS])
    records, _ = load_agent_records(path)
    assert [[m["role"] for m in r.messages] for r in records] == [["system", "user"], ["system", "user"]]
    assert records[0].messages[1]["content"] == "北京现在天气怎么样？" and "tools" not in records[0].messages[0]
    assert records[0].declared_tools == {"get_current_weather", "get_current_time"}
    assert records[0].tools == tool_schemas(["get_current_weather", "get_current_time"])
    assert records[0].gt == ["28°C", "晴"] and records[1].gt == ["721"]


def nested_objects(levels: int) -> str:
    """JSON text of ``levels`` objects nested in one another (a tool's parameters, say)."""
    return '{"x": ' * (levels - 1) + '{"type": "string"}' + "}" * (levels - 1)


def hostile_row(user: str = "q", tools: str | None = None) -> str:
    """A prompt (and its answer, so it is a demonstration too) with ``user`` content and raw JSON ``tools``."""
    system = {"role": "system", "content": "s", **({"tools": "TOOLS"} if tools is not None else {})}
    text = json.dumps({"conversations": [system, {"role": "user", "content": user}, {"role": "assistant", "content": "a"}]})
    return text.replace('"TOOLS"', tools) if tools is not None else text


TOOL = '[{"type": "function", "function": {"name": "calculate_math", "parameters": PARAMETERS}}]'
HOSTILE = {  # each once gave a RecursionError or TypeError traceback, or 27 s and 2.7 GB before its refusal
    "a line nested 200,000 deep": ("[" * 200_000 + "]" * 200_000, ":1: nested deeper than 100 levels"),
    "a tools string nested 100,000 deep": (hostile_row(tools=json.dumps("[" * 100_000 + "]" * 100_000)),
                                           ":1: conversations[0].tools: nested deeper than 100 levels"),
    "tool properties nested 500 deep": (hostile_row(tools=TOOL.replace("PARAMETERS", nested_objects(500))),
                                        ":1: nested deeper than 100 levels"),
    "a lone surrogate in user content": (hostile_row(user="a\ud800b"),
                                         r":1: conversations[1].content: holds a lone surrogate ('\ud800' at char 1)"),
    "a 10 MB user string": (hostile_row(user="x" * 10_000_000), ":1: the line is over 8 MiB (MAX_LINE_BYTES)"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_lines_are_refused_naming_file_and_line(tmp_path, case):
    line, message = HOSTILE[case]
    path = tmp_path / "hostile.jsonl"
    path.write_text(line + "\n")
    for load in (load_agent_records, load_demonstrations):
        with pytest.raises(RecordError) as caught:
            load(path)
        assert str(caught.value).startswith(f"{path}{message}"), str(caught.value)[:300]


def test_nesting_up_to_the_limit_and_surrogate_pairs_are_fine(tmp_path):
    path = tmp_path / "fine.jsonl"
    tools = TOOL.replace("PARAMETERS", nested_objects(100 - 3))  # list, tool, function: 100 levels in all
    path.write_text(hostile_row(user="\ud83d\ude00 fine", tools=json.dumps(tools)) + "\n")
    (record,), _ = load_agent_records(path)
    assert record.messages[1]["content"] == "\U0001f600 fine" and record.declared_tools == {"calculate_math"}
