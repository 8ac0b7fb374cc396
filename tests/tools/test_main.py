"""``python -m tools``: one line, the observation a rollout inserts; exit 0 for any call text, usage errors say so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT
from tools.__main__ import main

ERROR = '{"error": "unknown tool or invalid arguments"}'


@pytest.mark.parametrize("argv,line", [
    (['{"name": "get_current_weather", "arguments": {"location": "北京"}}'],
     '{"city": "北京", "temperature": "28°C", "humidity": "65%", "condition": "晴"}'),
    (['{"name": "calculate_math", "arguments": "{\\"expression\\": \\"2^10\\"}"}'], '{"result": "1024"}'),
    (['{"name": "get_current_time"}'], '{"datetime": "2025-03-07 14:30:00", "timezone": "Asia/Shanghai"}'),
    (['{"name": "calculate_math", "arguments": {"expression": "1+1"}}', "--declared", "get_current_time"], ERROR),
    (['{"name": "calculate_math", "arguments": {"expression": "1+1"}}', "--declared", "calculate_math, translate_text"],
     '{"result": "2"}'),
    (['{"name": "get_current_time", "arguments": {}}', "--declared", ""], ERROR),
    (['{"arguments": {}}'], ERROR),  # a JSON object without a name is a call MiniMind answers with its error
    (['{"name": "search_web", "arguments": {}}', "--declared", "search_web"], ERROR),
])
def test_prints_the_observation(argv, line, capsys):
    assert main(argv) == 0
    assert capsys.readouterr().out == line + "\n"


@pytest.mark.parametrize("text", ["not json", "[" * 5000, '["calculate_math"]', '"calculate_math"'])
def test_text_that_is_not_a_json_object_gets_no_observation(text, capsys):
    assert main([text]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith("no observation: MiniMind does not read this as a call")


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          encoding="utf-8")


def test_the_command_prints_utf8_and_exits_0():
    done = run_command('{"name": "translate_text", "arguments": {"text": "Good morning", "target_language": "chinese"}}')
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"translated_text": "早上好"}\n', "")


@pytest.mark.parametrize("args,message", [
    ((), "error: the following arguments are required: call"),
    (("{}", "--bogus"), "error: unrecognized arguments: --bogus"),
])
def test_misuse_prints_usage_not_a_traceback(args, message):
    done = run_command(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: python -m tools") and message in done.stderr and "Traceback" not in done.stderr
