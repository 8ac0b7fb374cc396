"""MiniMind's answer check: which ``gt`` items a final answer contains, and what the final answer is.

The definition is MiniMind's (jingyaogong/minimind ``trainer/train_agent.py`` at d65ef2c,
``validate_gt_in_text`` and the answer it is given in ``calculate_rewards``), restated:

- A ``gt`` item is **found** in an answer when its text (``str(item)``, stripped) is non-empty and occurs in
  the answer, both lower-cased; or when that text with its commas removed is a plain decimal number
  (optional sign, digits, optional ``.digits``) that differs by less than 1e-6 from a number in the answer.
  The numbers in an answer are read after removing its commas, and only those not glued to a letter, digit,
  underscore or dot on either side count (``x5`` and ``5.1.2`` hold none; ``28°C`` and ``(5)`` hold one).
  "Letter" and "digit" are Unicode ones, so a number right after a Chinese character does not count either.
- An episode is **correct** when every ``gt`` item is found (an empty ``gt`` is vacuously correct).
- The **final answer** is the text of the episode's last assistant turn after its first ``</think>`` (the
  whole text when there is none), and after its last ``</tool_call>`` when there is one, stripped.
  MiniMind checks an episode only when it made tool calls, and counts an episode that used up its turns
  while still calling tools as having an empty answer; applying those two rules is the caller's part.
"""

from __future__ import annotations

import re

_SIGNED_DECIMAL = r"[-+]?\d+(?:\.\d+)?"
# a decimal number with no word character or dot right before or after it
_FREE_NUMBER = re.compile(r"(?<![\w.])" + _SIGNED_DECIMAL + r"(?![\w.])")
_PLAIN_NUMBER = re.compile(_SIGNED_DECIMAL)
NUMBER_TOLERANCE = 1e-6
THINK_CLOSE, CALL_CLOSE = "</think>", "</tool_call>"


def numbers_in(answer: str) -> list[float]:
    """The free-standing numbers of ``answer`` once its commas are removed, in order."""
    return [float(number) for number in _FREE_NUMBER.findall(answer.replace(",", ""))]


def gt_item_found(item, answer: str) -> bool:
    """Whether one ``gt`` item is found in ``answer`` (see the module doc)."""
    text = str(item).strip()
    if text and text.lower() in answer.lower():
        return True
    number = text.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(number):
        return False
    return any(abs(float(number) - found) < NUMBER_TOLERANCE for found in numbers_in(answer))


def found_gt_items(answer: str, gt: list) -> list:
    """The items of ``gt`` found in ``answer``, in ``gt``'s order."""
    return [item for item in gt if gt_item_found(item, answer)]


def answer_is_correct(answer: str, gt: list) -> bool:
    """Every item of ``gt`` is found in ``answer``."""
    return all(gt_item_found(item, answer) for item in gt)


def final_answer(turn_text: str) -> str:
    """MiniMind's final answer in the text of an episode's last assistant turn."""
    if THINK_CLOSE in turn_text:
        turn_text = turn_text.split(THINK_CLOSE, 1)[1]
    if CALL_CLOSE in turn_text:
        turn_text = turn_text.rsplit(CALL_CLOSE, 1)[1]
    return turn_text.strip()
