"""The audit log: who did which admin action, to which agent or user, with what details.

Every admin action writes its entry with `record(conn, …)` on the action's own connection, so the
entry commits with the action or not at all (an action that rolls back leaves no entry). The
table is append-only (a trigger refuses UPDATE, DELETE and TRUNCATE). Owners' actions on their
own agents are not audited: the journal and `updated_at` tell them.

Details never carry secrets: model API keys are never stored anyway (`api_key_env` names a
variable), and URLs are recorded without credentials or query strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


class AuditAction(StrEnum):
    AGENT_ADMIN_PAUSED = "agent.admin_paused"
    AGENT_ADMIN_UNPAUSED = "agent.admin_unpaused"
    AGENT_DELETED = "agent.deleted"
    USER_DEACTIVATED = "user.deactivated"
    MODEL_UPSERTED = "model.upserted"
    MODEL_REMOVED = "model.removed"
    TOOL_ALLOWED = "tool.allowed"
    TOOL_DISALLOWED = "tool.disallowed"
    SETTINGS_UPDATED = "settings.updated"
    # Actions of features that record through this same function when they land.
    USER_REACTIVATED = "user.reactivated"
    RUN_CANCELLED = "run.cancelled"
    DELIVERY_TARGET_UPSERTED = "delivery_target.upserted"
    DELIVERY_TARGET_REMOVED = "delivery_target.removed"


_INSERT_SQL = text(
    "INSERT INTO audit_log (actor_id, action, agent_id, user_id, details)"
    " VALUES (:actor_id, :action, :agent_id, :user_id, CAST(:details AS jsonb)) RETURNING id"
)


async def record(
    conn: AsyncConnection,
    actor_id: int | None,
    action: AuditAction,
    *,
    agent_id: int | None = None,
    user_id: int | None = None,
    details: Mapping[str, Any] | None = None,
) -> int:
    """Append one entry in the caller's transaction; returns its id.

    `actor_id` None is the engine itself. For an action on an agent, `user_id` is its owner, so
    filtering the log by a user shows what was done to them and to their agents.
    """
    return int(
        (
            await conn.execute(
                _INSERT_SQL,
                {
                    "actor_id": actor_id,
                    "action": str(action),
                    "agent_id": agent_id,
                    "user_id": user_id,
                    "details": None if details is None else json.dumps(details, default=str),
                },
            )
        ).scalar_one()
    )


def redacted_url(url: str | None) -> str | None:
    """The URL without user info, query or fragment (where credentials may hide)."""
    if url is None:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class AuditFilter:
    agent_id: int | None = None
    user_id: int | None = None
    actor_id: int | None = None


@dataclass(frozen=True)
class AuditRow:
    id: int
    at: datetime
    actor_id: int | None
    action: str
    agent_id: int | None
    user_id: int | None
    details: Any

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditRow:
        return cls(
            id=int(row["id"]),
            at=row["at"],
            actor_id=row["actor_id"],
            action=row["action"],
            agent_id=row["agent_id"],
            user_id=row["user_id"],
            details=row["details"],
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
    return [AuditRow.from_row(dict(row)) for row in rows.mappings()]
