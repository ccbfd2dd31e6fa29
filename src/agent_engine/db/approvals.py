"""`tool_approvals` and the parked runs: every change a compare-and-set the database settles.

- park: the run (still `running`) gets `parked_at`, its tokens so far and its last step end, and
  the approval row with the checkpoint -- one transaction, only while the run is running.
- decide / expire / cancel: `pending` -> one other status, once.
- resume: `parked_at` -> NULL once per decision (a second message finds nothing to resume),
  when the run's model has a free slot (`runs.model_slots.admit_resume`).
- the call: `call_started_at` NULL -> now() once; a worker that dies after it leaves the run to
  the reaper (failed as stale), never to a second call.

The row and the API's reads live in `db/approval_reads.py` (re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.approval_reads import APPROVAL_COLUMNS as APPROVAL_COLUMNS
from agent_engine.db.approval_reads import OF_RUNS as OF_RUNS
from agent_engine.db.approval_reads import PENDING_OF_RUNS as PENDING_OF_RUNS
from agent_engine.db.approval_reads import SELECT_APPROVAL as SELECT_APPROVAL
from agent_engine.db.approval_reads import ApprovalRow as ApprovalRow
from agent_engine.db.approval_reads import approvals_of_runs as approvals_of_runs
from agent_engine.db.approval_reads import fetch as fetch
from agent_engine.db.approval_reads import page as page
from agent_engine.db.approval_reads import pending_of_runs as pending_of_runs
from agent_engine.db.run_steps import END_PENDING_STEP
from agent_engine.domain.storable import storable_json_dumps, storable_text

CHANNEL = "tool_approval_events"


@dataclass(frozen=True, slots=True)
class Decided:
    """A parked run taken back by a worker: the decision and where to resume."""

    approval_id: int
    status: str
    note: str | None
    step_index: int
    checkpoint: dict[str, Any]


PARK_RUN = text(
    "UPDATE agent_runs SET parked_at = now(), heartbeat_at = now(),"
    " tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = GREATEST(prompt_tokens, :prompt_tokens),"
    " completion_tokens = GREATEST(completion_tokens, :completion_tokens)"
    " WHERE id = :run_id AND state = 'running' AND parked_at IS NULL"
    " RETURNING agent_id, (SELECT user_id FROM agents WHERE id = agent_runs.agent_id) AS owner_id"
)
# The parking tool call's step: its end (the arguments' check) waits in the recorder.
END_STEP = text(END_PENDING_STEP)
INSERT_APPROVAL = text(
    "INSERT INTO tool_approvals (run_id, agent_id, owner_id, step_index, tool_id, tool_name,"
    " input, expires_at, checkpoint)"
    " VALUES (:run_id, :agent_id, :owner_id, :step_index, :tool_id, :tool_name,"
    " CAST(:input AS jsonb), now() + make_interval(secs => :timeout_seconds),"
    " CAST(:checkpoint AS jsonb))"
    f" RETURNING {APPROVAL_COLUMNS}"
)
# A run parked on its owner's connection after this approval was approved (approval first, then
# the connection): the wait decides its resume (`db/connection_waits.py`), not the approval.
NO_OPEN_CONNECTION_WAIT = (
    " AND NOT EXISTS (SELECT 1 FROM connection_waits w WHERE w.run_id = :run_id"
    " AND w.taken_at IS NULL AND w.status <> 'cancelled')"
)
# A parked run whose newest approval is decided: it may resume (when its model has a slot).
IS_DECIDED = text(
    "SELECT 1 FROM agent_runs WHERE id = :run_id AND state = 'running' AND parked_at IS NOT NULL"
    " AND (SELECT status FROM tool_approvals WHERE run_id = :run_id ORDER BY id DESC LIMIT 1)"
    "   IN ('approved', 'declined', 'expired')" + NO_OPEN_CONNECTION_WAIT
)
# The run's newest approval once decided, taken by exactly one worker (the run row is locked by
# the claim's read; parked_at goes NULL here).
TAKE_PARKED = text(
    "WITH latest AS (SELECT id, status, note, step_index, checkpoint FROM tool_approvals"
    "   WHERE run_id = :run_id ORDER BY id DESC LIMIT 1),"
    " taken AS (UPDATE agent_runs SET parked_at = NULL, heartbeat_at = now()"
    "   WHERE id = :run_id AND state = 'running' AND parked_at IS NOT NULL"
    "   AND (SELECT status FROM latest) IN ('approved', 'declined', 'expired')"
    + NO_OPEN_CONNECTION_WAIT
    + "   RETURNING id)"
    " SELECT latest.* FROM latest, taken"
)
CLAIM_CALL = text(
    "UPDATE tool_approvals SET call_started_at = now()"
    " WHERE id = :id AND status = 'approved' AND call_started_at IS NULL RETURNING id"
)
# What the start gate reads of a run's agent and owner (`domain.gate.resume_stop` decides). The
# shared variant holds the agent row until commit: a pause, switch-off, deletion, deactivation
# or model removal (each writes the agent row) then commits either before this read, and is seen,
# or after the caller's commit.
_GATE_OF_RUN = (
    "SELECT a.enabled, a.admin_paused, a.model_id IS NOT NULL AS has_model,"
    " a.deleted_at IS NOT NULL AS deleted, u.is_active AS owner_active"
    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id JOIN users u ON u.id = a.user_id"
    " WHERE r.id = :run_id"
)
GATE_OF_RUN = text(_GATE_OF_RUN)
GATE_OF_RUN_SHARED = text(_GATE_OF_RUN + " FOR SHARE OF a")
# The parked runs of agents that may no longer run, locked (a run a worker took back meanwhile,
# under its row lock in `TAKE_PARKED`, is no longer parked: the call's own check stops it); then
# their approvals are cancelled and waiting steps closed with the reason (before the runs end, whose
# trigger would close them with a generic one); then they end like a cancelled run (failed /
# cancelled, the tokens of their answered model calls kept).
LOCK_PARKED_OF_AGENTS = text(
    "SELECT id FROM agent_runs WHERE agent_id = ANY(CAST(:agent_ids AS bigint[]))"
    " AND state = 'running' AND parked_at IS NOT NULL ORDER BY id FOR UPDATE"
)
END_PARKED = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'cancelled', error = :error,"
    " finished_at = now(), parked_at = NULL, tokens_used = GREATEST(tokens_used,"
    "   (SELECT COALESCE(sum(prompt_tokens + completion_tokens), 0) FROM agent_run_steps"
    "    WHERE run_id = agent_runs.id))"
    " WHERE id = ANY(CAST(:run_ids AS bigint[])) AND state = 'running' AND parked_at IS NOT NULL"
)
# The approvals of ended runs that could still lead to a call: pending (a later decision is a
# CONFLICT), or approved and not yet called (`CLAIM_CALL` needs `approved`). A declined or expired
# one stays as decided: it never calls anything.
CANCEL_OPEN_OF_RUNS = text(
    "UPDATE tool_approvals SET status = 'cancelled', decided_at = now(), decided_by = :actor"
    " WHERE run_id = ANY(CAST(:run_ids AS bigint[]))"
    " AND (status = 'pending' OR (status = 'approved' AND call_started_at IS NULL))"
    f" RETURNING {APPROVAL_COLUMNS}"
)
DECIDE = text(
    "UPDATE tool_approvals SET status = :status, decided_at = now(), decided_by = :actor,"
    " note = :note WHERE id = :id AND status = 'pending'"
    f" RETURNING {APPROVAL_COLUMNS}"
)
EXPIRE_DUE = text(
    "UPDATE tool_approvals SET status = 'expired', decided_at = now()"
    " WHERE id IN (SELECT id FROM tool_approvals WHERE status = 'pending'"
    "   AND expires_at <= now() ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)"
    f" RETURNING {APPROVAL_COLUMNS}"
)
# Decided approvals whose run is still parked a while after the decision: the execute message
# was lost (broker restart); send it again. Not the runs of a model with a limit: one of those may
# be parked on purpose, waiting for a slot to resume, and the reaper's slot pass
# (`db.model_slots.WAITING_WITH_FREE_SLOTS`, the same tick) sends it when there is one.
UNRESUMED = text(
    "SELECT ap.run_id FROM tool_approvals ap JOIN agent_runs r ON r.id = ap.run_id"
    " WHERE r.state = 'running' AND r.parked_at IS NOT NULL"
    " AND ap.status IN ('approved', 'declined', 'expired')"
    " AND ap.decided_at < now() - make_interval(secs => :after_seconds)"
    " AND ap.id = (SELECT max(id) FROM tool_approvals WHERE run_id = ap.run_id)"
    " AND NOT EXISTS (SELECT 1 FROM connection_waits w WHERE w.run_id = ap.run_id"
    "   AND w.taken_at IS NULL AND w.status <> 'cancelled')"
    " AND NOT EXISTS (SELECT 1 FROM agent_models m"
    "   WHERE m.id = r.model_id AND m.max_concurrent_runs IS NOT NULL)"
    " ORDER BY ap.run_id LIMIT :limit"
)
# cancelRun of a parked run: its approval is cancelled and the waiting step closed.
CANCEL_PENDING = text(
    "UPDATE tool_approvals SET status = 'cancelled', decided_at = now(), decided_by = :actor"
    " WHERE run_id = :run_id AND status = 'pending'"
    f" RETURNING {APPROVAL_COLUMNS}"
)
CLOSE_STEP = text(
    "UPDATE agent_run_steps SET error = :error, finished_at = now()"
    " WHERE run_id = :run_id AND index = :index AND finished_at IS NULL"
)
NOTIFY = text("SELECT pg_notify(:channel, :payload)")
# A run event without a state change (running -> running) when a run parks or resumes, so
# runEvents consumers see Run.pendingApproval come and go. The payload is the trigger's.
NOTIFY_RUN = text(
    "SELECT pg_notify('agent_run_events', json_build_object("
    " 'run_id', r.id, 'agent_id', r.agent_id, 'owner_id', a.user_id,"
    " 'state', r.state, 'previous_state', r.state)::text)"
    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
    " WHERE r.id = :run_id AND a.deleted_at IS NULL"
)


async def park_run(
    conn: AsyncConnection,
    run_id: int,
    *,
    tokens: int,
    prompt_tokens: int,
    completion_tokens: int,
    step_end: dict[str, Any],
) -> Any:
    """The first half of every park (an approval's or a connection wait's): the running run
    marked parked with its tokens so far, and the parking call's step ended. The run's agent and
    owner; None when the run is no longer running (cancelled or reaped: nothing is written)."""
    parked = (
        await conn.execute(
            PARK_RUN,
            {
                "run_id": run_id,
                "tokens": tokens,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
            },
        )
    ).one_or_none()
    if parked is not None:
        await conn.execute(END_STEP, {"run_id": run_id, **step_end})
    return parked


async def park(
    conn: AsyncConnection,
    run_id: int,
    *,
    tokens: int,
    prompt_tokens: int,
    completion_tokens: int,
    step_end: dict[str, Any],
    tool_id: int,
    tool_name: str,
    input: Any,
    step_index: int,
    checkpoint: dict[str, Any],
    timeout_seconds: float,
) -> ApprovalRow | None:
    """Park the running run on a new approval; None when the run is no longer running (it was
    cancelled or reaped meanwhile: nothing is written)."""
    parked = await park_run(
        conn,
        run_id,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        step_end=step_end,
    )
    if parked is None:
        return None
    row = (
        await conn.execute(
            INSERT_APPROVAL,
            {
                "run_id": run_id,
                "agent_id": parked.agent_id,
                "owner_id": parked.owner_id,
                "step_index": step_index,
                "tool_id": tool_id,
                # The model's call and the conversation so far (tool results too): cleaned of
                # what `jsonb` refuses, or the park fails and the run is lost
                # (`domain/storable.py`).
                "tool_name": storable_text(tool_name),
                "input": storable_json_dumps(input),
                "timeout_seconds": timeout_seconds,
                "checkpoint": storable_json_dumps(checkpoint),
            },
        )
    ).one()
    approval = ApprovalRow.from_row(row)
    await notify(conn, approval)
    await conn.execute(NOTIFY_RUN, {"run_id": run_id})
    return approval


async def end_pending_step(conn: AsyncConnection, run_id: int, step_end: dict[str, Any]) -> None:
    """Write the step end the recorder kept back (`StepRecorder.take_pending()`'s parameters)."""
    await conn.execute(END_STEP, {"run_id": run_id, **step_end})


async def close_step(conn: AsyncConnection, run_id: int, index: int, *, error: str) -> None:
    await conn.execute(CLOSE_STEP, {"run_id": run_id, "index": index, "error": error})


async def notify(conn: AsyncConnection, approval: ApprovalRow) -> None:
    """Tell the api processes (the `toolApprovals` subscription) at commit."""
    payload = json.dumps({"id": approval.id, "owner_id": approval.owner_id})
    await conn.execute(NOTIFY, {"channel": CHANNEL, "payload": payload})


async def is_decided(conn: AsyncConnection, run_id: int) -> bool:
    return (await conn.execute(IS_DECIDED, {"run_id": run_id})).first() is not None


async def take_parked(conn: AsyncConnection, run_id: int) -> Decided | None:
    row = (await conn.execute(TAKE_PARKED, {"run_id": run_id})).mappings().one_or_none()
    if row is None:
        return None
    await conn.execute(NOTIFY_RUN, {"run_id": run_id})
    return Decided(
        approval_id=int(row["id"]),
        status=row["status"],
        note=row["note"],
        step_index=int(row["step_index"]),
        checkpoint=row["checkpoint"],
    )


async def claim_call(conn: AsyncConnection, approval_id: int) -> bool:
    return (await conn.execute(CLAIM_CALL, {"id": approval_id})).first() is not None


@dataclass(frozen=True, slots=True)
class AgentGate:
    """What decides whether a run's agent may still run (`domain.gate.resume_stop`)."""

    enabled: bool
    admin_paused: bool
    has_model: bool
    deleted: bool
    owner_active: bool


async def gate_of_run(conn: AsyncConnection, run_id: int, *, shared: bool) -> AgentGate | None:
    """The run's agent's gate; `shared`: hold the agent row (FOR SHARE) until commit. None when
    the run (or its agent) is gone."""
    statement = GATE_OF_RUN_SHARED if shared else GATE_OF_RUN
    row = (await conn.execute(statement, {"run_id": run_id})).one_or_none()
    if row is None:
        return None
    return AgentGate(
        enabled=bool(row.enabled),
        admin_paused=bool(row.admin_paused),
        has_model=bool(row.has_model),
        deleted=bool(row.deleted),
        owner_active=bool(row.owner_active),
    )


async def end_parked_of_agents(
    conn: AsyncConnection, agent_ids: Sequence[int], *, error: str, actor_id: int | None
) -> list[int]:
    """End the parked runs of the agents (failed/cancelled with `error`) and cancel their open
    approvals; returns the ended runs' ids, sorted."""
    if not agent_ids:
        return []
    rows = await conn.execute(LOCK_PARKED_OF_AGENTS, {"agent_ids": list(agent_ids)})
    run_ids = [int(run_id) for run_id in rows.scalars()]
    if run_ids:
        await cancel_open(conn, run_ids, actor_id=actor_id, error=error)
        await conn.execute(END_PARKED, {"run_ids": run_ids, "error": error})
    return run_ids


async def cancel_open(
    conn: AsyncConnection, run_ids: Sequence[int], *, actor_id: int | None, error: str
) -> list[ApprovalRow]:
    """Cancel the approvals of runs about to end that could still lead to a call, close their
    waiting steps with `error`, and tell the api processes (at commit)."""
    if not run_ids:
        return []
    rows = await conn.execute(CANCEL_OPEN_OF_RUNS, {"run_ids": list(run_ids), "actor": actor_id})
    cancelled = [ApprovalRow.from_row(row) for row in rows]
    if cancelled:
        await conn.execute(
            CLOSE_STEP,
            [{"run_id": a.run_id, "index": a.step_index, "error": error} for a in cancelled],
        )
    for approval in cancelled:
        await notify(conn, approval)
    return cancelled


async def decide(
    conn: AsyncConnection, approval_id: int, *, status: str, actor_id: int, note: str | None
) -> ApprovalRow | None:
    row = (
        await conn.execute(
            DECIDE, {"id": approval_id, "status": status, "actor": actor_id, "note": note}
        )
    ).one_or_none()
    return None if row is None else ApprovalRow.from_row(row)


async def expire_due(conn: AsyncConnection, *, limit: int) -> list[ApprovalRow]:
    rows = await conn.execute(EXPIRE_DUE, {"limit": limit})
    return [ApprovalRow.from_row(row) for row in rows]


async def unresumed_runs(conn: AsyncConnection, *, after_seconds: float, limit: int) -> list[int]:
    rows = await conn.execute(UNRESUMED, {"after_seconds": after_seconds, "limit": limit})
    return [int(run_id) for run_id in rows.scalars()]


async def cancel_pending(
    conn: AsyncConnection, run_id: int, *, actor_id: int | None, error: str
) -> ApprovalRow | None:
    row = (await conn.execute(CANCEL_PENDING, {"run_id": run_id, "actor": actor_id})).one_or_none()
    if row is None:
        return None
    approval = ApprovalRow.from_row(row)
    await conn.execute(CLOSE_STEP, {"run_id": run_id, "index": approval.step_index, "error": error})
    return approval
