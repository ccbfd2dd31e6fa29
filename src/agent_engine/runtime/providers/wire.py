"""HTTP/1.1 keep-alive connections to one model endpoint, for the chat call's POST.

The chat call is one small JSON request and one JSON reply. Through httpx and httpcore each such
exchange cost ~1 ms of worker CPU against a fast server (their per-request objects, anyio cancel
scopes, h11's state machine, the pool walk over every connection, a `poll` per reused connection,
headers and body in two sends; bench/README "CPU per unit of work"). Here an exchange is one
`write` of the request and llhttp (`httptools`, uvicorn's parser) reading the reply into bytes on
an asyncio protocol; an idle connection is taken off a stack.

What it does not do is left to the caller, which sends such calls through the SDK's own client:
proxies, redirects, HTTP/2 and compressed replies (`Exchange.encoded`). Failures are two kinds,
mapped by the caller to the SDK's errors: `WireTimeout` (no connection, no free connection or no
byte of the reply within the client's timeouts) and `WireError` (refused, reset, TLS, a reply that
does not parse or ends early).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass

import httptools

# An idle connection is not used again after this long (as httpx's `keepalive_expiry`): a server
# that closes idle connections would otherwise meet a request on one it is closing.
KEEPALIVE_EXPIRY_SECONDS = 5.0


class WireError(Exception):
    """The exchange failed: the connection was refused, reset or closed early, or the reply was
    not HTTP."""


class WireTimeout(WireError):
    """No connection, no free connection or no byte of the reply within the timeout."""


class WireTooLarge(WireError):
    """The reply's body passed the pool's `max_body_bytes` (counted as read; the connection is
    dropped, the rest is never read)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"the reply is larger than {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


@dataclass(frozen=True, slots=True)
class Exchange:
    """A reply: its status, headers (as sent, in order) and body (as sent)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def encoded(self) -> bool:
        """True when the body has a content coding (gzip, br, …) the caller must decode."""
        return any(
            name.lower() == b"content-encoding" and value.strip().lower() not in (b"", b"identity")
            for name, value in self.headers
        )


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float | None
    read: float | None
    pool: float | None


class _Connection(asyncio.Protocol):
    """One connection: at most one exchange at a time."""

    def __init__(self, max_body_bytes: int | None = None) -> None:
        self._max_body_bytes = max_body_bytes
        self._body_bytes = 0
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._reply: asyncio.Future[Exchange] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._headers_done = False
        self._framed = True  # the reply says where its body ends (a length or chunks)
        self._timer: asyncio.TimerHandle | None = None
        self._read_timeout: float | None = None
        self.reusable = False
        self.idle_since = 0.0  # loop time the connection went back to the pool

    # -- the exchange ----------------------------------------------------------------------------

    def send(self, data: bytes, read_timeout: float | None) -> asyncio.Future[Exchange]:
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise WireError("the connection closed before the request was sent")
        loop = asyncio.get_running_loop()
        self._reply = loop.create_future()
        self._headers, self._body, self._headers_done = [], [], False
        self._body_bytes = 0
        self.reusable = False
        self._read_timeout = read_timeout
        self._arm()
        self.transport.write(data)
        return self._reply

    def abort(self) -> None:
        self.closed = True
        self._disarm()
        reply = self._reply
        if reply is not None and not reply.done():
            reply.cancel()  # its caller is gone (cancelled): nobody reads an error
        if self.transport is not None:
            self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        if self._read_timeout is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(WireTimeout("no reply within the read timeout"))
        self.abort()

    def _fail(self, error: WireError) -> None:
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_exception(error)

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._reply is None or self._reply.done():
            # Bytes nobody asked for (after a reply, or a server talking first): not reusable.
            self.abort()
            return
        self._arm()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(WireError(f"the reply is not HTTP/1.1: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        reply = self._reply
        if reply is None or reply.done():
            return
        if self._headers_done and not self._framed:
            # A body without a length ends with the connection (HTTP/1.0 style).
            self._complete(reusable=False)
            return
        detail = f": {exc}" if exc is not None else ""
        self._fail(WireError(f"the connection closed before the reply was complete{detail}"))

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True
        length = any(name.lower() == b"content-length" for name, _ in self._headers)
        chunked = any(
            name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
            for name, value in self._headers
        )
        status = self._parser.get_status_code()
        self._framed = length or chunked or status in (204, 304) or 100 <= status < 200

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        limit = self._max_body_bytes
        if limit is not None and self._body_bytes > limit:
            self._fail(WireTooLarge(limit))
            self.abort()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            # An interim reply (100 Continue): the final one follows on the same exchange.
            self._headers, self._body, self._headers_done = [], [], False
            return
        self._complete(reusable=self._parser.should_keep_alive())

    def _complete(self, *, reusable: bool) -> None:
        self._disarm()
        self.reusable = reusable and not self.closed
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_result(
                Exchange(self._parser.get_status_code(), self._headers, b"".join(self._body))
            )


def _spent(connection: _Connection, now: float) -> bool:
    """An idle connection not to be used again: closed by the server, or idle too long."""
    return connection.closed or connection.idle_since < now - KEEPALIVE_EXPIRY_SECONDS


class WirePool:
    """Keep-alive connections to one origin, at most `max_connections` at once."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        timeouts: Timeouts,
        max_connections: int,
        max_body_bytes: int | None = None,
    ) -> None:
        """`max_body_bytes`: a reply's body past this many bytes (however framed: a length,
        chunks or until the connection closes) fails with WireTooLarge."""
        self._max_body_bytes = max_body_bytes
        self._host = host
        self._port = port
        self._tls = tls
        self._timeouts = timeouts
        self._idle: deque[_Connection] = deque()  # the most recently used on the right
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def exchange(self, request: bytes) -> Exchange:
        """Send `request` (a whole HTTP/1.1 request) and return the reply."""
        timeouts = self._timeouts
        if self._slots.locked():  # every connection busy: wait for one, at most the pool timeout
            try:
                async with asyncio.timeout(timeouts.pool):
                    await self._slots.acquire()
            except TimeoutError:
                raise WireTimeout("no free connection within the pool timeout") from None
        else:
            await self._slots.acquire()  # at once
        connection: _Connection | None = None
        try:
            connection = self._take_idle() or await self._connect()
            reply = await connection.send(request, timeouts.read)
            if connection.reusable and not self._closed:
                self._put_idle(connection)
                connection = None
            return reply
        finally:
            if connection is not None:
                connection.abort()  # failed, cancelled, or not to be reused
            self._slots.release()

    def _take_idle(self) -> _Connection | None:
        """The most recently used idle connection still open and not expired."""
        idle = self._idle
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if not _spent(connection, now):
                return connection
            connection.abort()
        return None

    def _put_idle(self, connection: _Connection) -> None:
        """Back on the stack; the spent ones at its bottom (the least recently used) close."""
        now = asyncio.get_running_loop().time()
        connection.idle_since = now
        idle = self._idle
        while idle and _spent(idle[0], now):
            idle.popleft().abort()
        idle.append(connection)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeouts.connect):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self._max_body_bytes),
                    self._host,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._host if self._tls is not None else None,
                )
        except TimeoutError:
            raise WireTimeout("no connection within the connect timeout") from None
        except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise WireError(f"could not connect: {exc}") from exc
        return connection

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().abort()
