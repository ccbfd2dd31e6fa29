"""The actors, thin: each reads its settings, calls one function of `runs/`, returns.

Actors are declared on a broker by `declare_actors` (called from `broker.configure_broker`), not at
import time, so importing this module connects to nothing. Their per-process resources live in a
`WorkerContext` (`workers/context.py`), on the process's one event loop (`workers/middleware.py`).

`execute_run` does not hold its Dramatiq thread for the run's life: it waits for a place in the
in-flight set, claims, hands the claimed run to a task on the loop and returns (see
`workers/inflight.py`). Ticks run on their own `dramatiq.Worker` threads (`workers/main.py`), so a
full in-flight set never delays a schedule scan or a reap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import dramatiq
import structlog
from sqlalchemy.exc import DBAPIError

from agent_engine.db import activity
from agent_engine.delivery import outbox
from agent_engine.delivery.outbox import EnqueueDelivery
from agent_engine.domain.runs import RunState
from agent_engine.observability import genai_spans as spans
from agent_engine.observability import tracing
from agent_engine.runs import (
    approvals,
    connection_waits,
    execute,
    reaper,
    retention,
    run_trace,
    scheduler,
)
from agent_engine.runs.execute import Claim
from agent_engine.runs.request import Enqueue
from agent_engine.settings import Settings
from agent_engine.tool_sources import sync as tool_source_sync
from agent_engine.workers.context import WorkerContext
from agent_engine.workers.inflight import WorkerStopping
from agent_engine.workers.middleware import SharedAsyncIO, WorkerContextMiddleware

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
# The database is away (restart, network): an actor logs one line and the work is retried.
DATABASE_ERRORS = (DBAPIError, OSError)


_context: WorkerContext | None = None


def _require_context() -> WorkerContext:
    if _context is None:
        raise RuntimeError("actors are not declared: call workers.broker.configure_broker()")
    return _context


def worker_context() -> WorkerContext:
    """This process's actor resources (for the worker's start and stop)."""
    return _require_context()


async def execute_run(run_id: int) -> None:
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
                context.engine,
                run_id,
                now=execute.utc_now(),
                enqueue=context.enqueue_execute,
                span=spans.start_agent_span(run_id),
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
    settings = context.settings
    with structlog.contextvars.bound_contextvars(run_id=claim.run_id):
        await execute.execute_claimed(
            context.engine,
            context.runtime,
            claim,
            heartbeat_interval=settings.heartbeat_interval,
            run_timeout=timedelta(seconds=settings.run_timeout_seconds),
            enqueue=context.enqueue_execute,
            cancels=context.cancels,
            approval_timeout_seconds=settings.approval_timeout_seconds,
        )


async def schedule_due_agents() -> None:
    context = _require_context()
    try:
        with spans.tick_span(tracing.SCHEDULE_TICK_SPAN):
            claimed = await scheduler.schedule_due_agents(
                context.engine,
                now=execute.utc_now(),
                batch_size=context.settings.schedule_batch_size,
                enqueue=context.enqueue_execute,
            )
    except DATABASE_ERRORS as exc:
        log.warning("schedule tick skipped, the database is unreachable: %s", exc)
        return  # the next tick scans again; nothing was claimed
    if claimed:
        log.info("schedule tick: %d due agents", claimed)


async def reap_stale_runs() -> None:
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
            enqueue=context.enqueue_execute,
        )
        # Approvals past their time expire (the model hears a decline); decided ones whose
        # message was lost are sent again.
        await approvals.sweep(
            context.engine,
            enqueue=context.enqueue_execute,
            resend_after_seconds=settings.queued_resend_after_seconds,
        )
        # Connection waits likewise: past their time the model hears "not connected".
        await connection_waits.sweep(
            context.engine,
            enqueue=context.enqueue_execute,
            resend_after_seconds=settings.queued_resend_after_seconds,
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


async def sync_tool_sources() -> None:
    """Re-list every enabled MCP source (new tools join not allowed, vanished ones leave)."""
    context = _require_context()
    await tool_source_sync.sync_enabled_sources(
        context.engine,
        seconds=context.settings.tool_timeout_seconds,
        allowed_prefixes=context.settings.credential_prefixes,
    )


def _recorded_tick(name: str, tick: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """The tick, then its completion stamped in `engine_activity` (the "no tick" alert)."""

    async def recorded() -> None:
        await tick()
        async with _require_context().engine.begin() as conn:
            await activity.bump(conn, activity.tick_name(name))

    recorded.__name__ = recorded.__qualname__ = tick.__name__
    return recorded


async def dispatch_deliveries() -> None:
    context = _require_context()
    sent = await outbox.dispatch_due(
        context.engine,
        now=execute.utc_now(),
        enqueue=context.enqueue_delivery,
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
            run_trace.in_delivery_trace(
                context.engine,
                delivery_id,
                outbox.deliver(
                    context.engine,
                    context.http,
                    delivery_id,
                    token,
                    schedule=settings.delivery_retry_schedule,
                    attempt_timeout=timedelta(seconds=settings.delivery_timeout_seconds),
                ),
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
    sync_tool_sources: dramatiq.Actor[[], None]


def declare_actors(
    broker: dramatiq.Broker,
    settings: Settings,
    *,
    enqueue_execute: Enqueue,
    enqueue_delivery: EnqueueDelivery,
) -> Actors:
    """Bind the actors to `broker` (which has `SharedAsyncIO`) with options from `settings`; the
    actors send follow-up messages through `enqueue_execute` and `enqueue_delivery`."""
    global _context
    _context = WorkerContext(
        settings, enqueue_execute=enqueue_execute, enqueue_delivery=enqueue_delivery
    )
    # `after` in the list: Dramatiq emits after_* hooks in reverse order, so ours runs first.
    broker.add_middleware(WorkerContextMiddleware(_context), after=SharedAsyncIO)
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
        sync_tool_sources=tick(
            "sync_tool_sources",
            sync_tool_sources,
            every_seconds=settings.tool_source_sync_seconds,
            ages=2,
        ),
    )
