"""Transport and input limits without a server: the body-size limit in front of a tiny ASGI app,
and the input checks that name the field they refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from agent_engine.api.errors import BAD_USER_INPUT, BadUserInput
from agent_engine.api.guards import (
    MAX_JSON_DEPTH,
    MAX_PAGE_SIZE,
    META_MAX_BYTES,
    BodySizeLimit,
    DocumentCache,
    UnreadableJson,
    checked_instant,
    checked_meta,
    checked_text,
    decode_json_body,
    document_too_large,
    page_size,
)

LIMIT_BYTES = 100


class Echo:
    """Answers with the body it received, and remembers whether it was called."""

    def __init__(self) -> None:
        self.calls = 0
        self.headers: dict[bytes, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        self.headers = dict(scope["headers"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


async def post(app: Echo, content: bytes | AsyncIterator[bytes]) -> httpx.Response:
    transport = httpx.ASGITransport(app=BodySizeLimit(app, max_bytes=LIMIT_BYTES))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        return await client.post("/graphql", content=content)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/json"
    [error] = response.json()["errors"]
    assert error["extensions"] == {"code": "PAYLOAD_TOO_LARGE"}
    assert error["message"] == f"request body larger than {LIMIT_BYTES} bytes"


async def test_a_body_of_exactly_the_limit_reaches_the_app_whole() -> None:
    app = Echo()
    response = await post(app, b"x" * LIMIT_BYTES)
    assert response.status_code == 200
    assert response.content == b"x" * LIMIT_BYTES


async def test_a_declared_length_over_the_limit_is_refused_before_the_app_runs() -> None:
    app = Echo()
    assert_refused(await post(app, b"x" * (LIMIT_BYTES + 1)))
    assert app.calls == 0


async def test_a_chunked_body_over_the_limit_is_refused_before_the_app_runs() -> None:
    app = Echo()
    assert_refused(await post(app, chunks(b"x" * 60, b"x" * 41)))
    assert app.calls == 0


async def test_a_chunked_body_within_the_limit_reaches_the_app_in_order() -> None:
    app = Echo()
    response = await post(app, chunks(b"a" * 50, b"b" * 30, b"c" * 20))
    assert b"content-length" not in app.headers  # so the limit counted as it read
    assert response.status_code == 200
    assert response.content == b"a" * 50 + b"b" * 30 + b"c" * 20


async def test_a_websocket_passes_through_untouched() -> None:
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)
        assert (await receive())["type"] == "websocket.connect"

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        raise AssertionError(f"the limit answered a websocket: {message}")

    scope: dict[str, Any] = {"type": "websocket", "headers": [(b"content-length", b"999999")]}
    await BodySizeLimit(app, max_bytes=1)(scope, receive, send)
    assert seen == [scope]


def field_of(error: pytest.ExceptionInfo[BadUserInput]) -> tuple[str, str]:
    assert error.value.extensions["code"] == BAD_USER_INPUT
    return error.value.field, error.value.message


def test_a_page_is_one_to_the_page_size() -> None:
    assert page_size(1) == 1
    assert page_size(MAX_PAGE_SIZE) == MAX_PAGE_SIZE
    for first in (0, -1, MAX_PAGE_SIZE + 1):
        with pytest.raises(BadUserInput) as error:
            page_size(first, "last")
        assert field_of(error) == ("last", f"last: must be between 1 and {MAX_PAGE_SIZE}")


def test_text_is_refused_over_its_length_or_blank_naming_the_field() -> None:
    assert checked_text("input.name", "a" * 5, 5) == "a" * 5
    with pytest.raises(BadUserInput) as error:
        checked_text("input.name", "a" * 6, 5)
    assert field_of(error) == ("input.name", "input.name: at most 5 characters (got 6)")
    with pytest.raises(BadUserInput) as error:
        checked_text("input.name", " \n\t", 5)
    assert field_of(error) == ("input.name", "input.name: must not be blank")
    assert checked_text("input.description", "  ", 5, allow_blank=True) == "  "


def test_meta_is_a_json_object_up_to_its_size() -> None:
    assert checked_meta("input.meta", None) is None
    # The compact encoding counts: {"k":"..."} is 8 bytes around the value.
    fits = {"k": "v" * (META_MAX_BYTES - 8)}
    assert checked_meta("input.meta", fits) == fits
    with pytest.raises(BadUserInput) as error:
        checked_meta("input.meta", {"k": "v" * (META_MAX_BYTES - 7)})
    assert field_of(error) == (
        "input.meta",
        f"input.meta: at most {META_MAX_BYTES} bytes of JSON (got {META_MAX_BYTES + 1})",
    )
    for not_an_object in ([1, 2], "text", 3):
        with pytest.raises(BadUserInput) as error:
            checked_meta("input.meta", not_an_object)
        assert field_of(error) == ("input.meta", "input.meta: must be a JSON object or null")


# --- documents, JSON and instants ---------------------------------------------------------------


def test_the_document_cache_is_bounded_by_the_text_it_holds() -> None:
    cache = DocumentCache(max_chars=100, max_document_chars=40)
    cache.put("a" * 41, "too big")
    assert cache.get("a" * 41) is None and len(cache) == 0
    for letter in "bcd":
        cache.put(letter * 40, letter)
    # 120 characters do not fit in 100: the least recently used went first.
    assert cache.get("b" * 40) is None
    assert cache.get("c" * 40) == "c" and cache.get("d" * 40) == "d"
    assert cache.chars == 80
    cache.get("c" * 40)  # used: now the most recent
    cache.put("e" * 40, "e")
    assert cache.get("d" * 40) is None and cache.get("c" * 40) == "c"
    # A variant is its own entry (validation differs for anonymous callers).
    cache.put("x", 1, variant=True)
    assert cache.get("x", False) is None and cache.get("x", True) == 1


def test_a_document_over_the_limit_is_named_by_its_bytes() -> None:
    assert document_too_large("{ a }", 10) is None
    assert "10 bytes" in (document_too_large("{ a } #" + "😀" * 2, 10) or "")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 100_000])
def test_json_nested_too_deep_is_unreadable(depth: int) -> None:
    with pytest.raises(UnreadableJson) as raised:
        decode_json_body("[" * depth + "]" * depth)
    assert f"nested deeper than {MAX_JSON_DEPTH}" in raised.value.reason
    assert decode_json_body("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None


def test_a_number_of_thousands_of_digits_is_unreadable_json() -> None:
    with pytest.raises(UnreadableJson):
        decode_json_body('{"n": ' + "9" * 5_000 + "}")


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
        datetime(1, 1, 2, tzinfo=timezone(timedelta(hours=14))),
        datetime(2025, 3, 9),  # no offset
    ],
)
def test_instants_at_the_calendars_edges_are_refused_naming_the_field(value: datetime) -> None:
    with pytest.raises(BadUserInput) as raised:
        checked_instant("windowStart", value)
    assert raised.value.field == "windowStart"


def test_an_ordinary_instant_is_kept() -> None:
    value = datetime(2025, 3, 9, tzinfo=UTC)
    assert checked_instant("windowStart", value) is value
