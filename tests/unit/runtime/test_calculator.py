from __future__ import annotations

import pytest

from agent_engine.runtime.tools.calculator import (
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    evaluate,
    format_number,
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("-3 ** 2", -9),
        ("2 ** 10", 1024),
        ("2^10", 1024),
        ("2 ** -1", 0.5),
        ("sqrt(16) + abs(-2)", 6.0),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("round(3.14159, 2)", 3.14),
        ("floor(2.7) + ceil(2.1)", 5),
        ("log10(1000)", 3.0),
    ],
)
def test_arithmetic(expression: str, expected: float) -> None:
    assert evaluate(expression) == pytest.approx(expected)


def test_constants() -> None:
    assert evaluate("2 * pi") == pytest.approx(6.283185307)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "open",
        "(1).__class__",
        "().__class__.__bases__",
        "'a' * 3",
        "[1, 2]",
        "True + 1",
        "1 if 1 else 2",
        "lambda: 1",
        "sqrt(x=4)",
        "1 < 2",
        "1 << 1000",
    ],
)
def test_rejects_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_names_and_attributes_are_named_in_the_error() -> None:
    with pytest.raises(CalculatorError, match="unknown name 'os'"):
        evaluate("os")
    with pytest.raises(CalculatorError, match="Attribute"):
        evaluate("math.pi")


@pytest.mark.parametrize(
    "expression", ["9 ** 9 ** 9", "10 ** 100000", "2 ** 5000", "(10 ** 1000) ** 5", "10.0 ** 400"]
)
def test_rejects_huge_results_quickly(expression: str) -> None:
    with pytest.raises(CalculatorError, match=r"too large|larger than|finite"):
        evaluate(expression)


def test_rejects_long_and_deep_expressions() -> None:
    with pytest.raises(CalculatorError, match="longer than"):
        evaluate("1+" * MAX_EXPRESSION_CHARS + "1")
    with pytest.raises(CalculatorError, match="nested too deeply"):
        evaluate("-(" * 100 + "1" + ")" * 100)


def test_math_errors_are_explained() -> None:
    with pytest.raises(CalculatorError, match="division by zero"):
        evaluate("1 / 0")
    with pytest.raises(CalculatorError, match="math error"):
        evaluate("sqrt(-1)")
    with pytest.raises(CalculatorError, match="empty"):
        evaluate("   ")


def test_does_not_call_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval/exec must not be used")

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "eval", forbidden)
        patch.setattr(builtins, "exec", forbidden)
        value = evaluate("6 * 7 + sqrt(4)")
    assert value == 44


def test_format_number() -> None:
    assert format_number(42) == "42"
    assert format_number(4.0) == "4"
    assert format_number(0.1 + 0.2) == "0.30000000000000004"
