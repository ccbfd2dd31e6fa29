"""The actors' per-process resources: settings, then a lazily created engine, runtime, in-flight
set, cancel listener and HTTP client, all bound to the process's one event loop (the
`SharedAsyncIO` middleware's) and closed when the worker stops."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.engine import create_engine
from agent_engine.db.lane import close_lane, open_lane
from agent_engine.delivery.outbox import EnqueueDelivery
from agent_engine.runs.cancel import CancelWatcher
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.credentials import CredentialGuard
from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings
from agent_engine.workers.inflight import InFlight

log = logging.getLogger(__name__)

# How long a stopping worker lets runs in flight finish before interrupting them (set per stop).
DEFAULT_SHUTDOWN_GRACE_SECONDS = 20.0


class WorkerContext:
    """Per-process resources of the actors: settings, then a lazily created engine, runtime and
    in-flight set (all bound to the process's event loop)."""

    def __init__(
        self,
        settings: Settings,
        *,
        enqueue_execute: Enqueue,
        enqueue_delivery: EnqueueDelivery,
    ) -> None:
        self.settings = settings
        # The broker's senders (workers/broker.py), handed in: the broker declares the actors.
        self.enqueue_execute = enqueue_execute
        self.enqueue_delivery = enqueue_delivery
        self.shutdown_grace_seconds = DEFAULT_SHUTDOWN_GRACE_SECONDS
        self._engine: AsyncEngine | None = None
        self._runtime: Runtime | None = None
        self._in_flight: InFlight | None = None
        self._cancels: CancelWatcher | None = None
        self._http: httpx.AsyncClient | None = None
        self._deliveries: set[asyncio.Task[Any]] = set()

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            # No pre-ping: a dead pooled connection fails the actor, and Dramatiq retries it.
            # Connections kept open (same ceiling): with runs in flight the overflow was opened
            # and closed again around nearly every claim and finish (a new session, TLS attempt
            # and statement preparation each time).
            self._engine = create_engine(self.settings, pre_ping=False, keep_connections=True)
            # A run's one-statement writes on kept autocommit connections (db/lane.py): as many
            # as the pool's size, half of the connections the engine keeps open.
            open_lane(self._engine, size=self.settings.db_pool_size)
        return self._engine

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(
                self.engine,
                model_timeout_seconds=self.settings.model_timeout_seconds,
                tool_timeout_seconds=self.settings.tool_timeout_seconds,
                model_concurrency=self.settings.runs_in_flight,
                breaker_open_seconds=self.settings.model_breaker_open_seconds,
                rate_limit_wait_seconds=self.settings.model_fallback_wait_seconds,
                credentials=CredentialGuard(
                    self.engine, allowed_prefixes=self.settings.credential_prefixes
                ),
            )
        return self._runtime

    @property
    def in_flight(self) -> InFlight:
        if self._in_flight is None:
            self._in_flight = InFlight(self.settings.runs_in_flight)
        return self._in_flight

    @property
    def cancels(self) -> CancelWatcher:
        """The process's cancelRun listener, started on first use (on the actors' loop)."""
        if self._cancels is None:
            self._cancels = CancelWatcher(self.settings.require_database_url())
        self._cancels.start(self.engine)
        return self._cancels

    @property
    def http(self) -> httpx.AsyncClient:
        """The deliveries' HTTP client: redirects are not followed (a receiver cannot send a
        signed delivery on to another address)."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                follow_redirects=False,
                timeout=self.settings.delivery_timeout_seconds,
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=20),
            )
        return self._http

    def track_delivery(self, task: asyncio.Task[Any]) -> None:
        self._deliveries.add(task)
        task.add_done_callback(self._delivery_done)

    def _delivery_done(self, task: asyncio.Task[Any]) -> None:
        self._deliveries.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The lease expires and the dispatcher sends it again.
            log.warning("a delivery attempt failed", exc_info=task.exception())

    def stop_admitting(self) -> None:
        """On the loop: refuse new runs (the worker is stopping); runs in flight go on."""
        if self._in_flight is not None:
            self._in_flight.stop_admitting()

    async def close(self) -> None:
        """Let runs in flight finish (grace), interrupt the rest (they journal it), release the
        database pool and the model clients."""
        if self._in_flight is not None:
            await self._in_flight.drain(self.shutdown_grace_seconds)
        pending = [task for task in self._deliveries if not task.done()]
        for task in pending:
            task.cancel()  # an interrupted attempt is sent again when its lease expires
        if pending:
            await asyncio.wait(pending, timeout=5)
        if self._cancels is not None:
            cancels, self._cancels = self._cancels, None
            await cancels.stop()
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()
        if self._runtime is not None:
            runtime, self._runtime = self._runtime, None
            await runtime.aclose()
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await close_lane(engine)
            await engine.dispose()
