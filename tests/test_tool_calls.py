"""<tool_call> block parsing: well-formed calls, several per turn, malformed and unterminated blocks."""

from __future__ import annotations

from tools.tool_calls import MalformedToolCall, ToolCall, split_tool_calls


def test_content_and_calls_in_order():
    text = ('Let me check.\n<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Oslo"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_current_time", "arguments": {}}\n</tool_call>')
    content, calls = split_tool_calls(text)
    assert content == "Let me check.\n"
    assert calls == [ToolCall("get_current_weather", {"location": "Oslo"}), ToolCall("get_current_time", {})]


def test_no_call_returns_text_unchanged():
    assert split_tool_calls("plain answer") == ("plain answer", [])


def test_malformed_blocks_are_reported_not_raised():
    text = ("<tool_call>{bad json}</tool_call><tool_call>[1, 2]</tool_call>"
            "<tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\": \"x\", \"arguments\": 3}</tool_call>"
            "<tool_call>{\"name\": \"x\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call><tool_call>{\"name\": \"cut")
    _, calls = split_tool_calls(text)
    assert [type(c) for c in calls] == [MalformedToolCall] * 4 + [ToolCall, MalformedToolCall]
    assert calls[0].error.startswith("invalid JSON")
    assert calls[1].error == "call must be a JSON object, got list"
    assert calls[2].error == "call has no string 'name'"
    assert calls[3].error == "'arguments' must be an object, got int"
    assert calls[4] == ToolCall("x", {"a": 1})
    assert calls[5] == MalformedToolCall('{"name": "cut', "unterminated <tool_call> block")


def test_python_literal_calls_only_when_allowed():
    text = "<tool_call>\n{'arguments': {'city': 'Oslo', 'metric': True}, 'name': 'get_weather'}\n</tool_call>\n"
    assert isinstance(split_tool_calls(text)[1][0], MalformedToolCall)
    assert split_tool_calls(text, allow_python_literals=True)[1] == [
        ToolCall("get_weather", {"city": "Oslo", "metric": True})]
    # a literal that would need evaluation is refused, not executed
    _, calls = split_tool_calls("<tool_call>__import__('os').system('true')</tool_call>", allow_python_literals=True)
    assert isinstance(calls[0], MalformedToolCall)
