"""Money: model prices, the decimal text the API speaks, and the platform currency
(docs/architecture.md §10.7).

Prices are per million prompt (input) or completion (output) tokens, in the platform currency,
exact decimals (NUMERIC in the database, a string in the API): money is never a float. A run's cost
is fixed when it finishes, from its model's prices then, by the database (migration
`e0006_cost_alerts`): prompt tokens x input price + completion tokens x output price, per million.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MAX_PRICE_PER_MILLION = Decimal(10_000)
MAX_PRICE_DECIMAL_PLACES = 12
# Longer input is not a price anyone means; refused before Decimal parses it.
MAX_DECIMAL_TEXT_CHARS = 64

DEFAULT_CURRENCY = "USD"

# ISO 4217 active codes, with the funds and precious-metal codes, and without the two codes the
# standard reserves for test use and for "no currency" (neither can price a model).
_ISO_4217_TEXT = """
    AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BOV BRL BSD BTN
    BWP BYN BZD CAD CDF CHE CHF CHW CLF CLP CNY COP COU CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP
    ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK
    JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK
    MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN
    PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB
    TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS VED VES VND VUV WST XAF XAG
    XAU XBA XBB XBC XBD XCD XCG XDR XOF XPD XPF XPT XSU XUA YER ZAR ZMW ZWG ZWL
"""
ISO_4217_CODES = frozenset(_ISO_4217_TEXT.split())


class MoneyError(ValueError):
    """An invalid price or currency; the message says what is wrong (the API names the field)."""


def parse_decimal(text: str) -> Decimal:
    """An exact, finite decimal from its text (e.g. "0.0042"); MoneyError otherwise."""
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_DECIMAL_TEXT_CHARS:
        raise MoneyError(f'must be a decimal number as a string, e.g. "1.25" (got {text[:40]!r})')
    try:
        value = Decimal(stripped)
    except InvalidOperation:
        raise MoneyError(
            f'must be a decimal number as a string, e.g. "1.25" (got {text[:40]!r})'
        ) from None
    if not value.is_finite():
        raise MoneyError(f"must be a finite number (got {text[:40]!r})")
    return value


def parse_price(text: str) -> Decimal:
    """A price per million tokens: 0 to 10,000 with at most 12 decimal places."""
    value = parse_decimal(text)
    if value < 0:
        raise MoneyError(f"must not be negative (got {text.strip()})")
    if value > MAX_PRICE_PER_MILLION:
        raise MoneyError(
            f"must be at most {format_decimal(MAX_PRICE_PER_MILLION)} per million tokens"
            f" (got {text.strip()})"
        )
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_PRICE_DECIMAL_PLACES:
        raise MoneyError(f"at most {MAX_PRICE_DECIMAL_PLACES} decimal places")
    return value


def format_decimal(value: Decimal) -> str:
    """The plain decimal text of a value, without exponent or trailing zeros: "0.0000285"."""
    normal = value.normalize()
    if normal.is_zero():
        return "0"
    return f"{normal:f}"


def parse_currency(text: str) -> str:
    """An ISO 4217 currency code, upper-cased ("eur" → "EUR")."""
    code = text.strip().upper()
    if len(code) != 3 or not code.isalpha() or not code.isascii():
        raise MoneyError(f"must be an ISO 4217 code of three letters, e.g. USD (got {text[:40]!r})")
    if code not in ISO_4217_CODES:
        raise MoneyError(f"{code} is not an ISO 4217 currency code")
    return code
