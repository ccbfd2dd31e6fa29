"""A running run's writes: its heartbeat and its finish, each a compare-and-set on
`state = 'running'`.

A run the reaper failed while its worker was still busy is noticed by the next heartbeat (its CAS
matches no row): the work is abandoned and the late finish writes nothing. Both are written on
the database's clock (`now()`), the clock the reaper reads, so a worker whose own clock is behind
cannot get its live runs reaped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Row, TextClause
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import direct
from agent_engine.db import runs as runs_sql
from agent_engine.db.lane import autocommit
from agent_engine.db.run_steps import NO_PENDING
from agent_engine.domain.runs import RunReason, RunState
from agent_engine.domain.storable import storable_optional
from agent_engine.runs import steps
from agent_engine.runs.alerts import record_alerts_after_finish

log = logging.getLogger(__name__)

T = TypeVar("T")

INTERRUPTED_ERROR = "interrupted: the worker stopped before the run finished"

# A single-statement write (heartbeat, finish) retried once when its pooled connection turned out
# dead (database restart; the engine has no pre-ping): the pool is invalidated by then.
SINGLE_WRITE_ATTEMPTS = 2
# A finish that cannot reach the database is tried again for this long (a restart takes seconds);
# after that the run stays `running` and the reaper fails it as stale — never doubled.
FINISH_RETRY_SECONDS = 60.0
FINISH_RETRY_FIRST_DELAY_SECONDS = 0.5
FINISH_RETRY_MAX_DELAY_SECONDS = 8.0


class TokenMeter:
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


async def heartbeat(
    engine: AsyncEngine,
    run_id: int,
    *,
    interval: timedelta,
    meter: TokenMeter,
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
                runs_sql.HEARTBEAT,
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


async def finish(
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
        # A character the database refuses would make the finish unwritable, and the run would
        # end STALE; the output is the model's (`domain/storable.py`).
        "output": storable_optional(output),
        "error": storable_optional(error),
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        **(transcript.take_pending() if transcript is not None else NO_PENDING),
    }
    delay = FINISH_RETRY_FIRST_DELAY_SECONDS
    give_up_at = asyncio.get_running_loop().time() + FINISH_RETRY_SECONDS
    while True:
        try:
            finished = await _write_one_returning(engine, runs_sql.FINISH, params)
            break
        except (DBAPIError, OSError):
            # The database is unreachable: try again for a while. A finish that lands after the
            # reaper failed the run matches no row; one that never lands leaves it to the reaper.
            if asyncio.get_running_loop().time() + delay > give_up_at:
                raise
            log.warning("run %s: could not write its finish; retrying", run_id, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, FINISH_RETRY_MAX_DELAY_SECONDS)
    if finished is None:
        log.warning("run %s was no longer running at its finish; nothing written", run_id)
        return None
    log.info(
        "run %s finished: %s%s, %d tokens", run_id, state, f"/{reason}" if reason else "", tokens
    )
    # --- spend at finish: the one call of the finishing path ----------------------------------
    # The finish above fixed the run's cost (a trigger). Now the owner's budget thresholds it
    # took the week across are recorded, once each (see runs/alerts.py for why this is race-safe
    # after the commit). Never raises.
    await record_alerts_after_finish(
        engine,
        run_id,
        now=datetime.now(UTC),
        owner_id=finished.owner_id,
        platform=finished.platform,
        week_start=finished.week_start,
        week_tokens=finished.week_tokens,
    )
    return state


async def _write_one(engine: AsyncEngine, statement: TextClause, params: dict[str, Any]) -> int:
    """One compare-and-set UPDATE in autocommit: the rows it changed."""

    async def write(conn: AsyncConnection) -> int:
        return int((await conn.execute(statement, params)).rowcount)

    return await _autocommit(engine, write)


async def _write_one_returning(
    engine: AsyncEngine, statement: TextClause, params: dict[str, Any]
) -> Row[Any] | direct.Record | None:
    """One compare-and-set with RETURNING in autocommit: the row written, None if none (through
    asyncpg directly, `db/direct.py`: the finish is on every run's path)."""

    async def write(conn: AsyncConnection) -> Row[Any] | direct.Record | None:
        return await direct.fetch_one(conn, statement, params)

    return await _autocommit(engine, write)


async def _autocommit(engine: AsyncEngine, write: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """One statement in autocommit (atomic alone: no BEGIN/COMMIT round trips), `write` on the
    connection.

    Retried once on a dead connection; a retry after a lost acknowledgement matches no row.
    """
    for attempt in range(1, SINGLE_WRITE_ATTEMPTS + 1):
        try:
            async with autocommit(engine) as conn:
                return await write(conn)
        except DBAPIError as exc:
            if not exc.connection_invalidated or attempt == SINGLE_WRITE_ATTEMPTS:
                raise
            log.warning("a pooled connection was dead (database restart?); retrying once")
    raise AssertionError("unreachable")


async def fail(
    engine: AsyncEngine,
    run_id: int,
    *,
    error: str,
    meter: TokenMeter,
    transcript: steps.StepRecorder | None = None,
) -> RunState | None:
    """running → failed/error with the detail, like every other finish a compare-and-set."""
    return await finish(
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
