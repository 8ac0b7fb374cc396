"""Python arithmetic on model-written expressions without ``eval``: an ``ast`` walker whose every step is bounded.

``evaluate_expression(text)`` gives the value Python's ``eval(text, {"__builtins__": {}, "math": math})``
gives (MiniMind's calculator, ``tools.mock_tools``) for every expression it accepts, and raises
``CalculationError`` for every other one, as that ``eval`` would fail or as this walker refuses it:

- accepted: int, float, imaginary, ``True``/``False``/``None`` literals; ``+ - * / // % **``; unary ``+ -``;
  parentheses; ``math.<name>`` for the constants ``pi e tau inf nan`` and the functions in ``FUNCTIONS``
  (positional arguments only). Bare names (``sqrt``, ``abs``, ``round``, ``pi``) are refused: that ``eval``
  has no builtins, so it fails on them too.
- refused although Python would compute them: strings, lists, tuples, comparisons, boolean operators,
  bitwise operators, any other syntax; an expression longer than ``MAX_EXPRESSION_CHARS``; any int (literal,
  intermediate or result) above ``MAX_INT_BITS`` bits.

The limits hold before any work is done, so no expression can stall the caller: the text's length bounds
the number of steps; ``**``, ``math.factorial``, ``math.perm``, ``math.comb`` and ``math.lcm`` are checked
against ``MAX_INT_BITS`` from their arguments before they are called; every other accepted operation is
fast on ints of that size. The walk uses an explicit stack, so deep nesting cannot overflow Python's.
``MemoryError``, ``OverflowError`` and every other error Python raises become a ``CalculationError``.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 1000
# Python prints at most 4,300 digits of an int (sys.int_info.default_max_str_digits); this many bits holds them
MAX_INT_BITS = math.ceil(4300 * math.log2(10))

CONSTANTS = {name: getattr(math, name) for name in ("pi", "e", "tau", "inf", "nan")}
# math functions whose cost is small for any argument an accepted expression can build (floats, or ints of at
# most MAX_INT_BITS bits); the four whose result can grow without bound are in _GROWING_FUNCTIONS
_FAST_FUNCTIONS = (
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "copysign", "cos", "cosh", "degrees",
    "erf", "erfc", "exp", "exp2", "expm1", "fabs", "floor", "fmod", "gamma", "gcd", "hypot", "isclose", "isfinite",
    "isinf", "isnan", "isqrt", "ldexp", "lgamma", "log", "log10", "log1p", "log2", "nextafter", "pow", "radians",
    "remainder", "sin", "sinh", "sqrt", "tan", "tanh", "trunc", "ulp",
)
_BINARY: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_LITERAL_TYPES = (int, float, complex, bool, type(None))


class CalculationError(ValueError):
    """An expression this calculator refuses, or one whose evaluation fails in Python."""


def _is_int(value) -> bool:
    return isinstance(value, int)  # bools included: Python computes with them as 0 and 1


def _refuse_large(bits: float, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise CalculationError(f"{what} would exceed {MAX_INT_BITS} bits")


def _check_power(base, exponent) -> None:
    if _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1:
        _refuse_large(math.inf if exponent.bit_length() > 64 else exponent * math.log2(abs(base)), "the power")


def _check_factorial(n) -> None:
    if _is_int(n) and n > 0:
        _refuse_large(math.inf if n.bit_length() > 32 else math.lgamma(n + 1) / math.log(2), "the factorial")


def _check_perm(n, k=None) -> None:
    if k is None:
        _check_factorial(n)
    elif _is_int(n) and _is_int(k) and 0 <= k <= n:
        _refuse_large(k * n.bit_length(), "the permutation count")


def _check_comb(n, k) -> None:
    if _is_int(n) and _is_int(k) and 0 <= k <= n:
        _refuse_large(min(n, min(k, n - k) * n.bit_length()), "the binomial coefficient")


def _check_lcm(*numbers) -> None:
    if all(_is_int(number) for number in numbers):
        _refuse_large(sum(number.bit_length() for number in numbers), "the least common multiple")


_GROWING_FUNCTIONS: dict[str, Callable] = {
    "factorial": _check_factorial, "perm": _check_perm, "comb": _check_comb, "lcm": _check_lcm}
# name -> (the math function, the check its arguments pass before it is called)
FUNCTIONS: dict[str, tuple[Callable, Callable | None]] = {
    **{name: (getattr(math, name), None) for name in _FAST_FUNCTIONS if hasattr(math, name)},
    **{name: (getattr(math, name), check) for name, check in _GROWING_FUNCTIONS.items()},
}


def parse_expression(text: str) -> ast.expr:
    """The expression's syntax tree as ``evaluate_expression`` reads it; ``CalculationError`` when it is none."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    source = text.lstrip(" \t")  # eval() of a string drops leading spaces and tabs, ast.parse does not
    try:
        with warnings.catch_warnings():  # model text like "5.3.28" must not print parser warnings
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise CalculationError(f"not a Python expression: {error}") from None


def _describe(node: ast.AST) -> str:
    """A short name for a refused node (never ``ast.unparse``: it recurses over deep trees)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return type(node).__name__


def _math_member(node: ast.AST, table: dict, kind: str) -> str:
    """The name ``x`` of a ``math.x`` node found in ``table``."""
    if isinstance(node, ast.Name):
        raise CalculationError(f"unknown name {node.id!r} (only math.<name> is available)")
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and node.attr in table):
        return node.attr
    raise CalculationError(f"not an accepted {kind}: {_describe(node)}")


def _children(node: ast.AST) -> list[ast.AST]:
    """The sub-expressions whose values ``node`` needs; refuses every node type it does not accept."""
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, _LITERAL_TYPES):
            raise CalculationError(f"not a number: {node.value!r}")
        return []
    if isinstance(node, (ast.Attribute, ast.Name)):
        _math_member(node, CONSTANTS, "constant")
        return []
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return [node.operand]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return [node.left, node.right]
    if isinstance(node, ast.Call):
        _math_member(node.func, FUNCTIONS, "function")
        if node.keywords or any(isinstance(argument, ast.Starred) for argument in node.args):
            raise CalculationError("only positional arguments are accepted")
        return list(node.args)
    raise CalculationError(f"not accepted: {type(node).__name__}")


def _apply(node: ast.AST, arguments: list):
    """The value of ``node`` given its children's values."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        return CONSTANTS[node.attr]
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](*arguments)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            _check_power(*arguments)
        return _BINARY[type(node.op)](*arguments)
    function, check = FUNCTIONS[node.func.attr]
    if check is not None:
        try:
            check(*arguments)
        except TypeError:
            pass  # a wrong argument count: the call below raises Python's own error
    return function(*arguments)


def evaluate_expression(text: str) -> int | float | complex | bool | None:
    """The value Python gives ``text`` (see the module doc), or ``CalculationError``."""
    values: list = []
    # post-order walk: (node, None) still has to be expanded, (node, n) has its n children's values on top
    stack: list[tuple[ast.AST, int | None]] = [(parse_expression(text), None)]
    while stack:
        node, arity = stack.pop()
        if arity is None:
            children = _children(node)
            stack.append((node, len(children)))
            stack.extend((child, None) for child in reversed(children))
            continue
        arguments = values[len(values) - arity:]
        del values[len(values) - arity:]
        try:
            value = _apply(node, arguments)
        except CalculationError:
            raise
        except (ArithmeticError, ValueError, TypeError, MemoryError) as error:
            raise CalculationError(f"{type(error).__name__}: {error}") from None
        if _is_int(value):
            _refuse_large(value.bit_length(), "an int")
        values.append(value)
    return values[0]
