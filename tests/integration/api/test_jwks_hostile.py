"""A JWKS address that answers with hostility: an endless body, or one trickled a byte at a time.

The set is refused (the tokens it would sign are UNAUTHENTICATED and /readyz names the reason),
the api stops reading at the cap instead of holding whatever is sent, and a trickle is cut at the
fetch's deadline instead of holding the fetch (and every sign-in waiting behind it) for as long
as the sender likes. Real sockets: the senders are asyncio servers on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from agent_engine.api.jwks import MAX_JWKS_BYTES, JwksKeys, JwksUnavailable

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
CHUNK = b"[" * 65_536

Sender = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _server(send: Sender) -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD)
            await send(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the api hung up: what a hostile sender should be met with
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/jwks.json"
    finally:
        server.close()


async def test_an_endless_key_set_is_refused_at_the_cap_and_not_held() -> None:
    sent: list[int] = []  # bytes written on each connection before the api hung up

    async def endless(writer: asyncio.StreamWriter) -> None:
        sent.append(0)
        while sent[-1] < 100 * MAX_JWKS_BYTES:
            writer.write(CHUNK)
            await writer.drain()
            sent[-1] += len(CHUNK)

    async with _server(endless) as url:
        keys = JwksKeys(url, refetch_seconds=0.0)
        with pytest.raises(JwksUnavailable, match=f"larger than {MAX_JWKS_BYTES} bytes"):
            await keys.key_for("any")
        status = await keys.status()
    assert not status.ready and "larger than" in status.detail
    # Each time the api hung up soon after the cap (loopback socket buffers take a few MB more),
    # so a sender can make it hold no more than the cap, whatever it is willing to send.
    assert sent and max(sent) < 20 * MAX_JWKS_BYTES, sent


async def test_a_trickled_key_set_is_cut_at_the_fetch_deadline() -> None:
    async def trickle(writer: asyncio.StreamWriter) -> None:
        while True:  # one byte every 50 ms: each read is "in time", the whole never is
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with _server(trickle) as url:
        keys = JwksKeys(url, refetch_seconds=0.0, timeout_seconds=0.5)
        with pytest.raises(JwksUnavailable, match="no answer in time"):
            await asyncio.wait_for(keys.key_for("any"), timeout=30)
