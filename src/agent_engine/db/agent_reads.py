"""The `agents` row and the reads the API makes of it: one agent, agents by id, an owner's
agents (narrow or whole), the keyset-paged list with its derived-status filter.

The statements that change agents live in `db/agents.py`, which re-exports these names.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db.rows import AnyRow, columns, narrow, read_rows
from agent_engine.domain.gate import AgentStatus


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One `agents` row."""

    id: int
    user_id: int
    name: str
    description: str | None
    prompt: str
    schedule: dict[str, Any] | None
    model_id: int | None
    enabled: bool
    admin_paused: bool
    admin_pause_note: str | None
    next_run_at: datetime | None
    meta: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    # The owner's caps on the agent's tokens (None: none): per budget week, per run.
    weekly_token_cap: int | None
    max_tokens_per_run: int | None

    @classmethod
    def from_row(cls, row: AnyRow) -> AgentRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            user_id=int(values["user_id"]),
            name=values["name"],
            description=values["description"],
            prompt=values["prompt"],
            schedule=values["schedule"],
            model_id=values["model_id"],
            enabled=bool(values["enabled"]),
            admin_paused=bool(values["admin_paused"]),
            admin_pause_note=values["admin_pause_note"],
            next_run_at=values["next_run_at"],
            meta=values["meta"],
            created_at=values["created_at"],
            updated_at=values["updated_at"],
            deleted_at=values["deleted_at"],
            weekly_token_cap=values["weekly_token_cap"],
            max_tokens_per_run=values["max_tokens_per_run"],
        )


# --- reads for the API ------------------------------------------------------------------------

# Hidden (deleted) agents are in no view; only the budget sum still reads them.
LIVE_AGENT = text("SELECT * FROM agents WHERE id = :id AND deleted_at IS NULL")
LIVE_AGENTS_BY_ID = text(
    "SELECT * FROM agents WHERE id = ANY(CAST(:ids AS bigint[])) AND deleted_at IS NULL"
)
# Hidden ones included: the agent as it was, for a row read just before its agent was hidden.
AGENTS_AS_THEY_WERE = text("SELECT * FROM agents WHERE id = ANY(CAST(:ids AS bigint[]))")
_LIVE_AGENTS_OF_OWNERS = (
    "SELECT {columns} FROM agents WHERE user_id = ANY(CAST(:ids AS bigint[]))"
    " AND deleted_at IS NULL ORDER BY id"
)
# What a narrow read of agents always has: the key, the owner and the model (a page's relations
# are found by them).
_NARROW_AGENT_KEYS = ("id", "user_id", "model_id")


@functools.lru_cache(maxsize=64)
def _live_agents_of_owners(columns: tuple[str, ...] | None) -> TextClause:
    return text(
        _LIVE_AGENTS_OF_OWNERS.format(columns="*" if columns is None else ", ".join(columns))
    )


# Derived status as SQL, the same precedence as domain.gate.agent_status.
_STATUS_SQL = {
    AgentStatus.ADMIN_PAUSED: "admin_paused",
    AgentStatus.DISABLED: "NOT admin_paused AND NOT enabled",
    AgentStatus.NO_MODEL: "NOT admin_paused AND enabled AND model_id IS NULL",
    AgentStatus.SCHEDULED: (
        "NOT admin_paused AND enabled AND model_id IS NOT NULL AND schedule IS NOT NULL"
    ),
    AgentStatus.MANUAL: (
        "NOT admin_paused AND enabled AND model_id IS NOT NULL AND schedule IS NULL"
    ),
}


async def fetch_live_agent(conn: AsyncConnection, agent_id: int) -> AgentRow | None:
    row = (await conn.execute(LIVE_AGENT, {"id": agent_id})).mappings().one_or_none()
    return None if row is None else AgentRow.from_row(row)


async def live_agents_by_id(conn: AsyncConnection, agent_ids: Sequence[int]) -> list[AgentRow]:
    rows = await conn.execute(LIVE_AGENTS_BY_ID, {"ids": list(agent_ids)})
    return read_rows(rows, AgentRow)


async def agents_as_they_were(conn: AsyncConnection, agent_ids: Sequence[int]) -> list[AgentRow]:
    """The agents, hidden ones included (`deleted_at` set): what a run or an approval read before
    the deletion shows as its agent."""
    rows = await conn.execute(AGENTS_AS_THEY_WERE, {"ids": list(agent_ids)})
    return read_rows(rows, AgentRow)


async def live_agents_of_owners(
    conn: AsyncConnection, owner_ids: Sequence[int], columns: Collection[str] | None = None
) -> list[AgentRow]:
    """The owners' live agents, oldest first.

    With `columns`, each row is read narrow: only those columns and the key, owner and model;
    reading any other attribute of such a row raises AttributeError (`read_rows(partial=True)`).
    """
    chosen = None if columns is None else narrow(AgentRow, columns, always=_NARROW_AGENT_KEYS)
    statement = _live_agents_of_owners(chosen)
    rows = await direct.fetch(conn, statement, {"ids": list(owner_ids)})
    return read_rows(rows, AgentRow, partial=chosen is not None)


async def live_agent_page(
    conn: AsyncConnection,
    *,
    limit: int,
    after: int | None = None,
    owner_id: int | None = None,
    status: AgentStatus | None = None,
) -> list[AgentRow]:
    """Live agents, newest first, keyset-paged by id, optionally one owner's or one status's."""
    where = ["deleted_at IS NULL"]
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        where.append("id < :after")
        params["after"] = after
    if owner_id is not None:
        where.append("user_id = :owner")
        params["owner"] = owner_id
    if status is not None:
        where.append(f"({_STATUS_SQL[status]})")
    statement = text(
        f"SELECT * FROM agents WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT :limit"
    )
    return read_rows(await conn.execute(statement, params), AgentRow)
