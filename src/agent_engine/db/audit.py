"""Statements on `audit_log` (append-only: `audit_log_append_only`, see schema/database.sql,
refuses UPDATE, DELETE and TRUNCATE)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: datetime
    actor_id: int | None
    action: str
    agent_id: int | None
    user_id: int | None
    details: Any

    @classmethod
    def from_row(cls, row: AnyRow) -> AuditRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            at=values["at"],
            actor_id=values["actor_id"],
            action=values["action"],
            agent_id=values["agent_id"],
            user_id=values["user_id"],
            details=values["details"],
        )


@dataclass(frozen=True)
class AuditFilter:
    agent_id: int | None = None
    user_id: int | None = None
    actor_id: int | None = None


INSERT_ENTRY = text(
    "INSERT INTO audit_log (actor_id, action, agent_id, user_id, details)"
    " VALUES (:actor_id, :action, :agent_id, :user_id, CAST(:details AS jsonb)) RETURNING id"
)

INSERT_ENTRIES = text(
    "INSERT INTO audit_log (actor_id, action, agent_id, user_id, details)"
    " VALUES (:actor_id, :action, :agent_id, :user_id, CAST(:details AS jsonb))"
)


async def insert_entry(
    conn: AsyncConnection,
    *,
    actor_id: int | None,
    action: str,
    agent_id: int | None,
    user_id: int | None,
    details: Mapping[str, Any] | None,
) -> int:
    params = {
        "actor_id": actor_id,
        "action": action,
        "agent_id": agent_id,
        "user_id": user_id,
        "details": None if details is None else json.dumps(details, default=str),
    }
    return int((await conn.execute(INSERT_ENTRY, params)).scalar_one())


async def insert_entries(conn: AsyncConnection, entries: Sequence[Mapping[str, Any]]) -> None:
    """Several entries (the keys of `insert_entry`) as one batch (executemany), none returned."""
    if entries:
        await conn.execute(
            INSERT_ENTRIES,
            [
                {
                    **entry,
                    "details": None
                    if entry["details"] is None
                    else json.dumps(entry["details"], default=str),
                }
                for entry in entries
            ],
        )


async def fetch_page(
    conn: AsyncConnection, *, first: int, after: int | None, where: AuditFilter
) -> list[AuditRow]:
    """Newest first, keyset-paged by id; one row more than asked tells `hasNextPage`.
    Each filter is served by its `(column, id DESC)` index."""
    clauses = ["TRUE"]
    params: dict[str, Any] = {"limit": first + 1}
    if after is not None:
        clauses.append("id < :after")
        params["after"] = after
    for column in ("agent_id", "user_id", "actor_id"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    rows = await conn.execute(
        text(
            f"SELECT * FROM audit_log WHERE {' AND '.join(clauses)} ORDER BY id DESC LIMIT :limit"
        ),
        params,
    )
    return [AuditRow.from_row(row) for row in rows.mappings()]
