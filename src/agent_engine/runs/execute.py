"""Executing one queued run: claim, heartbeat, runtime, finish — every write a compare-and-set.

A redelivered or duplicate message finds the run no longer `queued` and changes nothing. A run the
reaper failed while this worker was still busy is noticed by the next heartbeat (its CAS matches no
row): the work is abandoned and the late finish, being a CAS on `state = 'running'`, writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.gate import LOCK_MESSAGES, closed_lock
from agent_engine.domain.runs import HEARTBEAT_INTERVAL, RunReason, RunState
from agent_engine.runs import steps
from agent_engine.runs.budget import owners_over_budget
from agent_engine.runs.cancel import CancelWatcher
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
    + CONTEXT_COLUMNS
    + CONTEXT_FROM
    + " FOR UPDATE OF r"
)

# issue 16: the start also writes the run's first step (every run opens with a model call), so
# a one-call run's transcript costs no statement of its own (see runs/steps.py).
_START_SQL = text(
    "WITH started AS (UPDATE agent_runs SET state = 'running', started_at = :now,"
    " heartbeat_at = :now WHERE id = :run_id AND state = 'queued' RETURNING id) "
    + steps.FIRST_STEP_INSERT
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
    "UPDATE agent_runs SET heartbeat_at = :now, tokens_used = GREATEST(tokens_used, :tokens)"
    " WHERE id = :run_id AND state = 'running'"
)

# issue 16: the finish also writes the token split (NULL prompt: unknown, the database derives
# it from the steps) and the step end the transcript still holds (steps.FINISH_STEP_CTE).
_FINISH_SQL = text(
    steps.FINISH_STEP_CTE
    + "UPDATE agent_runs SET state = :state, reason = :reason, output = :output, error = :error,"
    " tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = COALESCE(:prompt, prompt_tokens),"
    " completion_tokens = COALESCE(GREATEST(tokens_used, :tokens) - :prompt, completion_tokens),"
    " finished_at = :now, heartbeat_at = :now"
    " WHERE id = :run_id AND state = 'running'"
)

INTERRUPTED_ERROR = "interrupted: the worker stopped before the run finished"

# A single-statement write (heartbeat, finish) retried once when its pooled connection turned out
# dead (database restart; the engine has no pre-ping): the pool is invalidated by then.
SINGLE_WRITE_ATTEMPTS = 2


class _TokenMeter:
    """Tokens spent so far, fed by the runtime after each model call."""

    def __init__(self) -> None:
        self.total = 0

    def record(self, tokens: int) -> None:
        # The runtime reports the running total; max() also tolerates a repeated report.
        self.total = max(self.total, int(tokens))


async def execute_run(
    engine: AsyncEngine,
    runtime: Runtime,
    run_id: int,
    *,
    now_fn: NowFn = utc_now,
    heartbeat_interval: timedelta = HEARTBEAT_INTERVAL,
    run_timeout: timedelta = RUN_TIMEOUT,
    cancels: CancelWatcher | None = None,
) -> RunState | None:
    """Execute a queued run. Returns the state this call left it in, None if it changed nothing.

    With `cancels`, a cancelRun stops the work wherever it is (the API already wrote the row)."""
    claimed, ctx = await _claim(engine, run_id, now=now_fn())
    if claimed is not RunState.RUNNING:
        return claimed
    meter = _TokenMeter()
    if ctx is None:
        return await _fail(
            engine, run_id, now=now_fn(), error="the run's agent or model is gone", tokens=0
        )
    # Every line logged for this run from here on carries its agent (run_id is bound by the actor).
    structlog.contextvars.bind_contextvars(agent_id=ctx.agent_id)
    # issue 16: the transcript, and the cancel watcher that may cancel `work`.
    transcript = steps.StepRecorder(engine, run_id, now_fn=now_fn, first_step_written=True)
    work = asyncio.ensure_future(
        runtime.execute(ctx, now=now_fn(), on_tokens=meter.record, transcript=transcript)
    )
    if cancels is not None:
        cancels.watch(run_id, work)
    beat = asyncio.ensure_future(
        _heartbeat(engine, run_id, interval=heartbeat_interval, now_fn=now_fn, meter=meter)
    )
    try:
        done, _ = await asyncio.wait(
            {work, beat}, timeout=run_timeout.total_seconds(), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        # Worker shutdown or the actor's time limit: release the agent now rather than after
        # STALE_AFTER, then let the cancellation go on.
        await _cancel(work, beat)
        await _fail(
            engine,
            run_id,
            now=now_fn(),
            error=INTERRUPTED_ERROR,
            tokens=meter.total,
            transcript=transcript,
        )
        raise
    if work not in done:
        await _cancel(work, beat)
        if beat in done:
            log.warning("run %s is no longer running (reaped?); abandoning it", run_id)
            return None
        return await _fail(
            engine,
            run_id,
            now=now_fn(),
            error=f"the run exceeded its wall-clock limit of {run_timeout.total_seconds():g} s",
            tokens=meter.total,
            transcript=transcript,
        )
    await _cancel(beat)
    if work.cancelled():
        # issue 16: cancelRun ended the run (the API wrote failed/cancelled); nothing to write.
        log.info("run %s was cancelled; its work stopped", run_id)
        return None
    try:
        outcome = work.result()
    except Exception as exc:
        log.exception("run %s: the runtime raised", run_id)
        return await _fail(
            engine,
            run_id,
            now=now_fn(),
            error=f"{type(exc).__name__}: {exc}",
            tokens=meter.total,
            transcript=transcript,
        )
    return await _finish(
        engine,
        run_id,
        now=now_fn(),
        state=RunState(outcome.state),
        reason=RunReason(outcome.reason) if outcome.reason else None,
        output=outcome.output,
        error=outcome.error,
        tokens=max(int(outcome.tokens_used), meter.total),
        prompt_tokens=outcome.prompt_tokens,
        transcript=transcript,
    )


async def _claim(
    engine: AsyncEngine, run_id: int, *, now: datetime
) -> tuple[RunState | None, RunContext | None]:
    """queued → running, or → skipped (budget spent) / failed (gate closed since the request).

    A run set running comes with its context, from the same locking read.
    """
    async with engine.begin() as conn:
        # The row lock serialises duplicate messages: the second one reads the new state.
        row = (await conn.execute(_CLAIM_READ_SQL, {"run_id": run_id})).one_or_none()
        if row is None or row.state != RunState.QUEUED:
            return None, None
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
            return RunState.FAILED, None
        platform = PlatformSettings.from_rows(row.platform or {})
        if await owners_over_budget(conn, [row.owner_id], now=now, platform=platform):
            await conn.execute(
                _SKIP_AT_CLAIM_SQL,
                {"run_id": run_id, "now": now, "reason": str(RunReason.BUDGET_EXCEEDED)},
            )
            return RunState.SKIPPED, None
        await conn.execute(_START_SQL, {"run_id": run_id, "now": now, "model": row.model})
        return RunState.RUNNING, run_context_from_row(row, platform=platform)


async def _heartbeat(
    engine: AsyncEngine,
    run_id: int,
    *,
    interval: timedelta,
    now_fn: NowFn,
    meter: _TokenMeter,
) -> None:
    """Beat until the run is no longer ours; returns only then (the caller abandons the work)."""
    while True:
        await asyncio.sleep(interval.total_seconds())
        try:
            rowcount = await _write_one(
                engine, _HEARTBEAT_SQL, {"run_id": run_id, "now": now_fn(), "tokens": meter.total}
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
    now: datetime,
    state: RunState,
    reason: RunReason | None,
    tokens: int,
    output: str | None = None,
    error: str | None = None,
    prompt_tokens: int | None = None,
    transcript: steps.StepRecorder | None = None,
) -> RunState | None:
    rowcount = await _write_one(
        engine,
        _FINISH_SQL,
        {
            "run_id": run_id,
            "now": now,
            "state": str(state),
            "reason": str(reason) if reason else None,
            "output": output,
            "error": error,
            "tokens": tokens,
            "prompt": prompt_tokens,
            **(transcript.take_pending() if transcript is not None else steps.NO_PENDING),
        },
    )
    if rowcount == 0:
        log.warning("run %s was no longer running at its finish; nothing written", run_id)
        return None
    log.info(
        "run %s finished: %s%s, %d tokens", run_id, state, f"/{reason}" if reason else "", tokens
    )
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
    now: datetime,
    error: str,
    tokens: int,
    transcript: steps.StepRecorder | None = None,
) -> RunState | None:
    """running → failed/error with the detail, like every other finish a compare-and-set."""
    return await _finish(
        engine,
        run_id,
        now=now,
        state=RunState.FAILED,
        reason=RunReason.ERROR,
        error=error,
        tokens=tokens,
        transcript=transcript,
    )


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
