"""Transport limits: a request body size limit (413 before the GraphQL layer reads it) and JSON
that the API will not read (nested too deep, numbers too long: a 400 saying why).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Variables (and any JSON body) nested deeper than this are refused before anything reads them.
MAX_JSON_DEPTH = 64


class UnreadableJson(json.JSONDecodeError):
    """JSON the API will not read (nested too deep, numbers too long): a 400 saying why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "", 0)
        self.reason = reason


def decode_json_body(data: str | bytes) -> object:
    """A request's (or a WebSocket message's) JSON, refused when nested deeper than
    MAX_JSON_DEPTH: Python's parser gives up at about a thousand levels, and what it reads just
    below that would exhaust the stack of whatever walks it next."""
    try:
        decoded = json.loads(data)
    except RecursionError as exc:
        raise UnreadableJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from exc
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise UnreadableJson(f"JSON not readable: {exc}") from exc
    if _json_depth(decoded) > MAX_JSON_DEPTH:
        raise UnreadableJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return decoded


def _json_depth(value: object) -> int:
    deepest = 0
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item)
    return deepest


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with 413, before the GraphQL layer reads them."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        # Chunked bodies have no length up front: read up to the limit, then replay.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        await self.app(
            scope,
            _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
            send,
        )

    async def _too_large(self, send: Send) -> None:
        payload = json.dumps(
            {
                "errors": [
                    {
                        "message": f"request body larger than {self.max_bytes} bytes",
                        "extensions": {"code": "PAYLOAD_TOO_LARGE"},
                    }
                ]
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
