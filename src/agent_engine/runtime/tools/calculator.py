"""Safe arithmetic for the `calculator` tool: the expression is parsed with `ast` and walked.

Nothing is ever evaluated by Python: only number literals, + - * / // % **, unary signs,
parentheses and a short list of math functions and constants are accepted. Sizes are bounded so
an expression cannot exhaust memory or CPU (`9**9**9`, a 10,000-digit product).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 500
MAX_INTEGER_BITS = 4096  # about 1,233 decimal digits
MAX_EXPONENT = 10_000
MAX_NESTING_DEPTH = 50

Number = int | float


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its result would be too large."""


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, min args, max args)
    "abs": (abs, 1, 1),
    "round": (round, 1, 2),
    "min": (min, 1, 20),
    "max": (max, 1, 20),
    "sqrt": (math.sqrt, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (math.log, 1, 2),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
}


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression, or CalculatorError saying what is wrong."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    source = expression.strip().replace("^", "**")  # people write 2^10 for a power
    if not source:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from exc
    except (RecursionError, MemoryError) as exc:
        raise CalculatorError("expression is nested too deeply") from exc
    try:
        return _eval(tree.body, 0)
    except ZeroDivisionError as exc:
        raise CalculatorError("division by zero") from exc
    except OverflowError as exc:
        raise CalculatorError("result is too large") from exc
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"math error: {exc}") from exc


def format_number(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _eval(node: ast.expr, depth: int) -> Number:
    if depth > MAX_NESTING_DEPTH:
        raise CalculatorError("expression is nested too deeply")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, not {node.value!r:.40}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp):
        left = _eval(node.left, depth + 1)
        right = _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) in _BINARY:
            return _checked(_BINARY[type(node.op)](left, right))
        raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name '{node.id}'")
    if isinstance(node, ast.Call):
        return _call(node, depth)
    raise CalculatorError(f"{type(node).__name__} is not allowed in arithmetic")


def _call(node: ast.Call, depth: int) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
        raise CalculatorError("only the functions " + ", ".join(sorted(_FUNCTIONS)) + " exist")
    if node.keywords:
        raise CalculatorError("keyword arguments are not allowed")
    function, least, most = _FUNCTIONS[node.func.id]
    if not least <= len(node.args) <= most:
        raise CalculatorError(f"{node.func.id}() takes {least}..{most} arguments")
    args = [_eval(arg, depth + 1) for arg in node.args]
    bad_digits = len(args) == 2 and (not isinstance(args[1], int) or abs(args[1]) > 100)
    if node.func.id == "round" and bad_digits:
        raise CalculatorError("round() digits must be an integer within ±100")
    return _checked(function(*args))


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
    # Estimate an integer power's size before computing it.
    exact = isinstance(base, int) and isinstance(exponent, int) and exponent > 0
    if exact and max(int(base).bit_length() - 1, 0) * int(exponent) > MAX_INTEGER_BITS:
        raise CalculatorError("result is too large")
    result = base**exponent
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    return _checked(result)


def _checked(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        raise CalculatorError("result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value
