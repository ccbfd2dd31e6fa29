"""Executing one queued run: claim (`runs/claim.py`), execute (heartbeat + runtime), finish
(`runs/finish.py`) — every write a compare-and-set.

`claim_run` moves the run from `queued` (to `running`, or ends it at the claim, or leaves it
waiting for a slot of its model); `execute_claimed` runs the agent loop beside a heartbeat and
finishes the run. The `execute_run` actor (`workers/actors.py`) claims in its Dramatiq thread and
executes in a task of its in-flight set (`workers/inflight.py`); tests drive the same two calls.

A run's start, heartbeats and finish are written on the database's clock (`now()`), so
`started_at <= heartbeat_at <= finished_at` holds whatever the worker's clock says.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.approvals import Decided
from agent_engine.db.connection_waits import Resolved
from agent_engine.db.run_steps import steps_of_runs
from agent_engine.domain.runs import HEARTBEAT_INTERVAL, RunReason, RunState
from agent_engine.runs import (
    approvals,
    connection_waits,
    model_slots,
    resume_gate,
    run_trace,
    steps,
)
from agent_engine.runs.cancel import CancelWatcher
from agent_engine.runs.claim import Claim as Claim
from agent_engine.runs.claim import claim_run as claim_run
from agent_engine.runs.claim import utc_now as utc_now
from agent_engine.runs.finish import INTERRUPTED_ERROR as INTERRUPTED_ERROR
from agent_engine.runs.finish import TokenMeter, fail, finish, heartbeat
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.loop import PARKED, WAITS_CONNECTION, Resume, Runtime
from agent_engine.runtime.prefill import Prefill, prefill_from_steps

log = logging.getLogger(__name__)

# The run's own wall-clock limit; the Dramatiq actor's time limit sits above it.
RUN_TIMEOUT = timedelta(minutes=10)

NowFn = Callable[[], datetime]


async def execute_claimed(
    engine: AsyncEngine,
    runtime: Runtime,
    claim: Claim,
    *,
    now_fn: NowFn = utc_now,
    heartbeat_interval: timedelta = HEARTBEAT_INTERVAL,
    run_timeout: timedelta = RUN_TIMEOUT,
    enqueue: Enqueue | None = None,
    cancels: CancelWatcher | None = None,
    approval_timeout_seconds: float = approvals.DEFAULT_APPROVAL_TIMEOUT_SECONDS,
) -> RunState | None:
    """Run a claimed run's agent loop beside its heartbeat, then finish it (a compare-and-set).
    A WRITE call waiting for the owner parks it instead (RUNNING is returned; no worker holds it
    until the decision re-enqueues it).

    Returns the state written, None when the run was no longer ours (reaped or cancelled
    meanwhile). With `cancels`, a cancelRun stops the work wherever it is (the API already wrote
    the row).
    """
    try:
        async with run_trace.traced_run(engine, claim) as traced:
            return traced.ended(
                await _execute(
                    engine,
                    runtime,
                    claim,
                    now_fn=now_fn,
                    heartbeat_interval=heartbeat_interval,
                    run_timeout=run_timeout,
                    cancels=cancels,
                    approval_timeout_seconds=approval_timeout_seconds,
                )
            )
    finally:
        # The run's slot of its model is free (whatever the outcome): the next waiting run gets it.
        if claim.model_limit is not None and claim.model_id is not None and enqueue is not None:
            try:
                await asyncio.shield(
                    model_slots.hand_on_slots(engine, claim.model_id, enqueue=enqueue)
                )
            except Exception:
                # The reaper hands free slots on too; the run's own outcome is written already.
                log.warning("run %s: could not hand its model slot on", claim.run_id, exc_info=True)


async def _execute(
    engine: AsyncEngine,
    runtime: Runtime,
    claim: Claim,
    *,
    now_fn: NowFn,
    heartbeat_interval: timedelta,
    run_timeout: timedelta,
    cancels: CancelWatcher | None = None,
    approval_timeout_seconds: float,
) -> RunState | None:
    run_id, ctx = claim.run_id, claim.context
    meter = TokenMeter()
    if ctx is None:
        return await fail(engine, run_id, error="the run's agent or model is gone", meter=meter)
    # Every line logged for this run from here on carries its agent (run_id is bound by the actor).
    structlog.contextvars.bind_contextvars(agent_id=ctx.agent_id)
    deadline = asyncio.get_running_loop().time() + run_timeout.total_seconds()
    # The transcript, and the cancel watcher that may cancel `work`.
    resumed = claim.resumed
    resume: Resume | None = None
    prefill: Prefill | None = None
    if resumed is None and ctx.retry_of is not None:
        # A retry: the failed run's steps were carried over with the request; it goes on after
        # them (the start wrote no opening step when there are some).
        prefill = await _prefill(engine, run_id)
        transcript = steps.StepRecorder(
            engine,
            run_id,
            now_fn=now_fn,
            first_step_written=prefill.next_index == 0,
            next_index=prefill.next_index,
        )
    elif resumed is None:
        transcript = steps.StepRecorder(engine, run_id, now_fn=now_fn, first_step_written=True)
    else:
        # The steps go on after the parked call's (the last one written before parking).
        transcript = steps.StepRecorder(
            engine, run_id, now_fn=now_fn, next_index=resumed.step_index + 1
        )
        resume = _resume(engine, run_id, resumed)
    work = asyncio.ensure_future(
        runtime.execute(
            ctx,
            now=now_fn(),
            on_tokens=meter.record,
            on_usage=meter.record_usage,
            deadline=deadline,
            transcript=transcript,
            resume=resume,
            prefill=prefill,
        )
    )
    if cancels is not None:
        cancels.watch(run_id, work)
    stop_beating = asyncio.Event()
    beat = asyncio.ensure_future(
        heartbeat(engine, run_id, interval=heartbeat_interval, meter=meter, stop=stop_beating)
    )
    try:
        done, _ = await asyncio.wait(
            {work, beat}, timeout=run_timeout.total_seconds(), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        # Worker shutdown: release the agent now rather than after STALE_AFTER, then let the
        # cancellation go on.
        await _cancel(work)
        await _stop(beat, stop_beating)
        await fail(engine, run_id, error=INTERRUPTED_ERROR, meter=meter, transcript=transcript)
        raise
    if work not in done:
        await _cancel(work)
        await _stop(beat, stop_beating)
        if beat in done:
            log.warning("run %s is no longer running (reaped?); abandoning it", run_id)
            return None
        return await fail(
            engine,
            run_id,
            error=f"the run exceeded its wall-clock limit of {run_timeout.total_seconds():g} s",
            meter=meter,
            transcript=transcript,
        )
    await _stop(beat, stop_beating)
    if work.cancelled():
        # cancelRun ended the run (the API wrote failed/cancelled); nothing to write.
        log.info("run %s was cancelled; its work stopped", run_id)
        return None
    try:
        outcome = work.result()
    except Exception as exc:
        log.exception("run %s: the runtime raised", run_id)
        return await fail(
            engine,
            run_id,
            # The text may name hosts or SQL: the owner reads the kind, the log the rest.
            error=f"internal error ({type(exc).__name__}; details in the worker log)",
            meter=meter,
            transcript=transcript,
        )
    if outcome.state == PARKED:
        # The worker lets go: no heartbeat (stopped above), and the in-flight place is freed as
        # this task ends. The decision or the expiry sends the run to a worker again.
        # A call for the owner to approve, or one whose owner has not connected their account
        # at the tool's source: the same timeout.
        park = (
            connection_waits.park_run
            if outcome.parked is not None and outcome.parked.waits_for == WAITS_CONNECTION
            else approvals.park_run
        )
        await park(
            engine, run_id, outcome, transcript=transcript, timeout_seconds=approval_timeout_seconds
        )
        return RunState.RUNNING
    return await finish(
        engine,
        run_id,
        state=RunState(outcome.state),
        reason=RunReason(outcome.reason) if outcome.reason else None,
        output=outcome.output,
        error=outcome.error,
        tokens=max(int(outcome.tokens_used), meter.total),
        prompt_tokens=max(outcome.prompt_tokens, meter.prompt),
        completion_tokens=max(outcome.completion_tokens, meter.completion),
        transcript=transcript,
    )


async def _prefill(engine: AsyncEngine, run_id: int) -> Prefill:
    """A retry run's conversation so far, from the steps it carried over."""
    async with engine.connect() as conn:
        rows = await steps_of_runs(conn, [run_id])
    return prefill_from_steps(run_id, [row for row in rows if row.reused])


def _resume(engine: AsyncEngine, run_id: int, resumed: Decided | Resolved) -> Resume:
    """How the loop goes on from a parked run's checkpoint: after its approval's decision, or
    after its connection wait (connected, or expired)."""
    if isinstance(resumed, Resolved):
        return Resume(
            checkpoint=resumed.checkpoint,
            decision=resumed.status,
            note=None,
            step_index=resumed.step_index,
            claim_call=functools.partial(
                resume_gate.claim_call, engine, run_id, resumed.wait_id, connection=True
            ),
            waits_for=WAITS_CONNECTION,
            source=resumed.source_name,
        )
    return Resume(
        checkpoint=resumed.checkpoint,
        decision=resumed.status,
        note=resumed.note,
        step_index=resumed.step_index,
        claim_call=functools.partial(resume_gate.claim_call, engine, run_id, resumed.approval_id),
        approval_id=resumed.approval_id,
    )


async def _stop(beat: asyncio.Future[None], stop: asyncio.Event) -> None:
    """End the heartbeat between two beats, never in the middle of its write: a statement
    cancelled mid-flight can leave its pooled connection unusable when the database is restarting
    at that moment."""
    stop.set()
    with contextlib.suppress(Exception):
        await beat


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
