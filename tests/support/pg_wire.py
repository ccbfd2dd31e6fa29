"""A TCP relay in front of PostgreSQL that counts round trips, for tests that bound them.

Every round trip of the extended or simple protocol ends with the client's `Sync` ('S') or
`Query` ('Q') message, each answered by one `ReadyForQuery`; the relay reads the client's
message framing (after its untyped startup, and an SSL request refused by the server) and counts
those. Real sockets, a real server: only the counting is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
ROUND_TRIP_ENDS = (b"S", b"Q")


@dataclass
class RoundTrips:
    count: int = 0
    statements: list[str] = field(default_factory=list)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


async def _client_side(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: RoundTrips
) -> None:
    """Relay the client's bytes, counting the messages that end a round trip."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:  # the untyped startup: SSL/GSS requests (refused), then the startup message
            header = await reader.readexactly(8)
            length, code = struct.unpack("!ii", header)
            writer.write(header + await reader.readexactly(length - 8))
            await writer.drain()
            if code not in (SSL_REQUEST_CODE, GSSENC_REQUEST_CODE):
                break
        while True:
            kind = await reader.readexactly(1)
            size = await reader.readexactly(4)
            body = await reader.readexactly(struct.unpack("!i", size)[0] - 4)
            if kind in ROUND_TRIP_ENDS:
                counter.count += 1
            if kind in (b"Q", b"P"):
                # Query: the text; Parse: statement name, then the text.
                text = body if kind == b"Q" else body.split(b"\0", 1)[1]
                counter.statements.append(text.split(b"\0", 1)[0].decode(errors="replace"))
            writer.write(kind + size + body)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


@contextlib.asynccontextmanager
async def counting_relay(database_url: str) -> AsyncIterator[tuple[str, RoundTrips]]:
    """(the database URL through the relay, its counter). SSL is refused by the embedded server,
    so the relay sees the protocol in the clear."""
    url = make_url(database_url)
    counter = RoundTrips()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(url.host, url.port)
        await asyncio.gather(_client_side(client_r, server_w, counter), _pipe(server_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False), counter
    finally:
        server.close()
