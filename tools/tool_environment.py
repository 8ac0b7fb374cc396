"""Run the tool calls of one assistant turn against the tools a record declares; every failure is an observation.

A call is checked in order: it parsed (``ToolCall``), its tool is declared for the record, a mock
implementation exists, its arguments pass the schema. A call that passes is executed; the outcome's
``observation`` is the JSON text the next turn sees (the result, or ``{"error": ...}``).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from tools.argument_check import argument_errors
from tools.mock_tools import IMPLEMENTATIONS, TOOL_SCHEMAS, ToolError
from tools.tool_calls import MalformedToolCall, ToolCall

# status values, in the order the checks run
OK, MALFORMED, UNDECLARED, UNIMPLEMENTED, INVALID_ARGUMENTS, TOOL_ERROR = (
    "ok", "malformed", "undeclared", "unimplemented", "invalid_arguments", "tool_error")


@dataclass(frozen=True)
class CallOutcome:
    """What became of one ``<tool_call>`` block."""

    name: str | None
    status: str
    detail: str = ""
    result: dict | None = None
    executed: bool = False

    @property
    def valid(self) -> bool:
        """Parsed, declared, implemented and schema-valid (whether or not the tool then refused its values)."""
        return self.status in (OK, TOOL_ERROR)

    @property
    def observation(self) -> str:
        """The tool message content for the next turn."""
        payload = self.result if self.status == OK else {"error": self.detail}
        return json.dumps(payload, ensure_ascii=False)


def check_call(call: ToolCall | MalformedToolCall, declared: Collection[str]) -> CallOutcome:
    """Validate a call without running it: status ``ok`` (not yet executed) or the first failed check."""
    if isinstance(call, MalformedToolCall):
        return CallOutcome(None, MALFORMED, f"malformed tool call: {call.error}")
    if call.name not in declared:
        offered = ", ".join(sorted(declared)) or "none"
        return CallOutcome(call.name, UNDECLARED, f"tool '{call.name}' is not available (declared: {offered})")
    if call.name not in IMPLEMENTATIONS:
        return CallOutcome(call.name, UNIMPLEMENTED, f"tool '{call.name}' has no implementation here")
    errors = argument_errors(TOOL_SCHEMAS[call.name]["function"]["parameters"], call.arguments)
    if errors:
        return CallOutcome(call.name, INVALID_ARGUMENTS, f"invalid arguments for {call.name}: " + "; ".join(errors))
    return CallOutcome(call.name, OK)


def execute_call(call: ToolCall | MalformedToolCall, declared: Collection[str]) -> CallOutcome:
    """Check and, when valid, run the mock tool; never raises for anything the model wrote."""
    outcome = check_call(call, declared)
    if outcome.status != OK:
        return outcome
    try:
        result = IMPLEMENTATIONS[call.name](**call.arguments)
    except ToolError as error:
        return CallOutcome(call.name, TOOL_ERROR, f"{call.name}: {error}", executed=True)
    return CallOutcome(call.name, OK, result=result, executed=True)
