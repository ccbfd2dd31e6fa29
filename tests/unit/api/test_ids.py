"""Ids and page cursors as a client sends them: what is accepted, and what is refused naming the
argument."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from agent_engine.api.errors import BAD_USER_INPUT, BadUserInput
from agent_engine.api.ids import MAX_DATABASE_ID, decode_cursor, encode_cursor, parse_id


def refusal(call: Callable[..., object], *args: object) -> BadUserInput:
    with pytest.raises(BadUserInput) as raised:
        call(*args)
    return raised.value


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_an_id_is_a_positive_decimal_up_to_the_largest_bigint() -> None:
    assert parse_id("1", "id") == 1
    assert parse_id(" 42 ", "agentId") == 42
    assert parse_id(str(MAX_DATABASE_ID), "id") == MAX_DATABASE_ID


@pytest.mark.parametrize(
    "value", ["0", "-1", str(MAX_DATABASE_ID + 1), "", " ", "1.5", "1e3", "0x10", "abc", "+7"]
)
def test_anything_else_is_refused_as_the_clients_input_naming_the_argument(value: str) -> None:
    error = refusal(parse_id, value, "agentId")
    assert error.extensions == {"code": BAD_USER_INPUT, "field": "agentId"}
    assert error.message == f"agentId: not a valid id: {value!r}"


def test_a_long_bad_id_is_quoted_only_in_part() -> None:
    error = refusal(parse_id, "x" * 1_000, "id")
    assert error.message == f"id: not a valid id: {'x' * 40!r}"


@pytest.mark.parametrize("value", ["²", "1²"])
def test_a_non_ascii_digit_is_refused_as_the_clients_input(value: str) -> None:
    refusal(parse_id, value, "id")


def test_a_cursor_round_trips_and_none_means_from_the_start() -> None:
    for ident in (1, 7, MAX_DATABASE_ID):
        assert decode_cursor("run", encode_cursor("run", ident)) == ident
    assert decode_cursor("run", None) is None


def test_a_cursor_is_url_safe_and_unpadded() -> None:
    cursor = encode_cursor("run", MAX_DATABASE_ID)
    assert cursor.isascii()
    assert not set(cursor) & {"+", "/", "="}
    # Padded by a client that normalised it: still read.
    assert decode_cursor("run", cursor + "=" * (-len(cursor) % 4)) == MAX_DATABASE_ID


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "a",  # not a whole base64 quantum
        cursor_of("run"),
        cursor_of("run:"),
        cursor_of("run:x"),
        cursor_of("run:-1"),
        cursor_of(f"run:{MAX_DATABASE_ID + 1}"),
        cursor_of("agent:7"),  # another connection's cursor
        base64.urlsafe_b64encode(b"\xff\xfe:1").decode(),  # not UTF-8
    ],
)
def test_a_malformed_or_foreign_cursor_is_refused_naming_the_argument(cursor: str) -> None:
    error = refusal(decode_cursor, "run", cursor, "before")
    assert error.extensions == {"code": BAD_USER_INPUT, "field": "before"}
    assert error.message == "before: not a cursor returned by this API"


def test_the_argument_named_by_default_is_after() -> None:
    error = refusal(decode_cursor, "run", "!!!")
    assert error.field == "after"


def test_ids_and_cursors_of_any_length_are_refused_naming_the_argument() -> None:
    assert refusal(parse_id, "9" * 5_000, "id").field == "id"
    assert refusal(decode_cursor, "run", "A" * 10_000).field == "after"
    long_id = base64.urlsafe_b64encode(("run:" + "9" * 5_000).encode()).decode()
    assert refusal(decode_cursor, "run", long_id).field == "after"
