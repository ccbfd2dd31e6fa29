"""`retryRun`: a FAILED run (reason ERROR or STALE) continues as a new run, trigger RETRY.

The request passes the start gate like a manual start (`runs/request.py`): a closed lock refuses
(nothing written), a spent budget (the owner's, then the agent's own cap) or an unfinished run of
the agent journals a SKIPPED row. A QUEUED retry names the failed run (`retry_of`, UNIQUE: the
database settles two retries of one run, the later one is refused) and gets, in the same
transaction, the failed run's transcript as its first steps, each `reused`:

- a model call that answered (finished, no error) is copied: the worker rebuilds the conversation
  from it and does not call the model again for it;
- a tool call with a result (including a refusal the model saw) is copied: it is not made again,
  a WRITE call least of all;
- a tool call that started and has no result (the run died during it, its server could not be
  reached, it timed out) is copied with the result "outcome unknown, not repeated": the model is
  told so, the call is never made again;
- a WRITE call that only waited for its owner's approval and was never made (its approval not
  approved, or approved but not yet claimed) is left out: the retry's model asks again and the call
  waits for the owner again, as any WRITE call does;
- the transcript stops before the first model call that failed (it is made again).

Copied steps keep their tokens for the transcript, but count nowhere (e0012_runs_recover): the
retry's `tokensUsed` is its new calls'. A SKIPPED retry names no failed run, so the run can be
retried again once the gate opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import retries as retries_db
from agent_engine.db import runs as runs_sql
from agent_engine.db.platform import load_platform_settings
from agent_engine.db.run_steps import StepRow, steps_of_runs
from agent_engine.domain.runs import RunReason, RunState, RunStepKind, RunTrigger
from agent_engine.runs.budget import agents_over_cap, owners_over_budget
from agent_engine.runs.journal import insert_requested_runs
from agent_engine.runs.request import AgentNotFound, Enqueue, _refuse_closed_gate, send_after_commit

log = logging.getLogger(__name__)

# The reasons a failed run may be retried for: the run broke, not its agent's rules.
RETRYABLE_REASONS = frozenset({RunReason.ERROR, RunReason.STALE})

# What the model hears (and the owner reads) for a call that started and has no result.
UNKNOWN_OUTCOME = (
    "error: outcome unknown -- the earlier run stopped while this call was in progress, so it may"
    " or may not have taken effect; it was not repeated. Check its effect before relying on it."
)
UNKNOWN_OUTCOME_ERROR = "outcome unknown (the earlier run stopped during this call); not repeated"

_UNIQUE_VIOLATION = "23505"


class NotRetryable(Exception):
    """The run is not FAILED with reason ERROR or STALE (the API answers BAD_USER_INPUT)."""


class AlreadyRetried(Exception):
    """The run has a retry already (the API answers CONFLICT)."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"run {run_id} was retried already; a run is retried at most once")


@dataclass(frozen=True, slots=True)
class Failed:
    """The failed run a retry continues."""

    id: int
    agent_id: int
    state: str
    reason: str | None


def check_retryable(run_id: int, state: str, reason: str | None) -> None:
    """Raise `NotRetryable` naming the run's state or reason unless it is FAILED / ERROR or
    STALE."""
    if state != RunState.FAILED:
        raise NotRetryable(
            f"run {run_id} is {state.upper()}; only a FAILED run (reason ERROR or STALE) can be"
            " retried"
        )
    if reason not in RETRYABLE_REASONS:
        shown = (reason or "none").upper()
        raise NotRetryable(
            f"run {run_id} failed with reason {shown}; only reasons ERROR and STALE can be"
            " retried (the agent's own rules ended it, a retry would end the same way)"
        )


async def retry_run(
    engine: AsyncEngine,
    run_id: int,
    *,
    now: datetime,
    enqueue: Enqueue,
    send_wait_seconds: float | None = None,
) -> runs_sql.RunRow:
    """The retry's journal row (queued or skipped). Raises `NotRetryable`, `AlreadyRetried`,
    `AgentNotFound` or `AgentNotStartable` (nothing written then)."""
    try:
        async with engine.begin() as conn:
            row = await _request(conn, run_id, now=now)
    except IntegrityError as exc:
        # Two retries of one run at once: the unique index on retry_of lets one commit.
        if getattr(exc.orig, "sqlstate", None) == _UNIQUE_VIOLATION:
            raise AlreadyRetried(run_id) from exc
        raise
    if row.state == RunState.QUEUED:
        try:
            await asyncio.wait_for(send_after_commit(enqueue, [row.id]), send_wait_seconds)
        except TimeoutError:
            log.warning("the broker did not take retry run %s's message; the reaper re-sends it")
    return row


async def _request(conn: AsyncConnection, run_id: int, *, now: datetime) -> runs_sql.RunRow:
    found = await retries_db.lock_failed_run(conn, run_id)
    if found is None:
        raise LookupError(run_id)
    check_retryable(run_id, found.state, found.reason)
    if await retries_db.was_retried(conn, run_id):
        raise AlreadyRetried(run_id)
    agent_id = int(found.agent_id)
    gate = _refuse_closed_gate(
        agent_id,
        (await conn.execute(runs_sql.AGENT_GATE, {"agent_id": agent_id})).one_or_none(),
    )
    platform = await load_platform_settings(conn)
    spent = await owners_over_budget(conn, [gate.user_id], now=now, platform=platform)
    capped = (
        set()
        if spent or gate.weekly_token_cap is None
        else await agents_over_cap(conn, [agent_id], now=now, platform=platform)
    )
    rows = await insert_requested_runs(
        conn,
        [agent_id],
        trigger=RunTrigger.RETRY,
        now=None,
        budget_spent=[agent_id] if spent else [],
        agent_cap_spent=capped,
        retry_of=run_id,
    )
    row = rows[agent_id]
    if row.state == RunState.QUEUED:
        await _carry_over(conn, failed_id=run_id, retry_id=row.id)
    return row


async def _carry_over(conn: AsyncConnection, *, failed_id: int, retry_id: int) -> int:
    """Copy the failed run's transcript into the retry as reused steps; returns how many."""
    steps = await steps_of_runs(conn, [failed_id])
    made = await retries_db.calls_made(conn, failed_id)
    kept = carried_steps(steps, made)
    await retries_db.copy_steps(
        conn,
        [
            {
                "run_id": retry_id,
                "index": index,
                "failed_id": failed_id,
                "source": step.source,
                "output": step.output,
                "error": step.error,
            }
            for index, step in enumerate(kept)
        ],
    )
    return len(kept)


@dataclass(frozen=True, slots=True)
class Carried:
    """A step as the retry carries it over (the failed run's, or its unknown-outcome form)."""

    source: int  # its index in the failed run
    kind: str
    name: str
    input: object
    output: str | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: datetime
    finished_at: datetime | None


def carried_steps(steps: Sequence[StepRow], calls_made: dict[int, bool]) -> list[Carried]:
    """The failed run's steps a retry keeps, in order (the rules in the module's docstring).
    `calls_made`: step index → whether the approved WRITE call of that step was started."""
    kept: list[Carried] = []
    for step in steps:
        if step.kind == RunStepKind.MODEL_CALL:
            if step.error is not None or step.finished_at is None or step.output is None:
                break  # the call that failed (or never ended) is made again; nothing after it
            kept.append(_carried(step, step.output, None))
            continue
        if not kept:
            continue  # a tool call before any model call cannot be placed in a conversation
        if step.output is not None:
            kept.append(_carried(step, step.output, step.error))
        elif calls_made.get(step.index) is False:
            continue  # waited for approval, never made: the retry asks again
        else:
            kept.append(_carried(step, UNKNOWN_OUTCOME, UNKNOWN_OUTCOME_ERROR))
    return kept


def _carried(step: StepRow, output: str | None, error: str | None) -> Carried:
    return Carried(
        source=step.index,
        kind=step.kind,
        name=step.name,
        input=step.input,
        output=output,
        error=error,
        prompt_tokens=step.prompt_tokens,
        completion_tokens=step.completion_tokens,
        started_at=step.started_at,
        finished_at=step.finished_at,
    )


__all__ = [
    "AgentNotFound",
    "AlreadyRetried",
    "NotRetryable",
    "carried_steps",
    "check_retryable",
    "retry_run",
]
