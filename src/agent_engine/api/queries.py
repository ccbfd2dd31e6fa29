"""Query fields. Owners see their own agents and runs; someone else's is NOT_FOUND (existence is
not leaked); admins see everything, and the admin-only fields are FORBIDDEN to others."""

from __future__ import annotations

from datetime import datetime

import strawberry

from agent_engine.api.access import visible_agent, visible_run
from agent_engine.api.context import Context
from agent_engine.api.enums import AgentStatus
from agent_engine.api.guards import checked_instant, page_size
from agent_engine.api.ids import decode_cursor, parse_id
from agent_engine.api.mutations.connections import viewer_connections
from agent_engine.api.resolvers import Info, described
from agent_engine.api.state import services
from agent_engine.api.types.agents import (
    Agent,
    AgentConnection,
    Run,
    RunConnection,
    ToolApproval,
    ToolApprovalConnection,
)
from agent_engine.api.types.audit import AuditEntry, AuditEntryConnection
from agent_engine.api.types.budget import BudgetAlert, OwnerSpend
from agent_engine.api.types.catalog import AgentModel, PlatformSettings, Tool, ToolSource
from agent_engine.api.types.connections import ToolConnection
from agent_engine.api.types.delivery import DeliveryTarget
from agent_engine.api.types.viewer import Viewer
from agent_engine.db import agents as agents_db
from agent_engine.db import approvals as approvals_db
from agent_engine.db import audit as audit_db
from agent_engine.db import catalog, deliveries
from agent_engine.db import runs as runs_db
from agent_engine.db import tool_sources as tool_sources_db
from agent_engine.db.alerts import newest_alerts
from agent_engine.db.runs import RunRow
from agent_engine.db.spend import spend_by_owner
from agent_engine.domain import gate
from agent_engine.domain.budget import week_window
from agent_engine.domain.mcp import ApprovalStatus
from agent_engine.domain.runs import RunState


def _journal_node(entry: tuple[RunRow, int]) -> Run:
    row, owner_id = entry
    return Run.from_row(row, owner_id=owner_id)


@strawberry.type
class Query:
    @strawberry.field
    def viewer(self, info: Info) -> Viewer:
        viewer = info.context.require_viewer()
        return Viewer(viewer_id=viewer.user_id, is_admin=viewer.is_admin)

    @strawberry.field
    async def agent(self, info: Info, id: strawberry.ID) -> Agent | None:
        info.context.require_viewer()
        return Agent.from_row(await visible_agent(info, parse_id(id, "id")), info.context.loaders)

    @strawberry.field
    async def run(self, info: Info, id: strawberry.ID) -> Run | None:
        info.context.require_viewer()
        row, owner_id = await visible_run(info, parse_id(id, "id"))
        return Run.from_row(row, owner_id=owner_id)

    @described(description="The admin's allowed list.")
    async def agent_models(self, info: Info) -> list[AgentModel]:
        info.context.require_viewer()
        async with services(info)["engine"].connect() as conn:
            rows = await catalog.all_models(conn)
        return [AgentModel.from_row(r) for r in rows]

    @described(description="Optional tools an owner may attach now (agentsAllowed = true).")
    async def tools(self, info: Info) -> list[Tool]:
        info.context.require_viewer()
        async with services(info)["engine"].connect() as conn:
            rows = await catalog.list_tools(conn, allowed_only=True)
        return [Tool.from_row(r) for r in rows]

    @described(description="Admin only. Every agent, newest first.")
    async def admin_agents(
        self,
        info: Info,
        first: int = 50,
        after: str | None = None,
        owner_id: strawberry.ID | None = None,
        status: AgentStatus | None = None,
    ) -> AgentConnection:
        info.context.require_admin()
        size = page_size(first)
        cursor = decode_cursor("agent", after)
        owner = parse_id(owner_id, "ownerId") if owner_id is not None else None
        async with services(info)["engine"].connect() as conn:
            rows = await agents_db.live_agent_page(
                conn,
                limit=size + 1,  # one more tells hasNextPage
                after=cursor,
                owner_id=owner,
                status=gate.AgentStatus[status.name] if status is not None else None,
            )
        loaders = info.context.loaders
        for row in rows:
            loaders.prime_agent(row)
        return AgentConnection.from_rows(
            rows, size, kind="agent", node=lambda row: Agent.from_row(row, loaders)
        )

    @described(description="Admin only. The whole journal, newest first.")
    async def admin_runs(
        self,
        info: Info,
        first: int = 50,
        after: str | None = None,
        agent_id: strawberry.ID | None = None,
        states: list[RunState] | None = None,
    ) -> RunConnection:
        info.context.require_admin()
        size = page_size(first)
        cursor = decode_cursor("run", after)
        agent = parse_id(agent_id, "agentId") if agent_id is not None else None
        async with services(info)["engine"].connect() as conn:
            entries = await runs_db.journal_page(
                conn,
                limit=size + 1,  # one more tells hasNextPage
                after=cursor,
                agent_id=agent,
                states=states,
            )
        return RunConnection.from_rows(entries, size, kind="run", node=_journal_node)

    @described(description="Admin only. All catalog tools, allowed or not.")
    async def admin_tools(self, info: Info) -> list[Tool]:
        info.context.require_admin()
        async with services(info)["engine"].connect() as conn:
            rows = await catalog.list_tools(conn, allowed_only=False)
        return [Tool.from_row(r) for r in rows]

    @described(
        description=(
            "The viewer's approvals, newest first (admins: every owner's, without inputs)."
        )
    )
    async def tool_approvals(
        self,
        info: Info,
        first: int = 50,
        after: str | None = None,
        status: ApprovalStatus | None = None,
    ) -> ToolApprovalConnection:
        viewer = info.context.require_viewer()
        size = page_size(first)
        cursor = decode_cursor("approval", after)
        async with services(info)["engine"].connect() as conn:
            rows = await approvals_db.page(
                conn,
                owner_id=None if viewer.is_admin else viewer.user_id,
                status=None if status is None else str(status),
                before_id=cursor,
                limit=size + 1,
            )
        return ToolApprovalConnection.from_rows(
            rows, size, kind="approval", node=ToolApproval.from_row
        )

    @described(
        description=(
            "The viewer's accounts: one per enabled OWNER_OAUTH source (NOT_CONNECTED where they "
            "have none)."
        )
    )
    async def tool_connections(self, info: Info) -> list[ToolConnection]:
        return await viewer_connections(info)

    @described(description="The MCP sources (admin only).")
    async def tool_sources(self, info: Info) -> list[ToolSource]:
        info.context.require_admin()
        async with services(info)["engine"].connect() as conn:
            rows = await tool_sources_db.all_sources(conn)
        return [ToolSource.from_row(r) for r in rows]

    @described(
        description=(
            "Delivery targets: admins see all, with url and secretEnv; owners see the enabled "
            "ones (url and secretEnv null)."
        )
    )
    async def delivery_targets(self, info: Info) -> list[DeliveryTarget]:
        viewer = info.context.require_viewer()
        async with services(info)["engine"].connect() as conn:
            rows = await deliveries.list_targets(conn, enabled_only=not viewer.is_admin)
        return [DeliveryTarget.from_row(r, admin=viewer.is_admin) for r in rows]

    @described(description="Admin only.")
    async def platform_settings(self, info: Info) -> PlatformSettings:
        info.context.require_admin()
        return PlatformSettings.from_value(await info.context.loaders.platform())

    @described(
        description=(
            "Admin only. Budget alerts, newest first; `after` is the id of the last alert already "
            "seen, `ownerId` keeps one owner's."
        )
    )
    async def admin_budget_alerts(
        self,
        info: Info,
        first: int = 50,
        after: str | None = None,
        owner_id: strawberry.ID | None = None,
    ) -> list[BudgetAlert]:
        info.context.require_admin()
        async with services(info)["engine"].connect() as conn:
            alerts = await newest_alerts(
                conn,
                limit=page_size(first),
                after=parse_id(after, "after") if after is not None else None,
                owner_id=parse_id(owner_id, "ownerId") if owner_id is not None else None,
            )
        return [BudgetAlert.from_value(alert) for alert in alerts]

    @described(
        description=(
            "Admin only. Spend per owner for the budget week that contains windowStart "
            "(default: this week), most tokens first."
        )
    )
    async def admin_spend(
        self, info: Info, window_start: datetime | None = None
    ) -> list[OwnerSpend]:
        info.context.require_admin()
        if window_start is not None:
            window_start = checked_instant("windowStart", window_start)
        platform = await info.context.loaders.platform()
        window = week_window(window_start or info.context.now, platform.zone)
        async with services(info)["engine"].connect() as conn:
            spend = await spend_by_owner(conn, window=window)
        return [OwnerSpend.from_value(value) for value in spend]

    @described(
        description=(
            "Admin only. The audit log of admin actions, newest first: by agent, by the user "
            "acted on (an agent's owner for actions on agents), or by the admin who acted."
        )
    )
    async def admin_audit_log(
        self,
        info: Info,
        first: int = 50,
        after: str | None = None,
        agent_id: strawberry.ID | None = None,
        user_id: strawberry.ID | None = None,
        actor_id: strawberry.ID | None = None,
    ) -> AuditEntryConnection:
        info.context.require_admin()
        size = page_size(first)
        where = audit_db.AuditFilter(
            agent_id=parse_id(agent_id, "agentId") if agent_id is not None else None,
            user_id=parse_id(user_id, "userId") if user_id is not None else None,
            actor_id=parse_id(actor_id, "actorId") if actor_id is not None else None,
        )
        cursor = decode_cursor("audit", after)
        async with services(info)["engine"].connect() as conn:
            rows = await audit_db.fetch_page(conn, first=size, after=cursor, where=where)
        return AuditEntryConnection.from_rows(rows, size, kind="audit", node=AuditEntry.from_row)


__all__ = ["Context", "Query"]
