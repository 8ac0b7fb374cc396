"""Mock tools: exact schemas, argument checks, the safe calculator's limits, deterministic results, error observations."""

from __future__ import annotations

import json
import re

import pytest

from tools.argument_check import argument_errors
from tools.mock_tools import TOOL_SCHEMAS, tool_schemas
from tools.safe_math import CalculationError, evaluate_expression
from tools.tool_calls import MalformedToolCall, ToolCall, split_tool_calls
from tools.tool_environment import (
    INVALID_ARGUMENTS,
    MALFORMED,
    OK,
    TOOL_ERROR,
    UNDECLARED,
    UNIMPLEMENTED,
    check_call,
    execute_call,
)

ALL = frozenset(TOOL_SCHEMAS)


def run(name: str, **arguments) -> dict:
    outcome = execute_call(ToolCall(name, arguments), ALL)
    assert outcome.status == OK, outcome.detail
    return json.loads(outcome.observation)


def test_schemas_match_the_issue():
    signatures = {
        name: (list(s["function"]["parameters"]["properties"]), s["function"]["parameters"]["required"])
        for name, s in TOOL_SCHEMAS.items()
    }
    assert signatures == {
        "calculate_math": (["expression"], ["expression"]),
        "unit_converter": (["value", "from_unit", "to_unit"], ["value", "from_unit", "to_unit"]),
        "get_current_weather": (["location"], ["location"]),
        "get_current_time": (["timezone"], []),
        "get_exchange_rate": (["from_currency", "to_currency"], ["from_currency", "to_currency"]),
        "translate_text": (["text", "target_language"], ["text", "target_language"]),
    }
    assert TOOL_SCHEMAS["get_current_time"]["function"]["parameters"]["properties"]["timezone"]["default"] == "Asia/Shanghai"
    assert TOOL_SCHEMAS["unit_converter"]["function"]["parameters"]["properties"]["value"]["type"] == "number"
    assert all(s["type"] == "function" for s in TOOL_SCHEMAS.values())
    assert [s["function"]["name"] for s in tool_schemas(["translate_text", "calculate_math"])] == [
        "translate_text", "calculate_math"]


def test_argument_errors_cover_types_required_enums_and_extra_keys():
    schema = {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "number"}, "b": {"type": "string", "enum": ["x", "y"]}, "c": {"type": ["integer", "null"]}}}
    assert argument_errors(schema, {"a": 1.5, "b": "x", "c": None}) == []
    assert argument_errors(schema, {"a": 2, "b": "y", "c": 3}) == []
    assert argument_errors(schema, {"b": "z", "a": True, "d": 1, "c": 1.0}) == [
        "argument 'b' must be one of ['x', 'y'], got 'z'",
        "argument 'a' must be number, got bool",
        "unexpected argument 'd' (accepted: a, b, c)",
        "argument 'c' must be integer or null, got float",
    ]


@pytest.mark.parametrize("arguments,expected", [
    ({"b": "z", "a": True}, ["argument 'b' must be one of ['x', 'y'], got 'z'", "argument 'a' must be number, got bool"]),
    ({"a": 1, "b": "x", "d": 1}, ["unexpected argument 'd' (accepted: a, b)"]),
    ({"b": "x"}, ["missing required argument 'a'"]),
    ({"a": "1", "b": "x"}, ["argument 'a' must be number, got str"]),
])
def test_argument_error_messages(arguments, expected):
    schema = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "number"}, "b": {"type": "string", "enum": ["x", "y"]}}}
    assert argument_errors(schema, arguments) == expected


@pytest.mark.parametrize("expression,value", [
    ("12*7", 84), ("2^10", 1024), ("(1+2)×3÷4", 2.25), ("7 // 2 + 7 % 2", 4), ("-3 − 4", -7),
    ("sqrt(16) + abs(-2)", 6.0), ("math.sqrt(2)", 1.41421356237), ("round(pi, 2)", 3.14), ("0.1 + 0.2", 0.3),
    ("max(3, 9, 4) - min(1, 2)", 8), ("log(e)", 1.0), ("2**-2", 0.25), ("（1+1）*3", 6),
])
def test_calculator_values(expression, value):
    result = evaluate_expression(expression)
    assert result == value and type(result) is type(value)


@pytest.mark.parametrize("expression,message", [
    ("__import__('os').system('true')", "unknown function"),
    ("open('x')", "unknown function"),
    ("(1).__class__", "unknown name"),
    ("math.os", "unknown name"),
    ("x + 1", "unknown name 'x'"),
    ("'a' * 3", "unsupported literal"),
    ("True + 1", "unsupported literal"),
    ("[1, 2]", "unsupported syntax: List"),
    ("lambda: 1", "unsupported syntax: Lambda"),
    ("9**9**9", "exponent above 100"),
    ("10**40", "magnitude above 1e+30"),
    ("1e20 * 1e20", "magnitude above 1e+30"),
    ("1/0", "division by zero"),
    ("sqrt(-1)", "sqrt() math domain error"),
    ("sqrt(1, 2)", "wrong number of arguments for sqrt()"),
    ("round(2.5, ndigits=1)", "keyword arguments are not supported"),
    ("1 +", "not an arithmetic expression"),
    ("1" + "+1" * 120, "longer than 200 characters"),
    ("+".join(["1"] * 60), "syntax nodes, more than 100"),
    ("", "expression is empty"),
])
def test_calculator_refusals(expression, message):
    with pytest.raises(CalculationError, match=re.escape(message)):
        evaluate_expression(expression)


def test_mock_results_are_deterministic_and_hand_checked():
    assert run("calculate_math", expression="3*(4+5)") == {"result": 27}
    assert run("unit_converter", value=10, from_unit="km", to_unit="miles")["result"] == round(10000 / 1609.344, 6)
    assert run("unit_converter", value=100, from_unit="Celsius", to_unit="F")["result"] == 212.0
    assert run("unit_converter", value=0, from_unit="K", to_unit="c")["result"] == -273.15
    assert run("unit_converter", value=2, from_unit="lb", to_unit="g")["result"] == 907.18474
    assert run("get_current_time") == {"datetime": "2025-03-07 14:30:00", "timezone": "Asia/Shanghai"}
    assert run("get_current_time", timezone="america/new_york") == {
        "datetime": "2025-03-07 01:30:00", "timezone": "America/New_York"}
    assert run("get_current_time", timezone="Asia/Kolkata")["datetime"] == "2025-03-07 12:00:00"
    assert run("get_exchange_rate", from_currency="usd", to_currency="CNY") == {"from": "USD", "to": "CNY", "rate": 7.21}
    assert run("get_exchange_rate", from_currency="EUR", to_currency="CNY")["rate"] == float(f"{7.21 / 0.92:.6g}")
    assert run("translate_text", text="Good morning", target_language="Chinese")["translated_text"] == "早上好"
    assert run("translate_text", text="See you", target_language="French")["translated_text"] == "[french] See you"
    weather = run("get_current_weather", location="Paris")
    assert weather == run("get_current_weather", location="  paris ") | {"city": "Paris"}
    assert weather["condition"] in ("sunny", "cloudy", "overcast", "light rain", "heavy rain", "snow", "windy", "foggy")
    assert -15 <= int(weather["temperature"].removesuffix("°C")) <= 38
    assert len({run("get_current_weather", location=c)["temperature"] for c in ("Oslo", "Lima", "Cairo", "Quito")}) > 1


def test_every_failure_is_an_observation_never_an_exception():
    declared = frozenset({"calculate_math", "unit_converter", "get_current_time", "search_web"})
    text = ('<tool_call>{"name": "calculate_math", "arguments": {"expression": "1/0"}}</tool_call>'
            '<tool_call>{"name": "get_current_weather", "arguments": {"location": "Oslo"}}</tool_call>'
            '<tool_call>{"name": "search_web", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "unit_converter", "arguments": {"value": "3", "from_unit": "m"}}</tool_call>'
            '<tool_call>{"name": "get_current_time", "arguments": {"timezone": "Mars/Base"}}</tool_call>'
            '<tool_call>{"name": "unit_converter", "arguments": {"value": 1, "from_unit": "kg", "to_unit": "m"}}</tool_call>'
            '<tool_call>{name: calculate_math}</tool_call>')
    outcomes = [execute_call(call, declared) for call in split_tool_calls(text)[1]]
    assert [o.status for o in outcomes] == [TOOL_ERROR, UNDECLARED, UNIMPLEMENTED, INVALID_ARGUMENTS, TOOL_ERROR,
                                            TOOL_ERROR, MALFORMED]
    errors = [json.loads(o.observation) for o in outcomes]
    assert errors[0] == {"error": "calculate_math: division by zero"}
    assert errors[1] == {"error": "tool 'get_current_weather' is not available (declared: calculate_math, "
                                  "get_current_time, search_web, unit_converter)"}
    assert errors[2] == {"error": "tool 'search_web' has no implementation here"}
    assert errors[3] == {"error": "invalid arguments for unit_converter: missing required argument 'to_unit'; "
                                  "argument 'value' must be number, got str"}
    assert errors[4]["error"].startswith("get_current_time: unknown timezone 'Mars/Base' (known: UTC, Asia/Shanghai")
    assert errors[5] == {"error": "unit_converter: cannot convert mass (kg) to length (m)"}
    assert errors[6]["error"].startswith("malformed tool call: invalid JSON")
    assert [o.valid for o in outcomes] == [True, False, False, False, True, True, False]
    assert [o.executed for o in outcomes] == [True, False, False, False, True, True, False]


def test_check_call_validates_without_executing():
    outcome = check_call(ToolCall("calculate_math", {"expression": "1/0"}), ALL)
    assert (outcome.status, outcome.executed, outcome.result) == (OK, False, None)
    assert check_call(MalformedToolCall("x", "unterminated <tool_call> block"), ALL).status == MALFORMED
