"""The one statement an OWNER_OAUTH call pays for its owner's token (`runtime/authority.py`).

It reads the owner's CONNECTED account at the source and marks it used in the same round trip,
on an autocommit connection through asyncpg directly (`db/direct.py`): a call must cost about what
a SHARED call costs (bench `owner_oauth_call`). A token near its expiry is left to
`oauth.access.owner_access_token`, which refreshes it once across workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import direct
from agent_engine.db.lane import autocommit

USE_CONNECTION = text(
    "UPDATE tool_connections SET last_used_at = now()"
    " WHERE owner_id = :owner_id AND source_id = :source_id AND status = 'connected'"
    " RETURNING access_token_enc, expires_at, account"
)


@dataclass(frozen=True, slots=True)
class UsedConnection:
    access_token_enc: bytes
    expires_at: datetime | None
    account: str | None


async def use_connection(
    engine: AsyncEngine, *, owner_id: int, source_id: int
) -> UsedConnection | None:
    """The owner's CONNECTED account at the source, marked used; None when there is none."""
    async with autocommit(engine) as conn:
        row = await direct.fetch_one(
            conn, USE_CONNECTION, {"owner_id": owner_id, "source_id": source_id}
        )
    if row is None:
        return None
    return UsedConnection(bytes(row.access_token_enc), row.expires_at, row.account)
