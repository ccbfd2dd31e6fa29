"""The audit log as the API shows it."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.pagination import Connection
from agent_engine.api.resolvers import Info, described
from agent_engine.api.types.users import User, user_or_none
from agent_engine.db.audit import AuditRow


@strawberry.type
class AuditEntry:
    entry: strawberry.Private[AuditRow]
    id: strawberry.ID
    at: datetime
    action: str = strawberry.field(
        description=(
            "e.g. agent.admin_paused, agent.admin_unpaused, agent.deleted, user.deactivated, "
            "user.reactivated, model.upserted, model.removed, tool.allowed, tool.disallowed, "
            "settings.updated, delivery_target.upserted"
        )
    )
    agent_id: strawberry.ID | None
    user_id: strawberry.ID | None
    details: JSON | None

    @classmethod
    def from_row(cls, entry: AuditRow) -> AuditEntry:
        def ident(value: int | None) -> strawberry.ID | None:
            return strawberry.ID(str(value)) if value is not None else None

        return cls(
            entry=entry,
            id=strawberry.ID(str(entry.id)),
            at=entry.at,
            action=entry.action,
            agent_id=ident(entry.agent_id),
            user_id=ident(entry.user_id),
            details=entry.details,
        )

    @described(description="The user who did it; null for the engine itself.")
    async def actor(self, info: Info) -> User | None:
        if self.entry.actor_id is None:
            return None
        return await user_or_none(info, self.entry.actor_id)


AuditEntryConnection = Connection[AuditEntry]
