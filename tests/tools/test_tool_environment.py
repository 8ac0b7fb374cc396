"""The tool environment: MiniMind's observations (cut to 2,048 characters, one error text), statuses for metrics.

Facts from jingyaogong/minimind trainer/agent_opd_utils.py ``tool_observation`` (public code index, 1855c78): a
call runs only when its name is declared by the record and its arguments are an object; ``execute_tool``
(trainer/train_agent.py, d65ef2c) returns None for a name without a mock tool or a tool that raises; every
such call gets ``{"error": "unknown tool or invalid arguments"}``; a result is ``json.dumps(result,
ensure_ascii=False)[:2048]``.
"""

from __future__ import annotations

import json

import pytest

from tools.mock_tools import TOOL_SCHEMAS
from tools.tool_calls import MalformedToolCall, ToolCall, split_tool_calls
from tools.tool_environment import (
    ERROR_OBSERVATION,
    MALFORMED,
    MAX_OBSERVATION_CHARS,
    NOT_A_CALL,
    OK,
    TOOL_ERROR,
    UNDECLARED,
    UNIMPLEMENTED,
    CallOutcome,
    check_call,
    execute_call,
)

ALL = frozenset(TOOL_SCHEMAS)


def test_error_observation_is_minimind_s():
    assert ERROR_OBSERVATION == '{"error": "unknown tool or invalid arguments"}'


def test_every_failure_is_the_error_observation_with_its_own_status():
    declared = frozenset({"calculate_math", "unit_converter", "search_web"})
    text = ('<tool_call>{"name": "calculate_math", "arguments": {"expression": "6*7"}}</tool_call>'
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "1/0"}}</tool_call>'
            '<tool_call>{"name": "get_current_weather", "arguments": {"location": "北京"}}</tool_call>'
            '<tool_call>{"name": "search_web", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "unit_converter", "arguments": {"value": "three"}}</tool_call>'
            '<tool_call>{"name": "unit_converter", "arguments": "not json"}</tool_call>'
            '<tool_call>{name: calculate_math}</tool_call>'
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "2')
    outcomes = [execute_call(call, declared) for call in split_tool_calls(text)[1]]
    assert [o.status for o in outcomes] == [OK, TOOL_ERROR, UNDECLARED, UNIMPLEMENTED, TOOL_ERROR, MALFORMED,
                                            NOT_A_CALL, NOT_A_CALL]
    assert [o.answered for o in outcomes] == [True] * 6 + [False] * 2  # MiniMind reads the last two as no call
    assert [o.observation for o in outcomes[:6]] == ['{"result": "42"}'] + [ERROR_OBSERVATION] * 5
    with pytest.raises(ValueError, match="not a call gets no observation"):
        _ = outcomes[6].observation
    assert [o.valid for o in outcomes] == [True, True, False, False, True, False, False, False]
    assert [o.executed for o in outcomes] == [True, True, False, False, True, False, False, False]
    assert outcomes[1].detail == "calculate_math failed: CalculationError: ZeroDivisionError: division by zero"
    assert outcomes[2].detail == ("tool 'get_current_weather' is not declared (declared: calculate_math, search_web, "
                                  "unit_converter)")
    assert outcomes[3].detail == "tool 'search_web' is not one of MiniMind's mock tools"
    assert outcomes[4].detail == "unit_converter failed: ValueError: could not convert string to float: 'three'"
    assert outcomes[5].detail.startswith("malformed tool call: 'arguments' is a string that is not JSON")
    assert outcomes[7].detail == "not a call: unterminated <tool_call> block"


def test_no_tool_is_declared_for_a_record_without_tools():
    outcome = execute_call(ToolCall("get_current_time", {}), frozenset())
    assert (outcome.status, outcome.detail, outcome.observation) == (
        UNDECLARED, "tool 'get_current_time' is not declared (declared: none)", ERROR_OBSERVATION)


@pytest.mark.parametrize("call", [
    ToolCall("calculate_math", {"expression": "2^7000"}),  # 2,108 digits
    ToolCall("translate_text", {"text": "很" * 3000, "target_language": "english"}),
])
def test_observation_is_cut_to_2048_characters_even_mid_json(call):
    outcome = execute_call(call, ALL)
    full = json.dumps(outcome.result, ensure_ascii=False)
    assert outcome.status == OK and len(full) > MAX_OBSERVATION_CHARS
    assert outcome.observation == full[:MAX_OBSERVATION_CHARS] and not outcome.observation.endswith("}")


def test_digits_python_cannot_print_are_a_tool_error():
    outcome = execute_call(ToolCall("calculate_math", {"expression": "10^4300"}), ALL)
    assert outcome.status == TOOL_ERROR and "4300 digits" in outcome.detail


@pytest.mark.parametrize("call", [
    ToolCall("unit_converter", {"value": 1e308, "from_unit": "kg", "to_unit": "pounds"}),  # overflows to inf
    ToolCall("unit_converter", {"value": "inf", "from_unit": "km", "to_unit": "miles"}),
    ToolCall("unit_converter", {"value": "nan", "from_unit": "km", "to_unit": "miles"}),
    ToolCall("get_current_weather", {"location": float("nan")}),  # the model wrote NaN: echoed as the city
    ToolCall("get_exchange_rate", {"from_currency": float("-inf"), "to_currency": "CNY"}),
])
def test_non_finite_results_fail_instead_of_writing_infinity_or_nan(call):
    # MiniMind's json.dumps would write Infinity/NaN here, which is not JSON: the call fails instead
    outcome = execute_call(call, ALL)
    assert outcome.status == TOOL_ERROR and outcome.observation == ERROR_OBSERVATION
    assert "not JSON compliant" in outcome.detail


def test_calculator_infinity_is_a_string_so_it_stays_minimind_s():
    assert execute_call(ToolCall("calculate_math", {"expression": "math.inf"}), ALL).observation == '{"result": "inf"}'


def test_check_call_validates_without_executing():
    outcome = check_call(ToolCall("calculate_math", {"expression": "1/0"}), ALL)
    assert (outcome.status, outcome.executed, outcome.result) == (OK, False, None)
    with pytest.raises(ValueError, match="checked, not executed"):
        _ = outcome.observation
    assert check_call(MalformedToolCall("x", "unterminated <tool_call> block"), ALL).status == NOT_A_CALL
    assert check_call(MalformedToolCall("{}", "call has no string 'name'", is_object=True), ALL).status == MALFORMED
    assert check_call(ToolCall("search_web", {}), {"search_web"}).status == UNIMPLEMENTED


def test_outcome_rebuilds_from_name_status_detail():
    # opd/rollouts/teacher_rollouts.py stores [name, status, detail] and rebuilds the outcome from them
    outcome = execute_call(ToolCall("unit_converter", {"value": []}), ALL)
    rebuilt = CallOutcome(outcome.name, outcome.status, outcome.detail)
    assert (rebuilt.status, rebuilt.valid, rebuilt.observation) == (TOOL_ERROR, True, ERROR_OBSERVATION)


def test_hostile_turn_never_raises():
    text = ("<tool_call>" + "[" * 20000 + "</tool_call>"
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "10**10**10"}}</tool_call>'
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "math.factorial(10**6)"}}</tool_call>'
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "' + "-" * 5000 + '1"}}</tool_call>'
            '<tool_call>{"name": "calculate_math", "arguments": {"expression": "(10**4000)*(10**4000)"}}</tool_call>'
            '<tool_call>{"name": "unit_converter", "arguments": {"value": ' + "9" * 400 + "}}</tool_call>")
    outcomes = [execute_call(call, ALL) for call in split_tool_calls(text)[1]]
    assert [o.status for o in outcomes] == [NOT_A_CALL] + [TOOL_ERROR] * 5
    assert {o.observation for o in outcomes[1:]} == {ERROR_OBSERVATION}
