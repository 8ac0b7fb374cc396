"""Ask the tool world: print the observation a rollout inserts for one call.

    python -m tools '{"name": "get_current_weather", "arguments": {"location": "北京"}}'
    python -m tools '{"name": "calculate_math", "arguments": {"expression": "2^10"}}' --declared calculate_math

The argument is the JSON text of a ``<tool_call>`` block; the output is one line, the observation string
itself (MiniMind's error observation for a call that is malformed, undeclared or fails). Text that is not a
JSON object is no call to MiniMind and gets no observation: nothing is printed on stdout, and a note says
so on stderr. Exit status 0 for any call text; 2 with a usage message when the command itself is misused.
"""

from __future__ import annotations

import argparse
import sys

from tools.mock_tools import TOOL_SCHEMAS
from tools.tool_calls import parse_call_payload
from tools.tool_environment import execute_call


def declared_names(text: str) -> frozenset[str]:
    """``NAME,NAME`` as a set of tool names (empty items dropped, so ``''`` declares none)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__.split("\n\n")[0])
    parser.add_argument("call", help='the call as JSON: \'{"name": ..., "arguments": {...}}\'')
    parser.add_argument("--declared", type=declared_names, default=frozenset(TOOL_SCHEMAS), metavar="NAME,NAME",
                        help="the tools the record declares (default: all six)")
    args = parser.parse_args(argv)
    outcome = execute_call(parse_call_payload(args.call), args.declared)
    if outcome.answered:
        print(outcome.observation)
    else:
        print(f"no observation: MiniMind does not read this as a call ({outcome.detail})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")  # a lone surrogate prints escaped
    sys.exit(main())
