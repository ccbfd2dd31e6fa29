"""A webhook receiver that verifies Standard Webhooks signatures: `agent-engine webhook listen`,
and the real local receiver the tests deliver to.

Each request is verified with the `standardwebhooks` package against the secret (the signature
over "id.timestamp.body", the timestamp within five minutes). A verified delivery is answered 204
(or the next scripted status, to play a failing receiver) and handed to `on_delivery`; a request
that does not verify is answered 401 and recorded as such.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from agent_engine.delivery.signing import signer
from agent_engine.server_thread import ServerThread


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


class WebhookReceiver(ServerThread):
    """`POST /` (any path) verified with `secret`; runs Uvicorn in a background thread."""

    thread_name = "webhook-receiver"
    description = "the webhook receiver"

    def __init__(
        self,
        secret: str,
        *,
        statuses: Iterable[int] = (),
        on_delivery: Callable[[Received], None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self._webhook = signer(secret)
        self._statuses: deque[int] = deque(statuses)
        self._on_delivery = on_delivery
        self._lock = threading.Lock()
        self._received: list[Received] = []

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
