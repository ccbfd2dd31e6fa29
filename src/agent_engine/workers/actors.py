"""The actors, thin: each reads its settings, calls one function of `runs/`, returns.

Actors are declared on a broker by `declare_actors` (called from `broker.configure_broker`), not at
import time, so importing this module connects to nothing. The per-process database engine and
runtime are created lazily on the AsyncIO middleware's event loop, the loop every async actor of
this process runs on, and closed when the worker shuts down.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import dramatiq
import httpx
import structlog
from dramatiq.middleware import Middleware
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.engine import create_engine
from agent_engine.delivery import outbox
from agent_engine.runs import execute, reaper, scheduler
from agent_engine.runs.cancel import CancelWatcher
from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings

log = logging.getLogger(__name__)

RUNS_QUEUE = "runs"
TICKS_QUEUE = "ticks"
DELIVERIES_QUEUE = "deliveries"
QUEUES = (RUNS_QUEUE, TICKS_QUEUE, DELIVERIES_QUEUE)

# The actor's time limit sits above the run's own wall-clock limit, so the run ends itself (and
# journals why) before Dramatiq interrupts it.
ACTOR_TIME_LIMIT_MARGIN_SECONDS = 60.0
TICK_TIME_LIMIT_SECONDS = 300.0
# Retries cover failures before the claim (database unreachable); after it the claim's
# compare-and-set makes a retry a no-op, so a run that left `queued` is never executed twice.
EXECUTE_MAX_RETRIES = 3
EXECUTE_MIN_BACKOFF_SECONDS = 1.0
EXECUTE_MAX_BACKOFF_SECONDS = 30.0
# Ticks are periodic: a failed one is replaced by the next, and an old one is dropped.
TICK_MIN_MAX_AGE_SECONDS = 10.0
# Lower runs first: a tick waiting for a free worker thread goes before queued executions, so
# a burst of runs does not delay the scan. (A worker busy with long runs on every thread still
# delays it: give ticks their own worker with `--queues ticks`, or more threads.)
TICK_PRIORITY = 0
EXECUTE_PRIORITY = 10
# A delivery's attempt runs as a task of its own: the actor returns at once, so a slow receiver
# never holds a worker thread. A lost attempt is covered by its lease (delivery/outbox.py).
DELIVER_PRIORITY = 20
DELIVER_TIME_LIMIT_SECONDS = 60.0


class WorkerContext:
    """Per-process resources of the actors: settings, then a lazily created engine and runtime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engine: AsyncEngine | None = None
        self._runtime: Runtime | None = None
        self._cancels: CancelWatcher | None = None
        self._http: httpx.AsyncClient | None = None
        self._executions: set[asyncio.Task[Any]] = set()

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
                self.engine, model_timeout_seconds=self.settings.model_timeout_seconds
            )
        return self._runtime

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

    def track(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._executions.add(task)

    def untrack(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._executions.discard(task)

    async def close(self) -> None:
        """Interrupt runs still executing (they journal it) and release the database pool."""
        pending = [task for task in self._executions if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)
        self._executions.clear()
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


async def execute_run(run_id: int) -> None:
    context = _require_context()
    settings = context.settings
    task = asyncio.current_task()
    context.track(task)
    try:
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            await execute.execute_run(
                context.engine,
                context.runtime,
                run_id,
                heartbeat_interval=settings.heartbeat_interval,
                run_timeout=timedelta(seconds=settings.run_timeout_seconds),
                cancels=context.cancels,
            )
    finally:
        context.untrack(task)


async def schedule_due_agents() -> None:
    from agent_engine.workers.broker import enqueue_execute

    context = _require_context()
    claimed = await scheduler.schedule_due_agents(
        context.engine,
        now=execute.utc_now(),
        batch_size=context.settings.schedule_batch_size,
        enqueue=enqueue_execute,
    )
    if claimed:
        log.info("schedule tick: %d due agents", claimed)


async def reap_stale_runs() -> None:
    from agent_engine.workers.broker import enqueue_execute

    context = _require_context()
    settings = context.settings
    result = await reaper.reap_stale_runs(
        context.engine,
        now=execute.utc_now(),
        stale_after=settings.stale_after,
        resend_after=timedelta(seconds=settings.queued_resend_after_seconds),
        fail_after=timedelta(seconds=settings.queued_fail_after_seconds),
        enqueue=enqueue_execute,
    )
    if result.failed_running or result.failed_queued or result.resent:
        log.info(
            "reaper: failed %d stale running, %d stale queued; re-sent %d",
            len(result.failed_running),
            len(result.failed_queued),
            len(result.resent),
        )


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
    task = asyncio.ensure_future(
        outbox.deliver(
            context.engine,
            context.http,
            delivery_id,
            token,
            schedule=settings.delivery_retry_schedule,
            attempt_timeout=timedelta(seconds=settings.delivery_timeout_seconds),
        )
    )
    context.track(task)
    task.add_done_callback(_delivery_done)


def _delivery_done(task: asyncio.Task[Any]) -> None:
    if _context is not None:
        _context.untrack(task)
    if not task.cancelled() and task.exception() is not None:
        # The lease expires and the dispatcher sends it again.
        log.warning("a delivery attempt failed", exc_info=task.exception())


@dataclass(frozen=True)
class Actors:
    execute_run: dramatiq.Actor[[int], None]
    schedule_due_agents: dramatiq.Actor[[], None]
    reap_stale_runs: dramatiq.Actor[[], None]
    dispatch_deliveries: dramatiq.Actor[[], None]
    deliver: dramatiq.Actor[[int, str], None]


class _ContextMiddleware(Middleware):
    """Closes the per-process resources while the event loop still runs (AsyncIO stops it next)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        from dramatiq.asyncio import get_event_loop_thread

        loop_thread = get_event_loop_thread()
        if loop_thread is None:
            return
        try:
            loop_thread.run_coroutine(self.context.close())
        except Exception:
            log.warning("could not close the worker's resources cleanly", exc_info=True)


def declare_actors(broker: dramatiq.Broker, settings: Settings) -> Actors:
    """Bind the actors to `broker` with options derived from `settings`."""
    from dramatiq.middleware import AsyncIO

    global _context
    _context = WorkerContext(settings)
    # `after` in the list: Dramatiq emits after_* hooks in reverse order, so ours runs first.
    broker.add_middleware(_ContextMiddleware(_context), after=AsyncIO)
    execute_limit_ms = int((settings.run_timeout_seconds + ACTOR_TIME_LIMIT_MARGIN_SECONDS) * 1000)
    schedule_max_age_s = max(settings.schedule_tick_seconds * 4, TICK_MIN_MAX_AGE_SECONDS)
    reap_max_age_s = max(settings.reap_tick_seconds * 2, TICK_MIN_MAX_AGE_SECONDS)
    delivery_max_age_s = max(settings.delivery_tick_seconds * 4, TICK_MIN_MAX_AGE_SECONDS)
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
        schedule_due_agents=dramatiq.actor(
            broker=broker,
            actor_name="schedule_due_agents",
            queue_name=TICKS_QUEUE,
            priority=TICK_PRIORITY,
            time_limit=int(TICK_TIME_LIMIT_SECONDS * 1000),
            max_retries=0,
            max_age=int(schedule_max_age_s * 1000),
        )(schedule_due_agents),
        reap_stale_runs=dramatiq.actor(
            broker=broker,
            actor_name="reap_stale_runs",
            queue_name=TICKS_QUEUE,
            priority=TICK_PRIORITY,
            time_limit=int(TICK_TIME_LIMIT_SECONDS * 1000),
            max_retries=0,
            max_age=int(reap_max_age_s * 1000),
        )(reap_stale_runs),
        dispatch_deliveries=dramatiq.actor(
            broker=broker,
            actor_name="dispatch_deliveries",
            queue_name=TICKS_QUEUE,
            priority=TICK_PRIORITY,
            time_limit=int(TICK_TIME_LIMIT_SECONDS * 1000),
            max_retries=0,
            max_age=int(delivery_max_age_s * 1000),
        )(dispatch_deliveries),
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
