"""Run one assistant turn's tool calls against the tools a record declares; the observation is MiniMind's.

The observation a call gets is the one MiniMind's on-policy distillation inserts (jingyaogong/minimind
``trainer/agent_opd_utils.py`` ``tool_observation``, public code index at 1855c78, running the tools of
``trainer/train_agent.py`` at d65ef2c): ``json.dumps(result, ensure_ascii=False)`` cut to its first 2,048
characters for a call that ran, and ``{"error": "unknown tool or invalid arguments"}`` for every other call.

The status says why, for metrics (the checks run in this order): ``not_a_call`` (a block that is not a
closed JSON object: MiniMind does not read it as a call, so it gets no observation and the rollout does
not count it), ``malformed`` (a JSON object without a usable name or arguments, see ``tools.tool_calls``),
``undeclared`` (the record does not declare the tool), ``unimplemented`` (declared,
but MiniMind has no such mock tool), ``tool_error`` (the tool raised for these arguments, as MiniMind's
would), ``ok``. One case differs from MiniMind on purpose: a result holding a non-finite float (a unit
conversion of ``1e308``, a location given as ``NaN``) fails as ``tool_error``, because MiniMind's
``json.dumps`` would write ``Infinity``/``NaN``, which is not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from tools.mock_tools import IMPLEMENTATIONS, TOOL_FAILURES
from tools.tool_calls import MalformedToolCall, ToolCall

MAX_OBSERVATION_CHARS = 2048
ERROR_OBSERVATION = json.dumps({"error": "unknown tool or invalid arguments"})
# status values, in the order the checks run
OK, NOT_A_CALL, MALFORMED, UNDECLARED, UNIMPLEMENTED, TOOL_ERROR = (
    "ok", "not_a_call", "malformed", "undeclared", "unimplemented", "tool_error")


def render_result(result: dict) -> str:
    """A tool result as its observation text; ``ValueError`` when it holds NaN or an infinity."""
    return json.dumps(result, ensure_ascii=False, allow_nan=False)[:MAX_OBSERVATION_CHARS]


@dataclass(frozen=True)
class CallOutcome:
    """What became of one ``<tool_call>`` block; ``detail`` explains a failure (for logs, not for the model)."""

    name: str | None
    status: str
    detail: str = ""
    result: dict | None = None
    executed: bool = False

    @property
    def valid(self) -> bool:
        """Parsed, declared and implemented (whether or not the tool then failed on its arguments)."""
        return self.status in (OK, TOOL_ERROR)

    @property
    def answered(self) -> bool:
        """Whether the call gets a tool message (every call MiniMind reads as one; see ``NOT_A_CALL``)."""
        return self.status != NOT_A_CALL

    @property
    def observation(self) -> str:
        """The tool message content the next turn sees."""
        if not self.answered:
            raise ValueError("a block that is not a call gets no observation")
        if self.status != OK:
            return ERROR_OBSERVATION
        if self.result is None:
            raise ValueError(f"the call of {self.name} was checked, not executed: it has no observation")
        return render_result(self.result)


def check_call(call: ToolCall | MalformedToolCall, declared: Collection[str]) -> CallOutcome:
    """Validate a call without running it: status ``ok`` (not yet executed) or the first failed check."""
    if isinstance(call, MalformedToolCall):
        if not call.is_object:
            return CallOutcome(None, NOT_A_CALL, f"not a call: {call.error}")
        return CallOutcome(None, MALFORMED, f"malformed tool call: {call.error}")
    if call.name not in declared:
        offered = ", ".join(sorted(declared)) or "none"
        return CallOutcome(call.name, UNDECLARED, f"tool '{call.name}' is not declared (declared: {offered})")
    if call.name not in IMPLEMENTATIONS:
        return CallOutcome(call.name, UNIMPLEMENTED, f"tool '{call.name}' is not one of MiniMind's mock tools")
    return CallOutcome(call.name, OK)


def execute_call(call: ToolCall | MalformedToolCall, declared: Collection[str]) -> CallOutcome:
    """Check and, when valid, run the mock tool; never raises for anything the model wrote."""
    outcome = check_call(call, declared)
    if outcome.status != OK:
        return outcome
    try:
        result = IMPLEMENTATIONS[call.name](call.arguments)
        render_result(result)  # a result holding NaN or an infinity fails here
    except TOOL_FAILURES as error:
        return CallOutcome(call.name, TOOL_ERROR, f"{call.name} failed: {type(error).__name__}: {error}",
                           executed=True)
    return CallOutcome(call.name, OK, result=result, executed=True)
