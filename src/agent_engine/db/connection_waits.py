"""`connection_waits` and the runs parked on them: every change a compare-and-set the database
settles, like `db/approvals.py`'s.

- park: the run (still `running`) gets `parked_at`, its tokens so far and its last step end, and
  the wait row with the checkpoint -- one transaction, only while the run is running.
- connect / expire / cancel: `pending` -> one other status, once.
- resume: `parked_at` -> NULL and `taken_at` -> now() once per resolved wait (a second message
  finds nothing to resume), when the run's model has a free slot.
- the call: `call_started_at` NULL -> now() once; a worker that dies after it leaves the run to
  the reaper (failed as stale), never to a second call.

A run parked on a connection may have an approved approval before it (approval first, then the
connection): while its wait is open (`OPEN_WAIT`), the approval's resume queries leave the run
alone (`db.approvals.NO_OPEN_CONNECTION_WAIT`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.approvals import CLOSE_STEP, NOTIFY_RUN, park_run
from agent_engine.db.rows import AnyRow, columns
from agent_engine.domain.storable import storable_json_dumps, storable_text

PENDING = "pending"
CONNECTED = "connected"
EXPIRED = "expired"
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class WaitRow:
    id: int
    run_id: int
    agent_id: int
    owner_id: int
    source_id: int | None
    source_name: str
    step_index: int
    tool_name: str
    status: str
    requested_at: datetime
    expires_at: datetime
    resolved_at: datetime | None

    @classmethod
    def from_row(cls, row: AnyRow) -> WaitRow:
        m = columns(row)
        source_id = m["source_id"]
        return cls(
            id=int(m["id"]),
            run_id=int(m["run_id"]),
            agent_id=int(m["agent_id"]),
            owner_id=int(m["owner_id"]),
            source_id=None if source_id is None else int(source_id),
            source_name=m["source_name"],
            step_index=int(m["step_index"]),
            tool_name=m["tool_name"],
            status=m["status"],
            requested_at=m["requested_at"],
            expires_at=m["expires_at"],
            resolved_at=m["resolved_at"],
        )


# Everything but the checkpoint (it can be large and the API never shows it).
WAIT_COLUMNS = (
    "id, run_id, agent_id, owner_id, source_id, source_name, step_index, tool_name, status,"
    " requested_at, expires_at, resolved_at"
)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A run parked on a connection, taken back by a worker: how the wait ended and where to
    resume."""

    wait_id: int
    status: str  # connected | expired
    source_name: str
    step_index: int
    checkpoint: dict[str, Any]


INSERT_WAIT = text(
    "INSERT INTO connection_waits (run_id, agent_id, owner_id, source_id, source_name,"
    " step_index, tool_id, tool_name, expires_at, checkpoint)"
    " VALUES (:run_id, :agent_id, :owner_id, :source_id, :source_name, :step_index, :tool_id,"
    " :tool_name, now() + make_interval(secs => :timeout_seconds), CAST(:checkpoint AS jsonb))"
    f" RETURNING {WAIT_COLUMNS}"
)
IS_RESOLVED = text(
    "SELECT 1 FROM agent_runs r JOIN connection_waits w ON w.run_id = r.id"
    " WHERE r.id = :run_id AND r.state = 'running' AND r.parked_at IS NOT NULL"
    " AND w.taken_at IS NULL AND w.status IN ('connected', 'expired')"
)
# The resolved wait, taken by exactly one worker (the run row is locked by the claim's read).
TAKE_PARKED = text(
    "WITH taken_run AS (UPDATE agent_runs SET parked_at = NULL, heartbeat_at = now()"
    "   WHERE id = :run_id AND state = 'running' AND parked_at IS NOT NULL"
    "   AND EXISTS (SELECT 1 FROM connection_waits WHERE run_id = :run_id AND taken_at IS NULL"
    "     AND status IN ('connected', 'expired'))"
    "   RETURNING id)"
    " UPDATE connection_waits SET taken_at = now()"
    " WHERE run_id = (SELECT id FROM taken_run) AND taken_at IS NULL"
    " AND status IN ('connected', 'expired')"
    " RETURNING id, status, source_name, step_index, checkpoint"
)
CLAIM_CALL = text(
    "UPDATE connection_waits SET call_started_at = now()"
    " WHERE id = :id AND status = 'connected' AND call_started_at IS NULL RETURNING id"
)
# The owner connected: every run of theirs parked on that source goes on.
CONNECT = text(
    "UPDATE connection_waits SET status = 'connected', resolved_at = now()"
    " WHERE owner_id = :owner_id AND source_id = :source_id AND status = 'pending'"
    f" RETURNING {WAIT_COLUMNS}"
)
EXPIRE_DUE = text(
    "UPDATE connection_waits SET status = 'expired', resolved_at = now()"
    " WHERE id IN (SELECT id FROM connection_waits WHERE status = 'pending'"
    "   AND expires_at <= now() ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)"
    f" RETURNING {WAIT_COLUMNS}"
)
# Resolved waits whose run is still parked a while later: the execute message was lost (or the
# run's model had no free slot then); send it again. The claim decides again.
UNRESUMED = text(
    "SELECT w.run_id FROM connection_waits w JOIN agent_runs r ON r.id = w.run_id"
    " WHERE r.state = 'running' AND r.parked_at IS NOT NULL AND w.taken_at IS NULL"
    " AND w.status IN ('connected', 'expired')"
    " AND w.resolved_at < now() - make_interval(secs => :after_seconds)"
    " ORDER BY w.run_id LIMIT :limit"
)
# Runs about to end (cancel, a closed gate): their open waits end too, and the waiting step is
# closed with the reason (before the run's end, whose trigger would close it generically). A
# connected wait whose call started stays as it is.
CANCEL_OPEN_OF_RUNS = text(
    "UPDATE connection_waits SET status = 'cancelled', resolved_at = now()"
    " WHERE run_id = ANY(CAST(:run_ids AS bigint[])) AND taken_at IS NULL"
    " AND status IN ('pending', 'connected', 'expired')"
    f" RETURNING {WAIT_COLUMNS}"
)
# The same for the parked runs of agents whose gate just closed (`runs/resume_gate.py`).
CANCEL_OPEN_OF_AGENTS = text(
    "UPDATE connection_waits w SET status = 'cancelled', resolved_at = now()"
    " FROM agent_runs r WHERE r.id = w.run_id AND r.state = 'running' AND r.parked_at IS NOT NULL"
    " AND w.agent_id = ANY(CAST(:agent_ids AS bigint[])) AND w.taken_at IS NULL"
    " AND w.status IN ('pending', 'connected', 'expired')"
    " RETURNING w.id, w.run_id, w.agent_id, w.owner_id, w.source_id, w.source_name,"
    " w.step_index, w.tool_name, w.status, w.requested_at, w.expires_at, w.resolved_at"
)
# With the owner's connection as it is now (none, or expired): what `Run.pendingConnection` shows.
PENDING_OF_RUNS = text(
    "SELECT w.run_id, w.source_id, w.source_name, c.status AS connection_status"
    " FROM connection_waits w LEFT JOIN tool_connections c"
    "   ON c.owner_id = w.owner_id AND c.source_id = w.source_id"
    " WHERE w.run_id = ANY(CAST(:ids AS bigint[])) AND w.taken_at IS NULL"
    " AND w.status = 'pending'"
)


async def park(
    conn: AsyncConnection,
    run_id: int,
    *,
    tokens: int,
    prompt_tokens: int,
    completion_tokens: int,
    step_end: dict[str, Any],
    source_id: int,
    source_name: str,
    tool_id: int,
    tool_name: str,
    step_index: int,
    checkpoint: dict[str, Any],
    timeout_seconds: float,
) -> WaitRow | None:
    """Park the running run on a new connection wait; None when the run is no longer running
    (cancelled or reaped meanwhile: nothing is written)."""
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
            INSERT_WAIT,
            {
                "run_id": run_id,
                "agent_id": parked.agent_id,
                "owner_id": parked.owner_id,
                "source_id": source_id,
                "source_name": storable_text(source_name),
                "step_index": step_index,
                "tool_id": tool_id,
                "tool_name": storable_text(tool_name),
                "timeout_seconds": timeout_seconds,
                "checkpoint": storable_json_dumps(checkpoint),
            },
        )
    ).one()
    await conn.execute(NOTIFY_RUN, {"run_id": run_id})
    return WaitRow.from_row(row)


async def is_resolved(conn: AsyncConnection, run_id: int) -> bool:
    return (await conn.execute(IS_RESOLVED, {"run_id": run_id})).first() is not None


async def take_parked(conn: AsyncConnection, run_id: int) -> Resolved | None:
    row = (await conn.execute(TAKE_PARKED, {"run_id": run_id})).mappings().one_or_none()
    if row is None:
        return None
    await conn.execute(NOTIFY_RUN, {"run_id": run_id})
    return Resolved(
        wait_id=int(row["id"]),
        status=row["status"],
        source_name=row["source_name"],
        step_index=int(row["step_index"]),
        checkpoint=row["checkpoint"],
    )


async def claim_call(conn: AsyncConnection, wait_id: int) -> bool:
    return (await conn.execute(CLAIM_CALL, {"id": wait_id})).first() is not None


async def connect(conn: AsyncConnection, *, owner_id: int, source_id: int) -> list[WaitRow]:
    rows = await conn.execute(CONNECT, {"owner_id": owner_id, "source_id": source_id})
    waits = [WaitRow.from_row(row) for row in rows]
    for wait in waits:
        await conn.execute(NOTIFY_RUN, {"run_id": wait.run_id})
    return waits


async def expire_due(conn: AsyncConnection, *, limit: int) -> list[WaitRow]:
    rows = await conn.execute(EXPIRE_DUE, {"limit": limit})
    return [WaitRow.from_row(row) for row in rows]


async def unresumed_runs(conn: AsyncConnection, *, after_seconds: float, limit: int) -> list[int]:
    rows = await conn.execute(UNRESUMED, {"after_seconds": after_seconds, "limit": limit})
    return [int(run_id) for run_id in rows.scalars()]


async def cancel_open(
    conn: AsyncConnection, run_ids: Sequence[int], *, error: str
) -> list[WaitRow]:
    """End the open waits of runs about to end and close their waiting steps with `error`."""
    if not run_ids:
        return []
    rows = await conn.execute(CANCEL_OPEN_OF_RUNS, {"run_ids": list(run_ids)})
    cancelled = [WaitRow.from_row(row) for row in rows]
    if cancelled:
        await conn.execute(
            CLOSE_STEP,
            [{"run_id": w.run_id, "index": w.step_index, "error": error} for w in cancelled],
        )
    return cancelled


async def cancel_open_of_agents(
    conn: AsyncConnection, agent_ids: Sequence[int], *, error: str
) -> list[WaitRow]:
    if not agent_ids:
        return []
    rows = await conn.execute(CANCEL_OPEN_OF_AGENTS, {"agent_ids": list(agent_ids)})
    cancelled = [WaitRow.from_row(row) for row in rows]
    if cancelled:
        await conn.execute(
            CLOSE_STEP,
            [{"run_id": w.run_id, "index": w.step_index, "error": error} for w in cancelled],
        )
    return cancelled


@dataclass(frozen=True, slots=True)
class PendingConnection:
    """A run's pending wait, with its owner's connection now (None: never connected)."""

    run_id: int
    source_id: int | None
    source_name: str
    connection_status: str | None


async def pending_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[PendingConnection]:
    rows = await conn.execute(PENDING_OF_RUNS, {"ids": list(run_ids)})
    return [
        PendingConnection(
            run_id=int(row.run_id),
            source_id=None if row.source_id is None else int(row.source_id),
            source_name=row.source_name,
            connection_status=row.connection_status,
        )
        for row in rows
    ]
