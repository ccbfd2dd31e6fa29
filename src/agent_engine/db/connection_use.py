"""The statement an OWNER_OAUTH call pays for its owner's token (`runtime/authority.py`).

It reads the owner's CONNECTED account at the source on an autocommit connection through asyncpg
directly (`db/direct.py`): a call must cost about what a SHARED call costs (bench
`owner_oauth_call`). `last_used_at` is written to the minute (`mark_used`), as
`oauth.access.owner_access_token` does: a busy owner's calls do not each write the row. A token
near its expiry is left to `owner_access_token`, which refreshes it once across workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import direct
from agent_engine.db.lane import autocommit

CONNECTED_FOR_CALL = text(
    "SELECT id, access_token_enc, expires_at, account, last_used_at FROM tool_connections"
    " WHERE owner_id = :owner_id AND source_id = :source_id AND status = 'connected'"
)
MARK_USED = text("UPDATE tool_connections SET last_used_at = now() WHERE id = :id")


@dataclass(frozen=True, slots=True)
class CallConnection:
    id: int
    access_token_enc: bytes
    expires_at: datetime | None
    account: str | None
    last_used_at: datetime | None


async def connected_for_call(
    engine: AsyncEngine, *, owner_id: int, source_id: int
) -> CallConnection | None:
    """The owner's CONNECTED account at the source; None when there is none."""
    async with autocommit(engine) as conn:
        row = await direct.fetch_one(
            conn, CONNECTED_FOR_CALL, {"owner_id": owner_id, "source_id": source_id}
        )
    if row is None:
        return None
    return CallConnection(
        int(row.id), bytes(row.access_token_enc), row.expires_at, row.account, row.last_used_at
    )


async def mark_used(engine: AsyncEngine, connection_id: int) -> None:
    async with autocommit(engine) as conn:
        await conn.execute(MARK_USED, {"id": connection_id})
