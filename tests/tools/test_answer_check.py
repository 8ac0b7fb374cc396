"""MiniMind's answer check on literal MiniMind-style answers.

The rules are jingyaogong/minimind trainer/train_agent.py ``validate_gt_in_text`` and the final answer
``calculate_rewards`` gives it (master d65ef2c): a case-insensitive substring, or a plain number within 1e-6 of
a free-standing number of the answer (commas removed); the answer is the last turn after its first
``</think>`` and after its last ``</tool_call>``.
"""

from __future__ import annotations

import pytest

from tools.answer_check import answer_is_correct, final_answer, found_gt_items, gt_item_found, numbers_in

FOUND = [
    # (gt item, answer, found)
    ("28°C", "北京现在28°C，天气晴，湿度65%。", True),
    ("晴", "北京现在28°C，天气晴，湿度65%。", True),
    ("多云", "北京现在28°C，天气晴。", False),
    ("Hello World", "The translation is: hello world", True),  # case-insensitive
    ("  早上好 ", "翻译结果：早上好", True),  # the item is stripped
    ("1,234", "The total is 1234 yuan.", True),  # commas removed from the item: 1234 == 1234
    ("1234", "The total is 1,234 yuan.", True),  # and from the answer
    ("1234567.5", "That is 1,234,567.5 CNY", True),
    ("1234", "The total is 1,234.5 yuan.", False),  # 1234.5 is not within 1e-6 of 1234, and no substring
    ("28", "It is 28.5°C today", True),  # a near miss as numbers, but "28" is a substring of "28.5"
    ("28.5", "It is 28°C today", False),  # the other way round it is missing
    ("28.0", "It is 28°C today", True),  # 28.0 == 28 as numbers
    ("28.0000001", "It is 28°C today", True),  # within 1e-6
    ("28.00001", "It is 28°C today", False),
    ("721.0", "100 USD is 721 CNY", True),
    ("-3", "The result is -3.", True),
    ("+7", "It changed by 7 points", True),  # +7 == 7
    ("5.0", "I have 5apples", False),  # glued to letters: not a number of the answer
    ("5.0", "I have x5 apples", False),
    ("5.0", "I have 5 apples", True),
    ("3.00", "version v3.0", False),  # glued to a letter
    ("3.00", "version 3.0.1", False),  # glued to a dot
    ("3.00", "version 3.0", True),
    ("20.0", "温度20°C", False),  # right after a Chinese character (a Unicode letter): not free-standing
    ("20.0", "温度 20°C", True),
    ("20.0", "温度：20°C", True),
    ("0.048", "1 JPY = 0.048 CNY", True),
    ("62.1371", "That is about 62.14 miles.", False),
    ("", "anything", False),  # an empty item is never found
    (180.0, "That is 180 fahrenheit.", True),  # a non-string item is compared by its str()
]


@pytest.mark.parametrize("item,answer,found", FOUND)
def test_gt_item_found(item, answer, found):
    assert gt_item_found(item, answer) is found


def test_numbers_in_an_answer():
    assert numbers_in("Costs 1,234.5 USD, or -3 and +2; not x5, 5y, 1.2.3 or 温度7") == [1234.5, -3.0, 2.0]


def test_episode_is_correct_when_every_item_is_found():
    answer = "北京今天28°C，天气晴。"
    assert answer_is_correct(answer, ["28°C", "晴"])
    assert not answer_is_correct(answer, ["28°C", "晴", "65%"])
    assert found_gt_items(answer, ["65%", "晴", "28°C"]) == ["晴", "28°C"]
    assert answer_is_correct(answer, [])


@pytest.mark.parametrize("turn,answer", [
    ("<think>\nThe tool said 28°C.\n</think>\n\n北京28°C，晴。", "北京28°C，晴。"),
    ("No thinking here.  ", "No thinking here."),
    ("<think>a</think>first</think>second", "first</think>second"),  # split at the first </think>
    ('<think>x</think>\n<tool_call>{"name": "a"}</tool_call> then the answer 5', "then the answer 5"),
    ('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>\n6 ', "6"),  # after the last
])
def test_final_answer(turn, answer):
    assert final_answer(turn) == answer
