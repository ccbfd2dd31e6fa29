"""Delivery targets: the admin's list, and the owner's choice of targets per agent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import DefinitionError, Missing


@dataclass(frozen=True)
class TargetDraft:
    name: str
    url: str
    secret_env: str
    enabled: bool


class TargetsNotAvailable(DefinitionError):
    """Targets that do not exist or are disabled: an owner can attach enabled targets only."""

    def __init__(self, target_ids: list[int]) -> None:
        listed = ", ".join(str(t) for t in target_ids)
        super().__init__(f"delivery targets not available: {listed}")
        self.target_ids = target_ids


_INSERT = text(
    "INSERT INTO delivery_targets (name, url, secret_env, enabled)"
    " VALUES (:name, :url, :secret_env, :enabled) RETURNING id"
)
_UPDATE = text(
    "UPDATE delivery_targets SET name = :name, url = :url, secret_env = :secret_env,"
    " enabled = :enabled, updated_at = now() WHERE id = :id RETURNING id"
)
_DELETE = text("DELETE FROM delivery_targets WHERE id = :id RETURNING id")
_ENABLED = text(
    "SELECT id FROM delivery_targets WHERE id = ANY(CAST(:ids AS bigint[])) AND enabled"
)
_CLEAR = text("DELETE FROM agent_delivery_targets WHERE agent_id = :agent_id")
_ATTACH = text(
    "INSERT INTO agent_delivery_targets (agent_id, target_id)"
    " SELECT :agent_id, unnest(CAST(:ids AS bigint[])) ON CONFLICT DO NOTHING"
)


async def upsert_target(conn: AsyncConnection, target_id: int | None, draft: TargetDraft) -> int:
    params = {
        "id": target_id,
        "name": draft.name,
        "url": draft.url,
        "secret_env": draft.secret_env,
        "enabled": draft.enabled,
    }
    if target_id is None:
        return int((await conn.execute(_INSERT, params)).scalar_one())
    found = (await conn.execute(_UPDATE, params)).scalar_one_or_none()
    if found is None:
        raise Missing("delivery target", target_id)
    return int(found)


async def remove_target(conn: AsyncConnection, target_id: int) -> None:
    """Agents lose it from their selection (and its deliveries go with it: FK CASCADE)."""
    if (await conn.execute(_DELETE, {"id": target_id})).scalar_one_or_none() is None:
        raise Missing("delivery target", target_id)


async def set_agent_targets(
    conn: AsyncConnection, agent_id: int, target_ids: Sequence[int]
) -> None:
    """Replace the agent's targets; every one must exist and be enabled now."""
    wanted = sorted(set(target_ids))
    if wanted:
        # Locks nothing: a target disabled a moment later still receives; one removed a moment
        # later makes the insert fail on its foreign key (a CONFLICT for the caller).
        enabled = {int(r.id) for r in await conn.execute(_ENABLED, {"ids": wanted})}
        refused = [t for t in wanted if t not in enabled]
        if refused:
            raise TargetsNotAvailable(refused)
    await conn.execute(_CLEAR, {"agent_id": agent_id})
    if wanted:
        await conn.execute(_ATTACH, {"agent_id": agent_id, "ids": wanted})
