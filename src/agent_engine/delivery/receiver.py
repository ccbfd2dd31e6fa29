"""A webhook receiver that verifies Standard Webhooks signatures: `agent-engine webhook listen`,
and the real local receiver the tests deliver to.

Each request is verified with the `standardwebhooks` package against the secret (the signature
over "id.timestamp.body", the timestamp within five minutes). A verified delivery is answered 204
(or the next scripted status, to play a failing receiver) and handed to `on_delivery`; a request
that does not verify is answered 401 and recorded as such.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import uvicorn
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from agent_engine.delivery.signing import signer

STARTUP_TIMEOUT_SECONDS = 10.0
SHUTDOWN_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int
    payload: Any = None
    error: str | None = None

    @property
    def webhook_id(self) -> str | None:
        return self.headers.get("webhook-id")


class WebhookReceiver:
    """`POST /` (any path) verified with `secret`; runs Uvicorn in a background thread."""

    def __init__(
        self,
        secret: str,
        *,
        statuses: Iterable[int] = (),
        on_delivery: Callable[[Received], None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._webhook = signer(secret)
        self._statuses: deque[int] = deque(statuses)
        self._on_delivery = on_delivery
        self._host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the receiver is not started")
        return f"http://{self._host}:{self.port}/hooks"

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._receive, methods=["POST"])])

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            payload = self._webhook.verify(body, headers)
        except (WebhookVerificationError, ValueError) as exc:
            received = Received(headers, body, False, 401, error=str(exc) or type(exc).__name__)
            self._record(received)
            return PlainTextResponse("signature not verified", status_code=401)
        with self._lock:
            status = self._statuses.popleft() if self._statuses else 204
        self._record(Received(headers, body, True, status, payload=payload))
        if status == 204:
            return Response(status_code=204)
        return PlainTextResponse(f"scripted status {status}", status_code=status)

    def _record(self, received: Received) -> None:
        with self._lock:
            self._received.append(received)
        if self._on_delivery is not None:
            self._on_delivery(received)

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (the command line)."""
        uvicorn.run(self.app(), host=self._host, port=self._requested_port, log_level="warning")

    def start(self) -> WebhookReceiver:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._requested_port))
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="webhook-receiver",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the webhook receiver did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_TIMEOUT_SECONDS)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def describe(received: Received) -> str:
    """One line per request for the command line: verified deliveries with their payload."""
    if not received.verified:
        return f"REJECTED (401): {received.error}"
    return json.dumps(
        {
            "webhook-id": received.webhook_id,
            "webhook-timestamp": received.headers.get("webhook-timestamp"),
            "payload": received.payload,
        },
        ensure_ascii=False,
    )
