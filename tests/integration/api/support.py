"""A real Uvicorn server on a free port, in a thread, and the shared GraphQL client for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import uvicorn
from starlette.types import ASGIApp

from agent_engine.api.app import create_app
from agent_engine.settings import Settings
from tests.support.graphql import GraphQL, codes, error

__all__ = ["FIXED_NOW", "Api", "Clock", "codes", "error", "running_server", "serving"]

SERVER_START_TIMEOUT_SECONDS = 20.0
# A fixed instant (a Wednesday) so slots and budget windows are predictable.
FIXED_NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)


@dataclass
class Clock:
    now: datetime = FIXED_NOW

    def __call__(self) -> datetime:
        return self.now


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serve `app` with Uvicorn on 127.0.0.1:<free port> in a thread; yield the base URL.

    The app creates its own engine in the server thread's event loop (asyncpg connections
    belong to one loop).
    """
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=SERVER_START_TIMEOUT_SECONDS)


@contextmanager
def running_server(settings: Settings, clock: Clock) -> Iterator[str]:
    """`create_app(settings)` on `clock`, served; yield the base URL."""
    with serving(create_app(settings, clock=clock)) as url:
        yield url


@dataclass
class Api(GraphQL):
    """The shared GraphQL client against the running server, and the server's clock."""

    clock: Clock = field(default_factory=Clock)
