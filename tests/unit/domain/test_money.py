"""Prices, decimal text and currencies."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agent_engine.domain.money import MoneyError, format_decimal, parse_currency, parse_price


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5", Decimal("1.5")), ("0", Decimal(0)), ("10000", Decimal(10000)), (" 0.15 ", "0.15")],
)
def test_prices_from_zero_to_ten_thousand(text: str, value: Decimal | str) -> None:
    assert parse_price(text) == Decimal(value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-0.01", "must not be negative"),
        ("10000.0001", "at most 10000"),
        ("abc", "decimal number"),
        ("", "decimal number"),
        ("NaN", "finite"),
        ("Infinity", "finite"),
        ("1e-13", "decimal places"),
        ("1" * 80, "decimal number"),
    ],
)
def test_bad_prices_say_why(text: str, says: str) -> None:
    with pytest.raises(MoneyError, match=says):
        parse_price(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("0.0000285"), "0.0000285"),
        (Decimal("0.000028500000"), "0.0000285"),
        (Decimal("2.85E-7"), "0.000000285"),
        (Decimal("1E+2"), "100"),
        (Decimal("0E-10"), "0"),
        (Decimal("1.50"), "1.5"),
    ],
)
def test_decimal_text_has_no_exponent_and_no_trailing_zeros(value: Decimal, text: str) -> None:
    assert format_decimal(value) == text


def test_currency_is_an_iso_4217_code() -> None:
    assert parse_currency("USD") == "USD"
    assert parse_currency("eur") == "EUR"
    for bad in ("US", "EURO", "XXX", "ABC", "12€", ""):
        with pytest.raises(MoneyError):
            parse_currency(bad)
