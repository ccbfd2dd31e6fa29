"""Executing one queued run: claim, execute (heartbeat + runtime), finish — every write a
compare-and-set.

`claim_run` moves the run from `queued` (to `running`, or ends it at the claim, or leaves it
waiting for a slot of its model); `execute_claimed` runs the agent loop beside a heartbeat and
finishes the run; `execute_run` is the two in a row. A worker claims in its actor and executes in
a task of its in-flight set (`workers/inflight.py`).

A redelivered or duplicate message finds the run no longer `queued` and changes nothing. A run the
reaper failed while this worker was still busy is noticed by the next heartbeat (its CAS matches no
row): the work is abandoned and the late finish, being a CAS on `state = 'running'`, writes nothing.
A run's start, heartbeats and finish are written on the database's clock (`now()`), the clock
the reaper reads, so a worker whose own clock is behind cannot get its live runs reaped (and
`started_at <= heartbeat_at <= finished_at` holds whatever the worker's clock says).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.gate import LOCK_MESSAGES, closed_lock
from agent_engine.domain.runs import HEARTBEAT_INTERVAL, RunReason, RunState
from agent_engine.runs import model_slots, steps
from agent_engine.runs.alerts import record_alerts_after_finish
from agent_engine.runs.budget import owners_over_budget
from agent_engine.runs.cancel import CancelWatcher
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.context import (
    CONTEXT_COLUMNS,
    CONTEXT_FROM,
    RunContext,
    run_context_from_row,
)
from agent_engine.runtime.loop import Runtime

log = logging.getLogger(__name__)

# The run's own wall-clock limit; the Dramatiq actor's time limit sits above it.
RUN_TIMEOUT = timedelta(minutes=10)

NowFn = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


# With the platform settings and the run's whole context: the claim is one checkout and one read
# (round trips per run are most of the worker's cost against a fast model).
_CLAIM_READ_SQL = text(
    "SELECT r.state, a.enabled, a.admin_paused, a.model_id IS NOT NULL AS has_model,"
    " a.model_id AS agent_model_id, r.model_id AS run_model_id, m.max_concurrent_runs,"
    + CONTEXT_COLUMNS
    + CONTEXT_FROM
    + " FOR UPDATE OF r"
)

# The start also writes the run's first step (every run opens with a model call), so a one-call
# run's transcript costs no statement of its own (see runs/steps.py).
_START_SQL = text(
    "WITH started AS (UPDATE agent_runs SET state = 'running', started_at = now(),"
    " heartbeat_at = now(), model_id = :model_id"
    " WHERE id = :run_id AND state = 'queued' RETURNING id) " + steps.FIRST_STEP_INSERT
)

# A run left waiting joins its model's line (the owner may have switched models since the request).
_REQUEUE_FOR_MODEL_SQL = text(
    "UPDATE agent_runs SET model_id = :model_id WHERE id = :run_id AND state = 'queued'"
)

_SKIP_AT_CLAIM_SQL = text(
    "UPDATE agent_runs SET state = 'skipped', reason = :reason, tokens_used = 0,"
    " finished_at = :now"
    " WHERE id = :run_id AND state = 'queued'"
)

_FAIL_AT_CLAIM_SQL = text(
    "UPDATE agent_runs SET state = 'failed', reason = :reason, error = :error, finished_at = :now"
    " WHERE id = :run_id AND state = 'queued'"
)

_HEARTBEAT_SQL = text(
    "UPDATE agent_runs SET heartbeat_at = now(), tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = GREATEST(prompt_tokens, :prompt_tokens),"
    " completion_tokens = GREATEST(completion_tokens, :completion_tokens)"
    " WHERE id = :run_id AND state = 'running'"
)

# The finish also fixes the run's cost (a trigger prices its tokens at the model's prices now),
# writes the step end the transcript still holds (steps.FINISH_STEP_CTE), and the delivery
# outbox rows (a trigger, delivery/outbox.py).
_FINISH_SQL = text(
    steps.FINISH_STEP_CTE
    + "UPDATE agent_runs SET state = :state, reason = :reason, output = :output, error = :error,"
    " tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = GREATEST(prompt_tokens, :prompt_tokens),"
    " completion_tokens = GREATEST(completion_tokens, :completion_tokens),"
    " finished_at = now(), heartbeat_at = now()"
    " WHERE id = :run_id AND state = 'running'"
)

INTERRUPTED_ERROR = "interrupted: the worker stopped before the run finished"

# A single-statement write (heartbeat, finish) retried once when its pooled connection turned out
# dead (database restart; the engine has no pre-ping): the pool is invalidated by then.
SINGLE_WRITE_ATTEMPTS = 2
# A finish that cannot reach the database is tried again for this long (a restart takes seconds);
# after that the run stays `running` and the reaper fails it as stale — never doubled.
FINISH_RETRY_SECONDS = 60.0
FINISH_RETRY_FIRST_DELAY_SECONDS = 0.5
FINISH_RETRY_MAX_DELAY_SECONDS = 8.0


@dataclass(frozen=True)
class Claim:
    """What the claim did with a queued run.

    `state`: RUNNING — ours to execute (`context` set); QUEUED — left waiting for a slot of its
    model; SKIPPED / FAILED — ended at the claim; None — not queued any more (a duplicate message).
    """

    run_id: int
    state: RunState | None
    context: RunContext | None = None
    model_id: int | None = None
    # The model's concurrency limit when claimed: a limited model's finish hands its slot on.
    model_limit: int | None = None


class _TokenMeter:
    """Tokens spent so far, fed by the runtime after each model call."""

    def __init__(self) -> None:
        self.total = 0
        self.prompt = 0
        self.completion = 0

    def record(self, tokens: int) -> None:
        # The runtime reports the running total; max() also tolerates a repeated report.
        self.total = max(self.total, int(tokens))

    def record_usage(self, prompt: int, completion: int) -> None:
        self.prompt = max(self.prompt, int(prompt))
        self.completion = max(self.completion, int(completion))


async def execute_run(
    engine: AsyncEngine,
    runtime: Runtime,
    run_id: int,
    *,
    now_fn: NowFn = utc_now,
    heartbeat_interval: timedelta = HEARTBEAT_INTERVAL,
    run_timeout: timedelta = RUN_TIMEOUT,
    enqueue: Enqueue | None = None,
) -> RunState | None:
    """Claim and execute a queued run. Returns the state this call left it in (QUEUED: waiting
    for a slot of its model), None if it changed nothing."""
    claim = await claim_run(engine, run_id, now=now_fn(), enqueue=enqueue)
    if claim.state is not RunState.RUNNING:
        return claim.state
    return await execute_claimed(
        engine,
        runtime,
        claim,
        now_fn=now_fn,
        heartbeat_interval=heartbeat_interval,
        run_timeout=run_timeout,
        enqueue=enqueue,
    )


async def claim_run(
    engine: AsyncEngine, run_id: int, *, now: datetime, enqueue: Enqueue | None = None
) -> Claim:
    """queued → running, or → skipped (budget spent) / failed (gate closed since the request),
    or left queued when its model has no free slot (`model_slots`).

    A run set running comes with its context, from the same locking read. `enqueue` hands a slot
    on when a run of a limited model ended here without running (others may wait behind it).
    """
    claim = await _claim(engine, run_id, now=now)
    if (
        claim.state in (RunState.SKIPPED, RunState.FAILED)
        and claim.model_limit is not None
        and claim.model_id is not None
        and enqueue is not None
    ):
        await model_slots.hand_on_slots(engine, claim.model_id, enqueue=enqueue)
    return claim


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
) -> RunState | None:
    """Run a claimed run's agent loop beside its heartbeat, then finish it (a compare-and-set).

    Returns the state written, None when the run was no longer ours (reaped or cancelled
    meanwhile). With `cancels`, a cancelRun stops the work wherever it is (the API already wrote
    the row).
    """
    try:
        return await _execute(
            engine,
            runtime,
            claim,
            now_fn=now_fn,
            heartbeat_interval=heartbeat_interval,
            run_timeout=run_timeout,
            cancels=cancels,
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
) -> RunState | None:
    run_id, ctx = claim.run_id, claim.context
    meter = _TokenMeter()
    if ctx is None:
        return await _fail(engine, run_id, error="the run's agent or model is gone", meter=meter)
    # Every line logged for this run from here on carries its agent (run_id is bound by the actor).
    structlog.contextvars.bind_contextvars(agent_id=ctx.agent_id)
    deadline = asyncio.get_running_loop().time() + run_timeout.total_seconds()
    # The transcript, and the cancel watcher that may cancel `work`.
    transcript = steps.StepRecorder(engine, run_id, now_fn=now_fn, first_step_written=True)
    work = asyncio.ensure_future(
        runtime.execute(
            ctx,
            now=now_fn(),
            on_tokens=meter.record,
            on_usage=meter.record_usage,
            deadline=deadline,
            transcript=transcript,
        )
    )
    if cancels is not None:
        cancels.watch(run_id, work)
    stop_beating = asyncio.Event()
    beat = asyncio.ensure_future(
        _heartbeat(engine, run_id, interval=heartbeat_interval, meter=meter, stop=stop_beating)
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
        await _fail(engine, run_id, error=INTERRUPTED_ERROR, meter=meter, transcript=transcript)
        raise
    if work not in done:
        await _cancel(work)
        await _stop(beat, stop_beating)
        if beat in done:
            log.warning("run %s is no longer running (reaped?); abandoning it", run_id)
            return None
        return await _fail(
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
        return await _fail(
            engine,
            run_id,
            error=f"{type(exc).__name__}: {exc}",
            meter=meter,
            transcript=transcript,
        )
    return await _finish(
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


async def _claim(engine: AsyncEngine, run_id: int, *, now: datetime) -> Claim:
    async with engine.begin() as conn:
        # The row lock serialises duplicate messages: the second one reads the new state.
        row = (await conn.execute(_CLAIM_READ_SQL, {"run_id": run_id})).one_or_none()
        if row is None or row.state != RunState.QUEUED:
            return Claim(run_id, None)
        model_id = row.agent_model_id
        limit = row.max_concurrent_runs
        lock = closed_lock(
            enabled=row.enabled, admin_paused=row.admin_paused, has_model=row.has_model
        )
        if lock is not None:
            await conn.execute(
                _FAIL_AT_CLAIM_SQL,
                {
                    "run_id": run_id,
                    "now": now,
                    "reason": str(RunReason.ERROR),
                    "error": f"the agent cannot start ({lock.value}): {LOCK_MESSAGES[lock]}",
                },
            )
            return Claim(run_id, RunState.FAILED, model_id=row.run_model_id, model_limit=limit)
        platform = PlatformSettings.from_rows(row.platform or {})
        if await owners_over_budget(conn, [row.owner_id], now=now, platform=platform):
            await conn.execute(
                _SKIP_AT_CLAIM_SQL,
                {"run_id": run_id, "now": now, "reason": str(RunReason.BUDGET_EXCEEDED)},
            )
            return Claim(run_id, RunState.SKIPPED, model_id=row.run_model_id, model_limit=limit)
        admission = await model_slots.admit(conn, model_id=model_id, run_id=run_id, limit=limit)
        if not admission.admitted:
            if row.run_model_id != model_id:
                await conn.execute(_REQUEUE_FOR_MODEL_SQL, {"run_id": run_id, "model_id": model_id})
            log.info(
                "run %s waits for a slot of model %s (%d running, %d queued ahead, limit %d)",
                run_id,
                model_id,
                admission.running,
                admission.ahead,
                admission.limit,
            )
            return Claim(run_id, RunState.QUEUED, model_id=model_id, model_limit=admission.limit)
        await conn.execute(
            _START_SQL,
            {"run_id": run_id, "model_id": model_id, "model": row.model, "now": utc_now()},
        )
        return Claim(
            run_id,
            RunState.RUNNING,
            context=run_context_from_row(row, platform=platform),
            model_id=model_id,
            model_limit=admission.limit,
        )


async def _heartbeat(
    engine: AsyncEngine,
    run_id: int,
    *,
    interval: timedelta,
    meter: _TokenMeter,
    stop: asyncio.Event,
) -> None:
    """Beat until the run is no longer ours (the caller abandons the work) or `stop` is set."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval.total_seconds())
            return
        except TimeoutError:
            pass
        try:
            rowcount = await _write_one(
                engine,
                _HEARTBEAT_SQL,
                {
                    "run_id": run_id,
                    "tokens": meter.total,
                    "prompt_tokens": meter.prompt,
                    "completion_tokens": meter.completion,
                },
            )
        except Exception:
            # A database blip must not kill the run; STALE_AFTER spans several beats.
            log.warning("run %s: heartbeat failed", run_id, exc_info=True)
            continue
        if rowcount == 0:
            return


async def _finish(
    engine: AsyncEngine,
    run_id: int,
    *,
    state: RunState,
    reason: RunReason | None,
    tokens: int,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    output: str | None = None,
    error: str | None = None,
    transcript: steps.StepRecorder | None = None,
) -> RunState | None:
    params = {
        "run_id": run_id,
        "state": str(state),
        "reason": str(reason) if reason else None,
        "output": output,
        "error": error,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        **(transcript.take_pending() if transcript is not None else steps.NO_PENDING),
    }
    delay = FINISH_RETRY_FIRST_DELAY_SECONDS
    give_up_at = asyncio.get_running_loop().time() + FINISH_RETRY_SECONDS
    while True:
        try:
            rowcount = await _write_one(engine, _FINISH_SQL, params)
            break
        except (DBAPIError, OSError):
            # The database is unreachable: try again for a while. A finish that lands after the
            # reaper failed the run matches no row; one that never lands leaves it to the reaper.
            if asyncio.get_running_loop().time() + delay > give_up_at:
                raise
            log.warning("run %s: could not write its finish; retrying", run_id, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, FINISH_RETRY_MAX_DELAY_SECONDS)
    if rowcount == 0:
        log.warning("run %s was no longer running at its finish; nothing written", run_id)
        return None
    log.info(
        "run %s finished: %s%s, %d tokens", run_id, state, f"/{reason}" if reason else "", tokens
    )
    # --- spend at finish (issue 17) -- the one call of the finishing path ---------------------
    # The finish above fixed the run's cost (a trigger). Now the owner's budget thresholds it
    # took the week across are recorded, once each (see runs/alerts.py for why this is race-safe
    # after the commit). Never raises.
    await record_alerts_after_finish(engine, run_id, now=utc_now())
    return state


async def _write_one(engine: AsyncEngine, statement: TextClause, params: dict[str, Any]) -> int:
    """One compare-and-set UPDATE in autocommit (atomic alone: no BEGIN/COMMIT round trips).

    Retried once on a dead connection; a retry after a lost acknowledgement matches no row.
    """
    for attempt in range(1, SINGLE_WRITE_ATTEMPTS + 1):
        try:
            async with engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                result = await conn.execute(statement, params)
                return int(result.rowcount)
        except DBAPIError as exc:
            if not exc.connection_invalidated or attempt == SINGLE_WRITE_ATTEMPTS:
                raise
            log.warning("a pooled connection was dead (database restart?); retrying once")
    raise AssertionError("unreachable")


async def _fail(
    engine: AsyncEngine,
    run_id: int,
    *,
    error: str,
    meter: _TokenMeter,
    transcript: steps.StepRecorder | None = None,
) -> RunState | None:
    """running → failed/error with the detail, like every other finish a compare-and-set."""
    return await _finish(
        engine,
        run_id,
        state=RunState.FAILED,
        reason=RunReason.ERROR,
        error=error,
        tokens=meter.total,
        prompt_tokens=meter.prompt,
        completion_tokens=meter.completion,
        transcript=transcript,
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
