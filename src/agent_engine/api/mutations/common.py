"""What every mutation shares: one transaction whose refusals become coded errors, the agent the
viewer may change, and the fresh agent a mutation returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Contended, Missing
from agent_engine.api.access import is_owner, may_see
from agent_engine.api.errors import Conflict, Forbidden, NotFound
from agent_engine.api.resolvers import Info
from agent_engine.api.state import services
from agent_engine.api.types.agents import Agent
from agent_engine.db.agents import AgentRow, fetch_live_agent


@asynccontextmanager
async def transaction(info: Info) -> AsyncIterator[AsyncConnection]:
    """One transaction per mutation; the service's refusals become coded errors."""
    try:
        async with services(info)["engine"].begin() as conn:
            yield conn
    except Missing as exc:
        raise NotFound(exc.what, exc.ident) from exc
    except Contended as exc:
        raise Conflict(str(exc)) from exc
    except IntegrityError as exc:
        # A concurrent write removed or changed a referenced row between our checks and writes.
        raise Conflict("the data changed concurrently; reload and retry") from exc
    except DBAPIError as exc:
        # PostgreSQL chose this transaction as a deadlock's (or serialization's) victim: nothing
        # was written, the client may simply try again.
        if not contended(exc):
            raise
        raise Conflict("a concurrent change got in the way; nothing was written, retry") from exc


# Deadlock detected, serialization failure: the transaction was rolled back, a retry may succeed.
_CONTENDED_SQLSTATES = frozenset({"40P01", "40001"})
CONTENDED_RETRIES = 3


def contended(exc: BaseException) -> bool:
    """Whether the database rolled the transaction back for a concurrent one (worth a retry)."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) in _CONTENDED_SQLSTATES:
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__  # type: ignore[assignment]
    return False


async def fresh_agent(info: Info, conn: AsyncConnection, agent_id: int) -> Agent:
    row = await fetch_live_agent(conn, agent_id)
    if row is None:  # deleted by a concurrent request meanwhile
        raise Missing("agent", agent_id)
    info.context.loaders.forget_agent(agent_id)
    info.context.loaders.prime_agent(row)
    return Agent.from_row(row, info.context.loaders)


async def owned_agent(
    info: Info, agent_id: int, action: str, *, owner_only: bool = False
) -> AgentRow:
    """The agent if the viewer may change it: its owner, or an admin unless `owner_only`.
    NOT_FOUND to other owners (existence is not leaked), FORBIDDEN to an admin if `owner_only`.

    Read outside the request's loaders: a change must be checked against the current row."""
    viewer = info.context.require_viewer()
    async with services(info)["engine"].connect() as conn:
        found = await fetch_live_agent(conn, agent_id)
    if found is None or not may_see(viewer, found.user_id):
        raise NotFound("agent", agent_id)
    if owner_only and not is_owner(viewer, found.user_id):
        raise Forbidden(f"only the agent's owner can {action}")
    return found
