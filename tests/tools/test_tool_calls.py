"""<tool_call> block parsing: calls in order, MiniMind's reading of the payload, malformed blocks, bounded nesting.

How a payload is read follows jingyaogong/minimind trainer/train_agent.py ``parse_tool_calls`` (master d65ef2c)
and trainer/agent_opd_utils.py ``tool_observation`` (public code index, 1855c78): ``json.loads`` of the stripped
text, ``arguments`` defaulting to ``{}``, and an ``arguments`` string decoded by ``json.loads`` again.
"""

from __future__ import annotations

import math

import pytest

from tools.tool_calls import (
    MAX_JSON_DEPTH,
    MalformedToolCall,
    ToolCall,
    json_depth,
    parse_call_payload,
    split_tool_calls,
)


def test_content_and_calls_in_order():
    text = ('Let me check.\n<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "北京"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_current_time", "arguments": {}}\n</tool_call>')
    content, calls = split_tool_calls(text)
    assert content == "Let me check.\n"
    assert calls == [ToolCall("get_current_weather", {"location": "北京"}), ToolCall("get_current_time", {})]
    assert calls[0].arguments_json() == '{"location": "北京"}'


def test_no_call_returns_text_unchanged():
    assert split_tool_calls("plain answer") == ("plain answer", [])


@pytest.mark.parametrize("payload,call", [
    ('{"name": "get_current_time"}', ToolCall("get_current_time", {})),  # no arguments: {}
    ('{"name": "calculate_math", "arguments": "{\\"expression\\": \\"1+1\\"}"}',
     ToolCall("calculate_math", {"expression": "1+1"})),  # arguments as a JSON string
    ('{"name": "x", "arguments": {"a": 1, "a": 2}}', ToolCall("x", {"a": 2})),  # json.loads keeps the last key
    ('  {"name": "x", "arguments": {}, "extra": true}\n', ToolCall("x", {})),
    ('{"name": "x", "arguments": {"deep": [[[1]]]}}', ToolCall("x", {"deep": [[[1]]]})),
])
def test_payloads_read_as_minimind_reads_them(payload, call):
    assert parse_call_payload(payload) == call


def test_nan_and_infinity_literals_parse_like_python_json():
    call = parse_call_payload('{"name": "unit_converter", "arguments": {"value": NaN, "other": -Infinity}}')
    assert call.name == "unit_converter" and math.isnan(call.arguments["value"]) and call.arguments["other"] == -math.inf


@pytest.mark.parametrize("payload,error", [
    ("{bad json}", "invalid JSON: Expecting property name enclosed in double quotes at char 1"),
    ("[1, 2]", "call must be a JSON object, got list"),
    ('{"arguments": {}}', "call has no string 'name'"),
    ('{"name": 5, "arguments": {}}', "call has no string 'name'"),
    ('{"name": "", "arguments": {}}', "call has no string 'name'"),
    ('{"name": "x", "arguments": 3}', "'arguments' must be an object, got int"),
    ('{"name": "x", "arguments": null}', "'arguments' must be an object, got NoneType"),
    ('{"name": "x", "arguments": "[1]"}', "'arguments' must be an object, got list"),
    ('{"name": "x", "arguments": ""}', "'arguments' is a string that is not JSON: invalid JSON: Expecting value at char 0"),
    ('{"name": "x", "arguments": "{oops"}', "'arguments' is a string that is not JSON: invalid JSON: "
                                           "Expecting property name enclosed in double quotes at char 1"),
    ('{"name": "x", "arguments": {"n": ' + "9" * 5000 + "}}", "invalid JSON: Exceeds the limit (4300 digits)"),
])
def test_malformed_payloads_say_why(payload, error):
    call = parse_call_payload(payload)
    assert isinstance(call, MalformedToolCall) and call.error.startswith(error)


def test_unterminated_last_block_is_malformed():
    _, calls = split_tool_calls('<tool_call>{"name": "x", "arguments": {}}</tool_call><tool_call>{"name": "cut')
    assert calls == [ToolCall("x", {}), MalformedToolCall('{"name": "cut', "unterminated <tool_call> block")]


@pytest.mark.parametrize("text", [
    "<tool_call>" + "[" * 20000,
    "<tool_call>" + "[" * 20000 + "</tool_call>",
    "<tool_call>" + "{\"a\": " * 5000 + "1" + "}" * 5000 + "</tool_call>",
    '<tool_call>{"name": "x", "arguments": "' + "[" * 20000 + '"}</tool_call>',
])
def test_deep_nesting_is_malformed_not_a_recursion_error(text):
    _, calls = split_tool_calls(text)
    assert len(calls) == 1 and isinstance(calls[0], MalformedToolCall)


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth('{"a": [1, {"b": "[[[{{{"}], "c": "\\"]"}') == 3
    assert json_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) == MAX_JSON_DEPTH
    nested = '{"name": "x", "arguments": {"v": ' + "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2) + "}}"
    assert isinstance(parse_call_payload(nested), ToolCall)
    assert isinstance(parse_call_payload(nested.replace("[", "[[", 1).replace("]", "]]", 1)), MalformedToolCall)


def test_any_tool_name_parses():
    # the embedded server's hermes parser reads calls of any tool, not only MiniMind's six
    text = '<tool_call>\n{"name": "search_web", "arguments": {"query": "x", "top_k": 3}}\n</tool_call>'
    assert split_tool_calls(text)[1] == [ToolCall("search_web", {"query": "x", "top_k": 3})]
