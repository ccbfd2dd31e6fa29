"""Reading what a remote sends, capped by the bytes actually read.

A Content-Length is the sender's word: a body sent chunked, as an SSE stream, or compressed says
nothing true about its size. Everything read from a tool server, a model or an identity provider
goes through one of these, which count bytes as they arrive and stop reading past a limit:

- `CountingTransport`, an httpx transport (MCP's SDK and any client we build): every response's
  stream is counted, the connection is closed past the limit. Compressed answers are not asked
  for (`Accept-Encoding: identity`) and refused when sent anyway: the bytes counted are the bytes
  parsed, so 4 MB of gzip never becomes 4 GB of JSON.
- `read_capped`, for a response already streaming (httpx or the `openai` SDK's `httpx2`): its
  decoded bytes, counted.

Both raise `BodyTooLarge` naming the limit; the caller says whose answer it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

import httpx


class BodyTooLarge(Exception):
    """A remote's answer was over the limit (the rest was not read)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"the answer is larger than {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


class BodyEncoded(Exception):
    """A remote compressed its answer though we asked for none."""


class _Streaming(Protocol):
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def read_capped(response: _Streaming, limit_bytes: int) -> bytes:
    """The body of a streamed response (`send(..., stream=True)`), decoded, at most `limit_bytes`;
    BodyTooLarge (and the response closed) past it."""
    parts: list[bytes] = []
    seen = 0
    try:
        async for chunk in response.aiter_bytes():
            seen += len(chunk)
            if seen > limit_bytes:
                raise BodyTooLarge(limit_bytes)
            parts.append(chunk)
    finally:
        await response.aclose()
    return b"".join(parts)


def _encoded(headers: httpx.Headers) -> bool:
    return headers.get("content-encoding", "identity").strip().lower() not in ("", "identity")


class _CountedStream(httpx.AsyncByteStream):
    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        limit_bytes: int,
        over: Callable[[BodyTooLarge], None],
        named_limit_bytes: int,
    ) -> None:
        self._inner, self._limit_bytes, self._over = inner, limit_bytes, over
        self._named_limit_bytes = named_limit_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit_bytes:
                exc = BodyTooLarge(self._named_limit_bytes)
                self._over(exc)
                await self._inner.aclose()  # the connection goes: the sender stops
                raise exc
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose responses stop past `limit_bytes` (each) and, when
    `total_limit_bytes` is set, past that many bytes over all responses of the client.

    `refused(request, exc)` is called when a response is refused (over a limit, or compressed),
    before the reader sees the exception: a caller whose library swallows exceptions raised while
    it reads (the `mcp` SDK's transport tasks) hears it there.
    """

    def __init__(
        self,
        *,
        limit_bytes: int,
        total_limit_bytes: int | None = None,
        refused: Callable[[httpx.Request, Exception], None] | None = None,
        inner: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()
        self._limit_bytes = limit_bytes
        self._total_limit_bytes = total_limit_bytes
        self._refused = refused or (lambda request, exc: None)
        self.total_bytes = 0  # read so far, over all responses

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        problem: Exception | None = None
        if _encoded(response.headers):
            problem = BodyEncoded("the answer is compressed, though none was asked for")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self._limit_bytes:
            problem = BodyTooLarge(self._limit_bytes)
        if problem is not None:
            self._refused(request, problem)
            await response.aclose()
            raise problem
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        limit = named = self._limit_bytes
        if self._total_limit_bytes is not None:
            left = max(self._total_limit_bytes - self.total_bytes, 0)
            if left < limit:
                limit, named = left, self._total_limit_bytes

        def over(exc: BodyTooLarge) -> None:
            self._refused(request, exc)

        counted = _CountedStream(stream, limit, over, named)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_TotalledStream(counted, self),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _TotalledStream(httpx.AsyncByteStream):
    """Adds what passes to the transport's total."""

    def __init__(self, inner: _CountedStream, transport: CountingTransport) -> None:
        self._inner, self._transport = inner, transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._transport.total_bytes += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
