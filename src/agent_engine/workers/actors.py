"""The actors, thin: each reads its settings, calls one function of `runs/`, returns.

Actors are declared on a broker by `declare_actors` (called from `broker.configure_broker`), not at
import time, so importing this module connects to nothing. The per-process database engine,
runtime and in-flight set are created lazily on the process's one event loop (the `SharedAsyncIO`
middleware's, which every async actor of the process runs on) and closed when the worker stops.

`execute_run` does not hold its Dramatiq thread for the run's life: it waits for a place in the
in-flight set, claims, hands the claimed run to a task on the loop and returns (see
`workers/inflight.py`). Ticks run on their own `dramatiq.Worker` threads (`workers/main.py`), so a
full in-flight set never delays a schedule scan or a reap.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import dramatiq
import httpx
import structlog
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import AsyncIO, Middleware
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import activity
from agent_engine.db.engine import create_engine
from agent_engine.delivery import outbox
from agent_engine.domain.runs import RunState
from agent_engine.runs import execute, reaper, retention, scheduler
from agent_engine.runs.cancel import CancelWatcher
from agent_engine.runs.execute import Claim
from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings
from agent_engine.workers.inflight import InFlight, WorkerStopping

log = logging.getLogger(__name__)

RUNS_QUEUE = "runs"
TICKS_QUEUE = "ticks"
DELIVERIES_QUEUE = "deliveries"
QUEUES = (RUNS_QUEUE, TICKS_QUEUE, DELIVERIES_QUEUE)

# The actor waits for an in-flight place (at most one run's wall clock) and claims; Dramatiq's
# time limit (enforced only under its own CLI) sits above that.
ACTOR_TIME_LIMIT_MARGIN_SECONDS = 60.0
TICK_TIME_LIMIT_SECONDS = 300.0
# Retries cover failures before the claim (database unreachable); after it the claim's
# compare-and-set makes a retry a no-op, so a run that left `queued` is never executed twice.
EXECUTE_MAX_RETRIES = 3
EXECUTE_MIN_BACKOFF_SECONDS = 1.0
EXECUTE_MAX_BACKOFF_SECONDS = 30.0
# A message whose reservation a stopping worker refused goes back to the broker this soon.
REQUEUE_ON_STOP_DELAY_SECONDS = 1.0
# Ticks are periodic: a failed one is replaced by the next, and an old one is dropped.
TICK_MIN_MAX_AGE_SECONDS = 10.0
TICK_PRIORITY = 0
EXECUTE_PRIORITY = 10
# A delivery's attempt runs as a task of its own: the actor returns at once, so a slow receiver
# never holds a worker thread. A lost attempt is covered by its lease (delivery/outbox.py).
DELIVER_PRIORITY = 20
DELIVER_TIME_LIMIT_SECONDS = 60.0
# How long a stopping worker lets runs in flight finish before interrupting them (set per stop).
DEFAULT_SHUTDOWN_GRACE_SECONDS = 20.0
# The database is away (restart, network): an actor logs one line and the work is retried.
DATABASE_ERRORS = (DBAPIError, OSError)


class WorkerContext:
    """Per-process resources of the actors: settings, then a lazily created engine, runtime and
    in-flight set (all bound to the process's event loop)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
            self._engine = create_engine(self.settings, pre_ping=False)
        return self._engine

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(
                self.engine,
                model_timeout_seconds=self.settings.model_timeout_seconds,
                tool_timeout_seconds=self.settings.tool_timeout_seconds,
                model_concurrency=self.settings.runs_in_flight,
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
        """The deliveries' HTTP client: redirects are not followed (DESIGN §10)."""
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
            await engine.dispose()


_context: WorkerContext | None = None


def _require_context() -> WorkerContext:
    if _context is None:
        raise RuntimeError("actors are not declared: call workers.broker.configure_broker()")
    return _context


def worker_context() -> WorkerContext:
    """This process's actor resources (for the worker's start and stop)."""
    return _require_context()


async def execute_run(run_id: int) -> None:
    from agent_engine.workers.broker import enqueue_execute

    context = _require_context()
    in_flight = context.in_flight
    try:
        # Blocks this Dramatiq thread while the set is full, before anything is claimed.
        await in_flight.reserve()
    except WorkerStopping:
        raise dramatiq.Retry(delay=int(REQUEUE_ON_STOP_DELAY_SECONDS * 1000)) from None
    try:
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            claim = await execute.claim_run(
                context.engine, run_id, now=execute.utc_now(), enqueue=enqueue_execute
            )
    except DATABASE_ERRORS as exc:
        # Nothing was claimed (the claim is one transaction): Dramatiq retries the message with
        # backoff. One line, not a traceback per message, while the database is away.
        in_flight.cancel_reservation()
        log.warning("run %s: could not claim it, the database is unreachable: %s", run_id, exc)
        raise dramatiq.Retry() from None
    except BaseException:
        in_flight.cancel_reservation()
        raise
    if claim.state is not RunState.RUNNING:
        in_flight.cancel_reservation()
        return
    in_flight.start(_execute_claimed(context, claim), name=f"run-{run_id}")


async def _execute_claimed(context: WorkerContext, claim: Claim) -> None:
    from agent_engine.workers.broker import enqueue_execute

    settings = context.settings
    with structlog.contextvars.bound_contextvars(run_id=claim.run_id):
        await execute.execute_claimed(
            context.engine,
            context.runtime,
            claim,
            heartbeat_interval=settings.heartbeat_interval,
            run_timeout=timedelta(seconds=settings.run_timeout_seconds),
            enqueue=enqueue_execute,
            cancels=context.cancels,
        )


async def schedule_due_agents() -> None:
    from agent_engine.workers.broker import enqueue_execute

    context = _require_context()
    try:
        claimed = await scheduler.schedule_due_agents(
            context.engine,
            now=execute.utc_now(),
            batch_size=context.settings.schedule_batch_size,
            enqueue=enqueue_execute,
        )
    except DATABASE_ERRORS as exc:
        log.warning("schedule tick skipped, the database is unreachable: %s", exc)
        return  # the next tick scans again; nothing was claimed
    if claimed:
        log.info("schedule tick: %d due agents", claimed)


async def reap_stale_runs() -> None:
    from agent_engine.workers.broker import enqueue_execute

    context = _require_context()
    settings = context.settings
    try:
        result = await reaper.reap_stale_runs(
            context.engine,
            now=execute.utc_now(),
            stale_after=settings.stale_after,
            resend_after=timedelta(seconds=settings.queued_resend_after_seconds),
            fail_after=timedelta(seconds=settings.queued_fail_after_seconds),
            slot_wait=timedelta(seconds=settings.model_slot_wait_seconds),
            enqueue=enqueue_execute,
        )
    except DATABASE_ERRORS as exc:
        log.warning("reap tick skipped, the database is unreachable: %s", exc)
        return  # the next tick reaps
    if result.failed_running or result.failed_queued or result.resent or result.purged_agents:
        log.info(
            "reaper: failed %d stale running, %d stale queued; re-sent %d; purged %d agents",
            len(result.failed_running),
            len(result.failed_queued),
            len(result.resent),
            len(result.purged_agents),
        )


async def prune_finished_runs() -> None:
    context = _require_context()
    result = await retention.prune_finished_runs(
        context.engine, now=execute.utc_now(), batch_size=context.settings.retention_batch_size
    )
    if result.deleted:
        log.info("retention: pruned %d finished runs before %s", result.deleted, result.cutoff)


def _recorded_tick(name: str, tick: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """The tick, then its completion stamped in `engine_activity` (the "no tick" alert)."""

    async def recorded() -> None:
        await tick()
        async with _require_context().engine.begin() as conn:
            await activity.bump(conn, activity.tick_name(name))

    recorded.__name__ = recorded.__qualname__ = tick.__name__
    return recorded


async def dispatch_deliveries() -> None:
    from agent_engine.workers.broker import enqueue_delivery

    context = _require_context()
    sent = await outbox.dispatch_due(
        context.engine,
        now=execute.utc_now(),
        enqueue=enqueue_delivery,
        per_target=context.settings.delivery_concurrency_per_target,
        lease=timedelta(seconds=context.settings.delivery_lease_seconds),
    )
    if sent:
        log.info("deliveries: dispatched %d", len(sent))


async def deliver(delivery_id: int, token: str) -> None:
    context = _require_context()
    settings = context.settings
    context.track_delivery(
        asyncio.ensure_future(
            outbox.deliver(
                context.engine,
                context.http,
                delivery_id,
                token,
                schedule=settings.delivery_retry_schedule,
                attempt_timeout=timedelta(seconds=settings.delivery_timeout_seconds),
            )
        )
    )


@dataclass(frozen=True)
class Actors:
    execute_run: dramatiq.Actor[[int], None]
    schedule_due_agents: dramatiq.Actor[[], None]
    reap_stale_runs: dramatiq.Actor[[], None]
    prune_finished_runs: dramatiq.Actor[[], None]
    dispatch_deliveries: dramatiq.Actor[[], None]
    deliver: dramatiq.Actor[[int, str], None]


class SharedAsyncIO(AsyncIO):
    """Dramatiq's AsyncIO middleware for several `dramatiq.Worker`s in one process: the first to
    boot starts the event loop, the last to shut down stops it (the runs and the ticks worker
    share one loop, one engine and one in-flight set)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._workers = 0

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers += 1
            if self._workers == 1:
                super().before_worker_boot(broker, worker)  # type: ignore[no-untyped-call]

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers -= 1
            if self._workers == 0:
                super().after_worker_shutdown(broker, worker)  # type: ignore[no-untyped-call]


class _ContextMiddleware(Middleware):
    """Stops admitting runs when a worker begins to stop; closes the per-process resources after
    the last worker stopped, while the event loop still runs (SharedAsyncIO stops it next)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self._lock = threading.Lock()
        self._workers = 0

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers += 1

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # The process is stopping (its workers stop together): wake the threads waiting for an
        # in-flight place, so Dramatiq can join them; their messages go back to the broker.
        loop_thread = get_event_loop_thread()
        if loop_thread is not None:
            loop_thread.loop.call_soon_threadsafe(self.context.stop_admitting)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers -= 1
            last = self._workers == 0
        loop_thread = get_event_loop_thread()
        if not last or loop_thread is None:
            return
        try:
            loop_thread.run_coroutine(self.context.close())
        except Exception:
            log.warning("could not close the worker's resources cleanly", exc_info=True)


def declare_actors(broker: dramatiq.Broker, settings: Settings) -> Actors:
    """Bind the actors to `broker` (which has `SharedAsyncIO`) with options from `settings`."""
    global _context
    _context = WorkerContext(settings)
    # `after` in the list: Dramatiq emits after_* hooks in reverse order, so ours runs first.
    broker.add_middleware(_ContextMiddleware(_context), after=SharedAsyncIO)
    execute_limit_ms = int((settings.run_timeout_seconds + ACTOR_TIME_LIMIT_MARGIN_SECONDS) * 1000)

    def tick(name: str, fn: Any, *, every_seconds: float, ages: int) -> Any:
        """A periodic actor: never retried, dropped when older than `ages` of its intervals."""
        return dramatiq.actor(
            broker=broker,
            actor_name=name,
            queue_name=TICKS_QUEUE,
            priority=TICK_PRIORITY,
            time_limit=int(TICK_TIME_LIMIT_SECONDS * 1000),
            max_retries=0,
            max_age=int(max(every_seconds * ages, TICK_MIN_MAX_AGE_SECONDS) * 1000),
        )(fn)

    return Actors(
        execute_run=dramatiq.actor(
            broker=broker,
            actor_name="execute_run",
            queue_name=RUNS_QUEUE,
            priority=EXECUTE_PRIORITY,
            time_limit=execute_limit_ms,
            max_retries=EXECUTE_MAX_RETRIES,
            min_backoff=int(EXECUTE_MIN_BACKOFF_SECONDS * 1000),
            max_backoff=int(EXECUTE_MAX_BACKOFF_SECONDS * 1000),
        )(execute_run),
        schedule_due_agents=tick(
            "schedule_due_agents",
            _recorded_tick("schedule", schedule_due_agents),
            every_seconds=settings.schedule_tick_seconds,
            ages=4,
        ),
        reap_stale_runs=tick(
            "reap_stale_runs",
            _recorded_tick("reap", reap_stale_runs),
            every_seconds=settings.reap_tick_seconds,
            ages=2,
        ),
        prune_finished_runs=tick(
            "prune_finished_runs",
            _recorded_tick("retention", prune_finished_runs),
            every_seconds=settings.retention_tick_seconds,
            ages=2,
        ),
        dispatch_deliveries=tick(
            "dispatch_deliveries",
            dispatch_deliveries,
            every_seconds=settings.delivery_tick_seconds,
            ages=4,
        ),
        deliver=dramatiq.actor(
            broker=broker,
            actor_name="deliver",
            queue_name=DELIVERIES_QUEUE,
            priority=DELIVER_PRIORITY,
            time_limit=int(DELIVER_TIME_LIMIT_SECONDS * 1000),
            # A lost attempt is re-dispatched when its lease expires.
            max_retries=0,
        )(deliver),
    )
