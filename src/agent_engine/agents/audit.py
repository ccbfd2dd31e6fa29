"""The audit log: who did which admin action, to which agent or user, with what details.

Every admin action writes its entry with `record(conn, …)` on the action's own connection, so the
entry commits with the action or not at all (an action that rolls back leaves no entry). The
table is append-only (a trigger refuses UPDATE, DELETE and TRUNCATE). Owners' actions on their
own agents are not audited: the journal and `updated_at` tell them.

Details never carry secrets: model API keys are never stored anyway (`api_key_env` names a
variable), and URLs are recorded without credentials or query strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import audit as audit_db


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
    TOOL_SOURCE_UPSERTED = "tool_source.upserted"
    TOOL_SOURCE_SYNCED = "tool_source.synced"
    TOOL_SOURCE_REMOVED = "tool_source.removed"
    # A sync found a known MCP tool relabelled (READ <-> WRITE), or its description or schema
    # changed: the server's word changed under the admins' choices.
    TOOL_ACCESS_CHANGED = "tool.access_changed"
    TOOL_CHANGED = "tool.changed"
    # An owner's own account at an OWNER_OAUTH source (never a token in the details).
    CONNECTION_CREATED = "connection.created"
    CONNECTION_REVOKED = "connection.revoked"
    CONNECTION_EXPIRED = "connection.expired"


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
    return await audit_db.insert_entry(
        conn,
        actor_id=actor_id,
        action=str(action),
        agent_id=agent_id,
        user_id=user_id,
        details=details,
    )


async def record_many(
    conn: AsyncConnection,
    actor_id: int | None,
    entries: Sequence[tuple[AuditAction, Mapping[str, Any]]],
) -> None:
    """Append several entries (action, details) in the caller's transaction, as one batch."""
    await audit_db.insert_entries(
        conn,
        [
            {
                "actor_id": actor_id,
                "action": str(action),
                "agent_id": None,
                "user_id": None,
                "details": details,
            }
            for action, details in entries
        ],
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
