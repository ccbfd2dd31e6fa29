"""Request count and latency of the api's HTTP endpoints, for `/metrics` (latency, 5xx alerts).

A pure ASGI middleware (Starlette's public `middleware=` seam). Routes are a fixed, small set of
labels, never the raw path, so a client cannot grow the label space. WebSocket sessions are not
requests; the subscriptions gauge covers them.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_engine.observability.metrics import HTTP_REQUEST_DURATION, HTTP_REQUESTS

# Path prefix → route label; anything else is "other".
ROUTES = (
    ("/graphql", "/graphql"),
    ("/dashboard", "/dashboard"),
    ("/static/", "/static"),
    ("/metrics", "/metrics"),
    ("/healthz", "/healthz"),
    ("/readyz", "/readyz"),
)
KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})


def route_label(path: str) -> str:
    for prefix, label in ROUTES:
        if path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return label
    return "other"


class HttpMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started is a server error

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = route_label(scope["path"])
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"
            HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
            HTTP_REQUEST_DURATION.labels(route=route).observe(time.perf_counter() - started)
