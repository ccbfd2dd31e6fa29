"""Claiming a queued run: queued → running (with its context), or ended at the claim, or left
waiting for a slot of its model.

The claim is one transaction around one locking read of the run with its agent, model, context
and the platform settings: a redelivered or duplicate message finds the run no longer `queued`
and changes nothing. The common case — gate open, no model limit, budget left — is first tried as
one statement (`db.runs.CLAIM_AT_ONCE`, a compare-and-set with the gate and the budget sum in its
WHERE): one round trip instead of five. It needs the platform settings to compute the budget week
and the cap, so it uses the ones this process saw last (`runs/seen_platform.py`), and the statement
itself checks that they are still the stored ones; when they are not (or the run is not a plain
start), it writes nothing and the transaction below decides, as before.

The same transaction takes back a parked run whose approval was decided (the decision's message):
it resumes only while its agent may still run (`resume_gate.refuse_resume` ends it otherwise) and
when the model it started on has a free slot (`model_slots.admit_resume`), else it stays parked
with its decision, and the next slot handed on is its.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import approvals as approvals_db
from agent_engine.db import connection_waits as waits_db
from agent_engine.db import direct
from agent_engine.db import runs as runs_sql
from agent_engine.db.approvals import Decided
from agent_engine.db.connection_waits import Resolved
from agent_engine.db.lane import autocommit
from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.gate import LOCK_MESSAGES, closed_lock
from agent_engine.domain.runs import RunReason, RunState
from agent_engine.observability.genai_spans import StartedSpan
from agent_engine.runs import model_slots, resume_gate, seen_platform
from agent_engine.runs.budget import agents_over_cap, owners_over_budget
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.context import RunContext, run_context_from_row

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Claim:
    """What the claim did with a queued run.

    `state`: RUNNING — ours to execute (`context` set; `resumed` when a parked run goes on);
    QUEUED — left waiting for a slot of its model (a queued run; or a parked run whose decision
    waits to resume: it stays parked); SKIPPED / FAILED — ended at the claim; None — nothing to
    claim (a duplicate message).
    """

    run_id: int
    state: RunState | None
    context: RunContext | None = None
    model_id: int | None = None
    # The model's concurrency limit when claimed: a limited model's finish hands its slot on.
    model_limit: int | None = None
    # A parked run taken back after its owner's decision (or the approval's expiry), or after
    # its owner connected the account it waited for (or the wait's expiry).
    resumed: Decided | Resolved | None = None
    # Tracing on: the run's span, started before the claim; its traceparent was saved by the
    # start (`runs/run_trace.py` carries on with it; a claim that started nothing drops it).
    span: StartedSpan | None = None


async def claim_run(
    engine: AsyncEngine,
    run_id: int,
    *,
    now: datetime,
    enqueue: Enqueue | None = None,
    span: StartedSpan | None = None,
) -> Claim:
    """queued → running, or → skipped (budget spent) / failed (gate closed since the request),
    or left queued when its model has no free slot (`model_slots`).

    A run set running comes with its context, from the same locking read. `enqueue` hands a slot
    on when a run of a limited model ended here without running (others may wait behind it).
    `span` (tracing on): the run's span, whose traceparent a fresh start saves on the run.
    """
    claim = await _claim(engine, run_id, now=now, trace_parent=span.traceparent if span else None)
    if span is not None and claim.state is RunState.RUNNING and claim.resumed is None:
        claim = replace(claim, span=span)
    if (
        claim.state in (RunState.SKIPPED, RunState.FAILED)
        and claim.model_limit is not None
        and claim.model_id is not None
        and enqueue is not None
    ):
        await model_slots.hand_on_slots(engine, claim.model_id, enqueue=enqueue)
    return claim


async def _claim_at_once(
    engine: AsyncEngine, run_id: int, *, now: datetime, trace_parent: str | None
) -> Claim | None:
    """The plain start in one statement; None when the transaction must decide."""
    seen = seen_platform.seen()
    if seen is None:
        return None
    async with autocommit(engine) as conn:
        row = await direct.fetch_one(
            conn,
            runs_sql.CLAIM_AT_ONCE,
            {
                "run_id": run_id,
                **seen_platform.budget_params(seen, now),
                "now": utc_now(),
                "trace_parent": trace_parent,
            },
        )
    if row is None:
        return Claim(run_id, None)
    if not row.started:
        return None
    return Claim(
        run_id,
        RunState.RUNNING,
        context=run_context_from_row(row, platform=seen.settings),
        model_id=row.agent_model_id,
        model_limit=None,
    )


async def _claim(
    engine: AsyncEngine, run_id: int, *, now: datetime, trace_parent: str | None
) -> Claim:
    at_once = await _claim_at_once(engine, run_id, now=now, trace_parent=trace_parent)
    if at_once is not None:
        return at_once
    async with engine.begin() as conn:
        # The row lock serialises duplicate messages: the second one reads the new state.
        row = (await conn.execute(runs_sql.CLAIM_READ, {"run_id": run_id})).one_or_none()
        if row is None:
            return Claim(run_id, None)
        platform = seen_platform.remember(row.platform)
        if row.state == RunState.RUNNING:
            return await _resume(conn, row, platform=platform)
        if row.state != RunState.QUEUED:
            return Claim(run_id, None)
        model_id = row.agent_model_id
        limit = row.max_concurrent_runs
        lock = closed_lock(
            enabled=row.enabled, admin_paused=row.admin_paused, has_model=row.has_model
        )
        if lock is not None:
            await conn.execute(
                runs_sql.FAIL_AT_CLAIM,
                {
                    "run_id": run_id,
                    "now": now,
                    "reason": str(RunReason.ERROR),
                    "error": f"the agent cannot start ({lock.value}): {LOCK_MESSAGES[lock]}",
                },
            )
            return Claim(run_id, RunState.FAILED, model_id=row.run_model_id, model_limit=limit)
        if await owners_over_budget(conn, [row.owner_id], now=now, platform=platform):
            await conn.execute(
                runs_sql.SKIP_AT_CLAIM,
                {"run_id": run_id, "now": now, "reason": str(RunReason.BUDGET_EXCEEDED)},
            )
            return Claim(run_id, RunState.SKIPPED, model_id=row.run_model_id, model_limit=limit)
        if row.weekly_token_cap is not None and await agents_over_cap(
            conn, [row.agent_id], now=now, platform=platform
        ):
            await conn.execute(
                runs_sql.SKIP_AT_CLAIM,
                {"run_id": run_id, "now": now, "reason": str(RunReason.AGENT_BUDGET_EXCEEDED)},
            )
            return Claim(run_id, RunState.SKIPPED, model_id=row.run_model_id, model_limit=limit)
        admission = await model_slots.admit(conn, model_id=model_id, run_id=run_id, limit=limit)
        if not admission.admitted:
            if row.run_model_id != model_id:
                await conn.execute(
                    runs_sql.REQUEUE_FOR_MODEL, {"run_id": run_id, "model_id": model_id}
                )
            log.info(
                "run %s waits for a slot of model %s (%d running, %d waiting ahead, limit %d)",
                run_id,
                model_id,
                admission.running,
                admission.ahead,
                admission.limit,
            )
            return Claim(run_id, RunState.QUEUED, model_id=model_id, model_limit=admission.limit)
        await conn.execute(
            runs_sql.START,
            {
                "run_id": run_id,
                "model_id": model_id,
                "model": row.model,
                "now": utc_now(),
                "trace_parent": trace_parent,
            },
        )
        return Claim(
            run_id,
            RunState.RUNNING,
            context=run_context_from_row(row, platform=platform),
            model_id=model_id,
            model_limit=admission.limit,
        )


async def _resume(conn: AsyncConnection, row: Row[Any], *, platform: PlatformSettings) -> Claim:
    """A parked run whose approval was decided: exactly one message takes it back, when its
    model (the one it started on) has a free slot; otherwise it stays parked, its decision kept,
    and the message is dropped until a slot is handed on to it."""
    run_id = int(row.run_id)
    model_id = row.run_model_id
    connection = await waits_db.is_resolved(conn, run_id)
    if not connection and not await approvals_db.is_decided(conn, run_id):
        return Claim(run_id, None)  # still pending, resumed already, or no longer parked
    if await resume_gate.refuse_resume(conn, run_id) is not None:
        # Ended instead (its agent may no longer run): a decided parked run counted as waiting
        # ahead of its model's queued runs, so a limited model's slot is handed on.
        same_model = row.agent_model_id == model_id
        limit = row.max_concurrent_runs if same_model else None
        return Claim(run_id, RunState.FAILED, model_id=model_id, model_limit=limit)
    admission = await model_slots.admit_resume(conn, model_id=model_id)
    if not admission.admitted:
        log.info(
            "run %s waits for a slot of model %s to resume (%d running, limit %d)",
            run_id,
            model_id,
            admission.running,
            admission.limit,
        )
        return Claim(run_id, RunState.QUEUED, model_id=model_id, model_limit=admission.limit)
    decided: Decided | Resolved | None
    if connection:
        decided = await waits_db.take_parked(conn, run_id)
    else:
        decided = await approvals_db.take_parked(conn, run_id)
    if decided is None:
        return Claim(run_id, None)
    return Claim(
        run_id,
        RunState.RUNNING,
        context=run_context_from_row(row, platform=platform),
        model_id=model_id,
        model_limit=admission.limit,
        resumed=decided,
    )
