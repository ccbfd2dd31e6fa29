"""Delivery targets: the admin's list, and the owner's choice of targets per agent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import DefinitionError, Missing
from agent_engine.db import deliveries


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


async def upsert_target(conn: AsyncConnection, target_id: int | None, draft: TargetDraft) -> int:
    name, url, secret_env, enabled = draft.name, draft.url, draft.secret_env, draft.enabled
    if target_id is None:
        return await deliveries.insert_target(
            conn, name=name, url=url, secret_env=secret_env, enabled=enabled
        )
    if not await deliveries.update_target(
        conn, target_id, name=name, url=url, secret_env=secret_env, enabled=enabled
    ):
        raise Missing("delivery target", target_id)
    return target_id


async def remove_target(conn: AsyncConnection, target_id: int) -> None:
    """Agents lose it from their selection (and its deliveries go with it: FK CASCADE)."""
    if not await deliveries.delete_target(conn, target_id):
        raise Missing("delivery target", target_id)


async def set_agent_targets(
    conn: AsyncConnection, agent_id: int, target_ids: Sequence[int]
) -> None:
    """Replace the agent's targets; every one must exist and be enabled now."""
    wanted = sorted(set(target_ids))
    if wanted:
        # Locks nothing: a target disabled a moment later still receives; one removed a moment
        # later makes the insert fail on its foreign key (a CONFLICT for the caller).
        enabled = await deliveries.enabled_targets(conn, wanted)
        refused = [t for t in wanted if t not in enabled]
        if refused:
            raise TargetsNotAvailable(refused)
    await deliveries.replace_agent_targets(conn, agent_id, wanted)
