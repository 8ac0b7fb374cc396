"""Arithmetic on model-written expressions without ``eval``: an ``ast`` walker with size, magnitude and time limits.

Accepted: int/float literals, ``+ - * / // % **``, unary ``+ -``, parentheses, the constants ``pi`` and ``e``
and a fixed set of functions (``sqrt``, ``log``, ``sin`` ... also written ``math.sqrt``). Common typographic
operators (``^ × ÷ −`` and full-width parentheses) are normalized first. Anything else is refused.
"""

from __future__ import annotations

import ast
import math
import operator
import time
import warnings

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 100
MAX_EXPONENT = 100
MAX_MAGNITUDE = 1e30
MAX_SECONDS = 0.05

_NORMALIZE = str.maketrans({"^": "**", "×": "*", "÷": "/", "−": "-", "（": "(", "）": ")", "，": ","})
_CONSTANTS = {"pi": math.pi, "e": math.e}
_FUNCTIONS = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
    "log": math.log, "log10": math.log10, "log2": math.log2, "exp": math.exp,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "min": min, "max": max,
}
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculationError(ValueError):
    """An expression that is not allowed, too large, or has no finite value."""


def evaluate_expression(expression: str) -> int | float:
    """The value of ``expression``; ints stay exact, floats are trimmed to 12 significant digits."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculationError("expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.translate(_NORMALIZE).strip()
    try:
        with warnings.catch_warnings():  # model text like "5.3.28" must not print parser warnings
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise CalculationError(f"not an arithmetic expression: {error.msg}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalculationError(f"expression has {nodes} syntax nodes, more than {MAX_NODES}")
    value = _Evaluator(time.monotonic() + MAX_SECONDS).visit(tree.body)
    if isinstance(value, float):
        value = float(f"{value:.12g}")
    return value


class _Evaluator:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def visit(self, node: ast.AST) -> int | float:
        if time.monotonic() > self.deadline:
            raise CalculationError("evaluation took too long")
        value = self._value(node)
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculationError("result is not a finite number")
        if abs(value) > MAX_MAGNITUDE:
            raise CalculationError(f"magnitude above {MAX_MAGNITUDE:g}")
        return value

    def _value(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                raise CalculationError(f"unsupported literal {node.value!r}")
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in _CONSTANTS:
                raise CalculationError(f"unknown name '{node.id}'")
            return _CONSTANTS[node.id]
        if isinstance(node, ast.Attribute):
            return _CONSTANTS[self._math_member(node, _CONSTANTS, "name")]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.visit(node.operand))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return _power(self.visit(node.left), self.visit(node.right))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.visit(node.left), self.visit(node.right)
            try:
                return _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise CalculationError("division by zero") from None
        if isinstance(node, ast.Call):
            return self._call(node)
        raise CalculationError(f"unsupported syntax: {type(node).__name__}")

    def _call(self, node: ast.Call) -> int | float:
        if node.keywords:
            raise CalculationError("keyword arguments are not supported")
        if isinstance(node.func, ast.Attribute):
            name = self._math_member(node.func, _FUNCTIONS, "function")
        elif isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            name = node.func.id
        else:
            raise CalculationError(f"unknown function {ast.unparse(node.func)!r}")
        arguments = [self.visit(argument) for argument in node.args]
        try:
            return _FUNCTIONS[name](*arguments)
        except TypeError:
            raise CalculationError(f"wrong number of arguments for {name}()") from None
        except (ValueError, OverflowError) as error:
            raise CalculationError(f"{name}() {error}") from None

    @staticmethod
    def _math_member(node: ast.Attribute, table: dict, kind: str) -> str:
        if isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in table:
            return node.attr
        raise CalculationError(f"unknown {kind} {ast.unparse(node)!r}")


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculationError(f"exponent above {MAX_EXPONENT}")
    if base != 0 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalculationError(f"magnitude above {MAX_MAGNITUDE:g}")
    try:
        result = base**exponent
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except OverflowError:
        raise CalculationError(f"magnitude above {MAX_MAGNITUDE:g}") from None
    if isinstance(result, complex):
        raise CalculationError("result is not a real number")
    return result
