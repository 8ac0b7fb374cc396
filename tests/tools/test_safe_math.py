"""The safe calculator: Python's value for every expression it accepts, refusals for the rest, limits that hold.

The reference is what ``eval(text, {"__builtins__": {}, "math": math})`` gives (MiniMind's calculate_math,
jingyaogong/minimind trainer/train_agent.py at d65ef2c); each expected value is written as the Python
arithmetic itself, never computed with eval.
"""

from __future__ import annotations

import functools
import math

import pytest

from tools.safe_math import MAX_EXPRESSION_CHARS, MAX_INT_BITS, CalculationError, evaluate_expression

VALUES = [
    ("12*7", 12 * 7), ("7/2", 7 / 2), ("-7//2", -7 // 2), ("-7 % 3", -7 % 3), ("2**-2", 2**-2), ("2**0.5", 2**0.5),
    ("0.1 + 0.2", 0.1 + 0.2), ("10/3", 10 / 3), ("1e308*10", 1e308 * 10), ("(-8)**(1/3)", (-8) ** (1 / 3)),
    ("2j*2j", 2j * 2j), ("True + 1", True + 1), ("None", None), ("+-+5", +-+5), ("2**3**2", 2**3**2),
    ("math.sqrt(2)", math.sqrt(2)), ("math.pi * 2", math.pi * 2), ("math.e", math.e), ("math.tau", math.tau),
    ("math.log(100, 10)", math.log(100, 10)), ("math.sin(math.pi/6)", math.sin(math.pi / 6)),
    ("math.floor(2.7) + math.ceil(2.1)", math.floor(2.7) + math.ceil(2.1)), ("math.factorial(20)", math.factorial(20)),
    ("math.comb(52, 5)", math.comb(52, 5)), ("math.perm(10, 3)", math.perm(10, 3)), ("math.perm(6)", math.perm(6)),
    ("math.gcd(84, 36)", math.gcd(84, 36)), ("math.lcm(4, 6, 10)", math.lcm(4, 6, 10)), ("math.isqrt(99)", 9),
    ("math.hypot(3, 4)", math.hypot(3, 4)), ("math.pow(2, 10)", math.pow(2, 10)), ("math.isnan(math.nan)", True),
    ("math.floor(1e308)", math.floor(1e308)), ("math.log(10**4000)", math.log(10**4000)), ("math.inf", math.inf),
    ("2**14284", 2**14284), ("9" * 999, int("9" * 999)), ("(-1)**(10**4000)", 1), ("math.factorial(1500)", math.factorial(1500)),
    (" \t1 + 1", 2), ("\n1 + 1\n", 2),  # eval drops leading spaces and tabs; newlines around an expression are fine
]


@pytest.mark.parametrize("expression,value", VALUES)
def test_values_are_python_s(expression, value):
    result = evaluate_expression(expression)
    assert type(result) is type(value) and repr(result) == repr(value)


REFUSED = [
    ("sqrt(16)", "unknown name 'sqrt'"), ("abs(-2)", "unknown name 'abs'"), ("pi", "unknown name 'pi'"),
    ("round(2.5)", "unknown name 'round'"), ("math.os", "not an accepted constant: math.os"),
    ("math.sqrt", "not an accepted constant: math.sqrt"), ("math.fsum([1, 2])", "not an accepted function: math.fsum"),
    ("__import__('os').system('true')", "not an accepted function"), ("(1).__class__", "not an accepted constant: Attribute"),
    ("'a' * 3", "not a number: 'a'"), ("[1, 2]", "not accepted: List"), ("1, 2", "not accepted: Tuple"),
    ("1 < 2", "not accepted: Compare"), ("1 and 2", "not accepted: BoolOp"), ("3 ^ 2", "not accepted: BinOp"),
    ("lambda: 1", "not accepted: Lambda"), ("math.sqrt(x=4)", "only positional arguments"),
    ("1/0", "ZeroDivisionError: division by zero"), ("2.0**10000", "OverflowError"), ("math.exp(1000)", "OverflowError"),
    ("math.sqrt(-1)", "ValueError: math domain error"), ("math.sqrt(1, 2)", "TypeError"),
    ("math.factorial(2.0)", "TypeError"), ("None + 1", "TypeError"), ("1 +", "not a Python expression"),
    ("", "not a Python expression"), (" \n 1", "not a Python expression"), ("5.3.28", "not a Python expression"),
]


@pytest.mark.parametrize("expression,message", REFUSED)
def test_refusals_and_failures_are_calculation_errors(expression, message):
    with pytest.raises(CalculationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        evaluate_expression(expression)


# Expressions built to stall or exhaust an unbounded evaluator; each must end at once with this outcome
# (an int of more than MAX_INT_BITS bits, or an over-long text, is refused before any work is done).
HOSTILE = [
    ("10**10**10", "the power would exceed"),
    ("9**9**9", "the power would exceed"),
    ("2**(2**64)", "the power would exceed"),
    ("3**(2**2000)", "the power would exceed"),
    ("math.factorial(10**6)", "the factorial would exceed"),
    ("math.factorial(10**100)", "the factorial would exceed"),
    ("math.factorial(math.factorial(10))", "the factorial would exceed"),
    ("math.factorial(5000)", "the factorial would exceed"),
    ("math.perm(10**6)", "the factorial would exceed"),
    ("math.perm(10**6, 10**5)", "the permutation count would exceed"),
    ("math.comb(10**6, 5*10**5)", "the binomial coefficient would exceed"),
    ("math.lcm(3**9000, 5**6000)", "the least common multiple would exceed"),
    ("(10**4000)*(10**4000)", "an int would exceed"),
    ("(2**14000)**2", "the power would exceed"),
    ("2**14285", "an int would exceed"),
    ("math.isqrt(10**10**10)", "the power would exceed"),
    ("math.sqrt(10**10**10)", "the power would exceed"),
    ("math.gcd(10**10**9, 7)", "the power would exceed"),
    ("math.pow(10, 10**100)", "OverflowError"),
    ("math.ldexp(1, 10**4000)", "OverflowError"),
    ("math.exp(math.exp(100))", "OverflowError"),
    ("10.0**10**10", "OverflowError"),
    ("round(1, -10**8)", "unknown name 'round'"),
    ("pow(10, 10**10)", "unknown name 'pow'"),
    ("math.factorial(abs(-10**6))", "unknown name 'abs'"),
    ("'a' * 10**9", "not a number"),
    ("'9' * 10**6", "not a number"),
    ("9" * 5000, "longer than"),
    ("1" + "0" * (MAX_EXPRESSION_CHARS - 1), 10 ** (MAX_EXPRESSION_CHARS - 1)),
    ("-" * 998 + "1", 1),
    ("1+" * 499 + "1", 500),
    ("(" * 199 + "1" + ")" * 199, 1),
    ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
    ("-" * 10000 + "1", "longer than"),
    ("math.sqrt(" * 90 + "2" + ")" * 90, functools.reduce(lambda value, _: math.sqrt(value), range(90), 2)),
    ("math.comb(14000, 7000) * 0 + math.comb(14000, 7000) % 7", math.comb(14000, 7000) % 7),
    ("[1]*10**9", "not accepted: List"),
    ("1" + "()" * 499, "not an accepted function: Call"),
    ("a" + ".b" * 499, "not an accepted constant: Attribute"),
    ("math.sqrt" + "(4)" * 300, "not an accepted function: Call"),
]


@pytest.mark.parametrize("expression,outcome", HOSTILE, ids=[text[:40] for text, _ in HOSTILE])
def test_hostile_expressions_end_at_once(expression, outcome):
    if isinstance(outcome, str):
        with pytest.raises(CalculationError, match=outcome):
            evaluate_expression(expression)
    else:
        assert evaluate_expression(expression) == outcome


def test_int_limit_is_python_s_printing_limit():
    assert (10**4300).bit_length() == MAX_INT_BITS  # the smallest int Python will not print fits, so it fails as Python does
    assert str(evaluate_expression("10**4299")) == "1" + "0" * 4299
    with pytest.raises(ValueError, match="4300 digits"):
        str(evaluate_expression("10**4300"))
