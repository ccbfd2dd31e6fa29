"""The model call on the wire against a server that answers with exactly the bytes a test gives:
keep-alive and its end, the ways a body is framed, compressed and redirected replies, a call
cancelled mid-exchange, a server that stops answering — each as the SDK's own path would see it."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import json
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_engine.runtime.providers import wire
from agent_engine.runtime.providers.base import ModelRequest, ProviderError
from agent_engine.runtime.providers.openai_provider import OpenAIProvider

KEY_ENV = "AGENT_ENGINE_TEST_WIRE_KEY"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
ANSWER_BYTES = json.dumps(ANSWER).encode()

# A reply: the request's path in, the bytes to send back out (and whether to close after).
Reply = Callable[[str], tuple[bytes, bool]]


def reply(
    body: bytes = ANSWER_BYTES,
    *,
    status: str = "200 OK",
    headers: tuple[str, ...] = ("Content-Type: application/json",),
    length: bool = True,
    close: bool = False,
) -> Reply:
    head = [f"HTTP/1.1 {status}", *headers]
    if length:
        head.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    return lambda _path: (raw, close)


@dataclass
class RawServer:
    """An HTTP/1.1 server answering each request with the next scripted reply (the last one
    repeats)."""

    replies: list[Reply] = field(default_factory=list)
    connections: int = 0
    paths: list[str] = field(default_factory=list)
    port: int = 0
    delay: float = 0.0  # before each reply

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    int(line.split(":", 1)[1])
                    for line in lines
                    if line.lower().startswith("content-length:")
                )
                await reader.readexactly(length)
                self.paths.append(path)
                answer = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
                data, close = answer(path)
                await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[RawServer]:
    raw = RawServer()
    listening = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    raw.port = listening.sockets[0].getsockname()[1]
    try:
        yield raw
    finally:
        listening.close()
        await listening.wait_closed()


@contextlib.asynccontextmanager
async def _provider(
    server: RawServer, *, timeout_seconds: float = 5.0
) -> AsyncIterator[OpenAIProvider]:
    os.environ[KEY_ENV] = "k"
    provider = OpenAIProvider(
        base_url=f"http://127.0.0.1:{server.port}/v1",
        api_key_env=KEY_ENV,
        timeout_seconds=timeout_seconds,
        max_retries=0,
    )
    assert provider._pool is not None  # on the wire
    try:
        yield provider
    finally:
        await provider.aclose()


def _request() -> ModelRequest:
    return ModelRequest(model="m", messages=[{"role": "user", "content": "Hi?"}], tools=[])


async def test_calls_share_one_kept_alive_connection(server: RawServer) -> None:
    server.replies = [reply()]
    async with _provider(server) as provider:
        replies = [await provider.complete(_request()) for _ in range(5)]
    assert [r.content for r in replies] == ["Hi."] * 5
    assert replies[0].tokens_used == 5
    assert server.connections == 1
    assert server.paths == ["/v1/chat/completions"] * 5


async def test_a_connection_idle_past_the_keepalive_expiry_is_not_used_again(
    server: RawServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "KEEPALIVE_EXPIRY_SECONDS", 0.2)
    server.replies = [reply()]
    async with _provider(server) as provider:
        await provider.complete(_request())
        await provider.complete(_request())  # at once: the same connection
        await asyncio.sleep(0.3)
        await provider.complete(_request())  # expired: a new one
    assert server.connections == 2


async def test_a_server_that_closes_after_each_reply_gets_a_new_connection(
    server: RawServer,
) -> None:
    server.replies = [reply(headers=("Content-Type: application/json", "Connection: close"))]
    async with _provider(server) as provider:
        replies = [await provider.complete(_request()) for _ in range(3)]
    assert [r.content for r in replies] == ["Hi."] * 3
    assert server.connections == 3


@pytest.mark.parametrize(
    "framing",
    [
        pytest.param(
            reply(
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(ANSWER_BYTES), ANSWER_BYTES),
                headers=("Content-Type: application/json", "Transfer-Encoding: chunked"),
                length=False,
            ),
            id="chunked",
        ),
        pytest.param(reply(length=False, close=True), id="until the connection closes"),
        pytest.param(
            reply(
                gzip.compress(ANSWER_BYTES),
                headers=("Content-Type: application/json", "Content-Encoding: gzip"),
            ),
            id="gzip",
        ),
    ],
)
async def test_every_framing_and_coding_of_the_body_reads_the_same(
    server: RawServer, framing: Reply
) -> None:
    server.replies = [framing]
    async with _provider(server) as provider:
        answer = await provider.complete(_request())
    assert (answer.content, answer.tokens_used) == ("Hi.", 5)


async def test_a_redirect_is_followed_by_the_sdk_client(server: RawServer) -> None:
    def redirect_or_answer(path: str) -> tuple[bytes, bool]:
        if path == "/v1/chat/completions":
            return reply(
                b"", status="307 Temporary Redirect", headers=("Location: /v2/chat/completions",)
            )(path)
        return reply()(path)

    server.replies = [redirect_or_answer]
    async with _provider(server) as provider:
        answer = await provider.complete(_request())
    assert answer.content == "Hi."
    # The wire's try, the SDK client's try and the redirected one.
    assert server.paths == ["/v1/chat/completions", "/v1/chat/completions", "/v2/chat/completions"]


async def test_an_error_reply_and_a_reply_that_is_not_http(server: RawServer) -> None:
    error = json.dumps({"error": {"message": "no such model"}}).encode()
    server.replies = [
        reply(error, status="404 Not Found"),
        lambda _path: (b"SSH-2.0\r\n\r\n", True),
    ]
    async with _provider(server) as provider:
        with pytest.raises(ProviderError, match=r"refused the request \(HTTP 404\)"):
            await provider.complete(_request())
        with pytest.raises(ProviderError, match="unreachable"):
            await provider.complete(_request())


async def test_a_silent_server_times_out_and_a_cancelled_call_leaves_the_pool_working(
    server: RawServer,
) -> None:
    silent = asyncio.Event()

    def nothing(_path: str) -> tuple[bytes, bool]:
        silent.set()
        return b"", False

    server.replies = [nothing, nothing, reply()]
    async with _provider(server, timeout_seconds=0.3) as provider:
        with pytest.raises(ProviderError, match="timed out"):
            await provider.complete(_request())
        silent.clear()
        call = asyncio.ensure_future(provider.complete(_request()))
        await asyncio.wait_for(silent.wait(), 5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        answer = await provider.complete(_request())
    assert answer.content == "Hi."
    # Neither the timed-out nor the cancelled connection was used again.
    assert server.connections == 3


async def test_calls_at_once_each_get_a_connection_and_keep_it(server: RawServer) -> None:
    server.replies = [reply()]
    server.delay = 0.1
    async with _provider(server) as provider:
        answers = await asyncio.gather(*(provider.complete(_request()) for _ in range(20)))
        again = await asyncio.gather(*(provider.complete(_request()) for _ in range(20)))
    assert {a.content for a in [*answers, *again]} == {"Hi."}
    assert server.connections == 20  # the second 20 calls found them kept alive


def _self_signed(directory: Path) -> ssl.SSLContext:
    """A TLS server context with a certificate for 127.0.0.1 that no CA signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


async def test_an_endpoint_whose_certificate_no_ca_signed_is_refused(tmp_path: Path) -> None:
    raw = RawServer(replies=[reply()])
    listening = await asyncio.start_server(raw.handle, "127.0.0.1", 0, ssl=_self_signed(tmp_path))
    port = listening.sockets[0].getsockname()[1]
    os.environ[KEY_ENV] = "k"
    provider = OpenAIProvider(
        base_url=f"https://127.0.0.1:{port}/v1",
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        max_retries=0,
    )
    try:
        assert provider._pool is not None
        with pytest.raises(ProviderError, match="unreachable"):
            await provider.complete(_request())
    finally:
        await provider.aclose()
        listening.close()
        await listening.wait_closed()
    assert raw.paths == []  # the request never left


async def test_with_every_connection_busy_a_call_waits_at_most_the_pool_timeout(
    server: RawServer,
) -> None:
    server.replies = [lambda _path: (b"", False)]  # never answers
    pool = wire.WirePool(
        "127.0.0.1",
        server.port,
        tls=None,
        timeouts=wire.Timeouts(connect=5, read=5, pool=0.2),
        max_connections=1,
    )
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    busy = asyncio.ensure_future(pool.exchange(request))
    try:
        await asyncio.sleep(0.05)  # the first exchange holds the one connection
        with pytest.raises(wire.WireTimeout, match="no free connection"):
            await pool.exchange(request)
        assert not busy.done()
    finally:
        busy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await busy
        pool.close()
    assert server.connections == 1
