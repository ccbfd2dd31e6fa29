"""A Starlette app served by Uvicorn in a background thread with its own event loop.

The local servers the engine ships for development and tests (the fake OpenAI server, the webhook
receiver) are started from plain sync code and from inside a running asyncio loop alike, so each
serves on a loop of its own. The socket is bound before the thread starts, so `port` is known (and
port 0 picks a free one) by the time `start` returns.
"""

from __future__ import annotations

import abc
import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import Self

import uvicorn
from starlette.applications import Starlette

STARTUP_TIMEOUT_SECONDS = 10.0
SHUTDOWN_TIMEOUT_SECONDS = 10.0


class ServerThread(abc.ABC):
    """Subclasses give the app (`app`), a thread name and how to name the server in errors."""

    thread_name = "http-server"
    description = "the HTTP server"
    # Seconds open requests get to finish on stop; None waits for them.
    graceful_shutdown_seconds: int | None = None

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._requested_port = port
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    @abc.abstractmethod
    def app(self) -> Starlette:
        """The app this thread serves."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop while it serves (for `call_soon_threadsafe`)."""
        loop = self._loop
        return None if loop is None or loop.is_closed() else loop

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self.description} is already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._requested_port))
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=self.graceful_shutdown_seconds,
        )
        server = self._server = uvicorn.Server(config)
        loop = self._loop = new_event_loop()

        def serve() -> None:
            try:
                loop.run_until_complete(server.serve(sockets=[sock]))
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.description} did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_TIMEOUT_SECONDS)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(SHUTDOWN_TIMEOUT_SECONDS)
        if self._socket is not None:
            self._socket.close()
        self._thread = self._server = self._socket = None
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (uvicorn[standard] brings it): thousands of slow requests at once."""
    try:
        import uvloop  # optional, so looked up when a loop is made
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
