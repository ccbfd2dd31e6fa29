"""What the run writers pass through before PostgreSQL: no NUL, no lone surrogate."""

from __future__ import annotations

import json

import pytest

from agent_engine.domain.storable import (
    storable_json,
    storable_json_dumps,
    storable_optional,
    storable_text,
)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("plain text", "plain text"),
        ("a\x00b\x00", "ab"),
        ("lone \ud800 high", "lone \ufffd high"),
        ("lone \udfff low", "lone \ufffd low"),
        ("split pair \ud83d\ude00", "split pair \U0001f600"),
        ("already whole \U0001f600", "already whole \U0001f600"),
    ],
)
def test_text_loses_nul_and_lone_surrogates_only(given: str, stored: str) -> None:
    assert storable_text(given) == stored
    storable_text(given).encode("utf-8")  # asyncpg can send it


def test_none_stays_none() -> None:
    assert storable_optional(None) is None
    assert storable_optional("x\x00") == "x"


def test_json_is_cleaned_throughout_keys_too() -> None:
    value = {"k\x00": ["v\x00", 1, 2.5, None, True, {"deep": "\ud800"}]}
    assert storable_json(value) == {"k": ["v", 1, 2.5, None, True, {"deep": "\ufffd"}]}


def test_dumps_is_plain_json_dumps_when_nothing_needs_cleaning() -> None:
    value = {"title": "Renew TLS", "path": "C:\\u0000 is a literal backslash"}
    assert storable_json_dumps(value) == json.dumps(value)
    assert json.loads(storable_json_dumps({"t": "a\x00b"})) == {"t": "ab"}
    assert "\\u0000" not in storable_json_dumps({"t": "a\x00b"})
    assert "\\ud800" not in storable_json_dumps(["\ud800"])
