"""What every mutation shares: one transaction whose refusals become coded errors, the agent the
viewer may change, and the fresh agent a mutation returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Contended, Missing
from agent_engine.api.access import is_owner, may_see
from agent_engine.api.errors import Conflict, Forbidden, NotFound
from agent_engine.api.loaders import Row
from agent_engine.api.resolvers import Info
from agent_engine.api.types.agents import Agent


@asynccontextmanager
async def transaction(info: Info) -> AsyncIterator[AsyncConnection]:
    """One transaction per mutation; the service's refusals become coded errors."""
    try:
        async with info.context.engine.begin() as conn:
            yield conn
    except Missing as exc:
        raise NotFound(exc.what, exc.ident) from exc
    except Contended as exc:
        raise Conflict(str(exc)) from exc
    except IntegrityError as exc:
        # A concurrent write removed or changed a referenced row between our checks and writes.
        raise Conflict("the data changed concurrently; reload and retry") from exc


_LIVE_AGENT = text("SELECT * FROM agents WHERE id = :id AND deleted_at IS NULL")


async def fresh_agent(info: Info, conn: AsyncConnection, agent_id: int) -> Agent:
    found = (await conn.execute(_LIVE_AGENT, {"id": agent_id})).mappings().one_or_none()
    if found is None:  # deleted by a concurrent request meanwhile
        raise Missing("agent", agent_id)
    row = dict(found)
    info.context.loaders.forget_agent(agent_id)
    info.context.loaders.prime_agent(row)
    return Agent.from_row(row)


async def owned_agent(info: Info, agent_id: int, action: str, *, owner_only: bool = False) -> Row:
    """The agent if the viewer may change it: its owner, or an admin unless `owner_only`.
    NOT_FOUND to other owners (existence is not leaked), FORBIDDEN to an admin if `owner_only`.

    Read outside the request's loaders: a change must be checked against the current row."""
    viewer = info.context.require_viewer()
    async with info.context.engine.connect() as conn:
        found = (await conn.execute(_LIVE_AGENT, {"id": agent_id})).mappings().one_or_none()
    if found is None or not may_see(viewer, found["user_id"]):
        raise NotFound("agent", agent_id)
    if owner_only and not is_owner(viewer, found["user_id"]):
        raise Forbidden(f"only the agent's owner can {action}")
    return dict(found)
