"""Bytes counted as they arrive: a body is refused past the limit whatever its headers say."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import httpx
import pytest

from agent_engine.bounded_reads import BodyEncoded, BodyTooLarge, CountingTransport
from agent_engine.domain.mcp import cleaned_text as clean_text

LIMIT_BYTES = 1_000


def client(body: bytes, **headers: str) -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        chunks = [body[i : i + 100] for i in range(0, len(body), 100)]
        return httpx.Response(200, headers=headers, stream=_Chunks(chunks))

    transport = CountingTransport(limit_bytes=LIMIT_BYTES, inner=httpx.MockTransport(answer))
    return httpx.AsyncClient(transport=transport), seen


class _Chunks(httpx.AsyncByteStream):
    """A body sent in pieces, without a Content-Length."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def test_a_body_at_the_limit_is_read_whole() -> None:
    http, _ = client(b"x" * LIMIT_BYTES)
    async with http:
        assert len((await http.get("http://remote/")).content) == LIMIT_BYTES


async def test_a_chunked_body_past_the_limit_is_refused_naming_it() -> None:
    http, _ = client(b"x" * (LIMIT_BYTES + 1))
    async with http:
        with pytest.raises(BodyTooLarge, match=f"larger than {LIMIT_BYTES} bytes"):
            await http.get("http://remote/")


async def test_a_compressed_body_is_not_asked_for_and_refused_when_sent() -> None:
    http, seen = client(gzip.compress(b"x" * 100_000), **{"content-encoding": "gzip"})
    async with http:
        with pytest.raises(BodyEncoded):
            await http.get("http://remote/")
    assert seen[0].headers["accept-encoding"] == "identity"


def test_clean_text_removes_controls_and_lone_surrogates() -> None:
    assert clean_text("a\x00b\x07c\td\ne\rf") == "abc\td\ne\rf"
    assert clean_text("half \ud800 pair") == "half  pair"
