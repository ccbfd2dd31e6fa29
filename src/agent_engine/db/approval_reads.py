"""The `tool_approvals` row and the reads the API makes of it: one approval, the pending ones
of runs, all of runs', and the keyset-paged list (owner's or everyone's, by status).

The compare-and-set changes (park, decide, expire, cancel, resume) live in `db/approvals.py`,
which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    id: int
    run_id: int
    agent_id: int
    owner_id: int
    step_index: int
    tool_id: int | None
    tool_name: str
    input: Any
    status: str
    requested_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: int | None
    note: str | None

    @classmethod
    def from_row(cls, row: AnyRow) -> ApprovalRow:
        m = columns(row)
        tool_id = m["tool_id"]
        return cls(
            id=int(m["id"]),
            run_id=int(m["run_id"]),
            agent_id=int(m["agent_id"]),
            owner_id=int(m["owner_id"]),
            step_index=int(m["step_index"]),
            tool_id=None if tool_id is None else int(tool_id),
            tool_name=m["tool_name"],
            input=m["input"],
            status=m["status"],
            requested_at=m["requested_at"],
            expires_at=m["expires_at"],
            decided_at=m["decided_at"],
            decided_by=m["decided_by"],
            note=m["note"],
        )


# Everything but the checkpoint (it can be large and the API never shows it).
APPROVAL_COLUMNS = (
    "id, run_id, agent_id, owner_id, step_index, tool_id, tool_name, input, status,"
    " requested_at, expires_at, decided_at, decided_by, note"
)


SELECT_APPROVAL = text(f"SELECT {APPROVAL_COLUMNS} FROM tool_approvals WHERE id = :id")
PENDING_OF_RUNS = text(
    f"SELECT {APPROVAL_COLUMNS} FROM tool_approvals"
    " WHERE run_id = ANY(CAST(:ids AS bigint[])) AND status = 'pending'"
)
OF_RUNS = text(
    f"SELECT {APPROVAL_COLUMNS} FROM tool_approvals WHERE run_id = ANY(CAST(:ids AS bigint[]))"
    " ORDER BY id"
)


async def fetch(conn: AsyncConnection, approval_id: int) -> ApprovalRow | None:
    row = (await conn.execute(SELECT_APPROVAL, {"id": approval_id})).one_or_none()
    return None if row is None else ApprovalRow.from_row(row)


async def pending_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[ApprovalRow]:
    rows = await conn.execute(PENDING_OF_RUNS, {"ids": list(run_ids)})
    return [ApprovalRow.from_row(row) for row in rows]


async def approvals_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[ApprovalRow]:
    rows = await conn.execute(OF_RUNS, {"ids": list(run_ids)})
    return [ApprovalRow.from_row(row) for row in rows]


async def page(
    conn: AsyncConnection,
    *,
    owner_id: int | None,
    status: str | None,
    before_id: int | None,
    limit: int,
) -> list[ApprovalRow]:
    """Newest first; an owner's (`owner_id`) or everyone's (None, the admins' view). Approvals
    of hidden (deleted) agents are left out, as every read of agents leaves those out."""
    clauses = [
        "EXISTS (SELECT 1 FROM agents a"
        " WHERE a.id = tool_approvals.agent_id AND a.deleted_at IS NULL)"
    ]
    params: dict[str, Any] = {"limit": limit}
    if owner_id is not None:
        clauses.append("owner_id = :owner_id")
        params["owner_id"] = owner_id
    if status is not None:
        clauses.append("status = :status")
        params["status"] = status
    if before_id is not None:
        clauses.append("id < :before_id")
        params["before_id"] = before_id
    statement = text(
        f"SELECT {APPROVAL_COLUMNS} FROM tool_approvals WHERE {' AND '.join(clauses)}"
        " ORDER BY id DESC LIMIT :limit"
    )
    return [ApprovalRow.from_row(row) for row in await conn.execute(statement, params)]
