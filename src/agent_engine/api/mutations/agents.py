"""The owner's agent definitions: create, edit, delete, switch on or off, choose tools.

Permissions: owners change only their own agents (someone else's agent is NOT_FOUND to them).
Admins oversee but do not act as the owner: an agent reads the Knowledge Store with its owner's
access, so editing its prompt or choosing its tools is the owner's alone (FORBIDDEN to an admin on
another's agent), as is the owner's switch (`setAgentEnabled`). An admin deletes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import strawberry
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import admin as admin_service
from agent_engine.agents import definitions, deletion
from agent_engine.agents.errors import ModelMissing, ToolsNotAllowed, TooManyAgents, UnderReview
from agent_engine.api.access import is_owner
from agent_engine.api.errors import BadUserInput, Forbidden
from agent_engine.api.guards import (
    DESCRIPTION_MAX_CHARS,
    NAME_MAX_CHARS,
    PROMPT_MAX_CHARS,
    checked_meta,
    checked_text,
)
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import CreateAgentInput, UpdateAgentInput
from agent_engine.api.mutations.common import fresh_agent, owned_agent, transaction
from agent_engine.api.mutations.validation import parse_tool_ids, schedule_json, token_cap
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.agents import Agent


async def _change_tools(
    info: Info,
    agent_id: strawberry.ID,
    field: str,
    change: Callable[[AsyncConnection, int], Awaitable[None]],
) -> Agent:
    """The tool-selection mutations: the owner's agent, one transaction, a tool not allowed for
    agents is BAD_USER_INPUT on `field`. `change` parses its own tool ids, so they are checked
    after the agent (someone else's agent stays NOT_FOUND, FORBIDDEN to an admin)."""
    info.context.require_viewer()
    ident = parse_id(agent_id, "agentId")
    await owned_agent(info, ident, "choose its tools", owner_only=True)
    async with transaction(info) as conn:
        try:
            await change(conn, ident)
        except ToolsNotAllowed as exc:
            raise BadUserInput(field, str(exc)) from exc
        return await fresh_agent(info, conn, ident)


@strawberry.type
class AgentMutation:
    @described_mutation(
        description=(
            "Creates an agent owned by the viewer. At most AGENT_ENGINE_MAX_AGENTS_PER_OWNER "
            "agents per owner (BAD_USER_INPUT on input beyond it)."
        )
    )
    async def create_agent(self, info: Info, input: CreateAgentInput) -> Agent:
        viewer = info.context.require_viewer()
        draft = definitions.AgentDraft(
            name=checked_text("input.name", input.name, NAME_MAX_CHARS),
            prompt=checked_text("input.prompt", input.prompt, PROMPT_MAX_CHARS),
            description=(
                checked_text(
                    "input.description", input.description, DESCRIPTION_MAX_CHARS, allow_blank=True
                )
                if input.description is not None
                else None
            ),
            schedule=schedule_json(input.schedule, "input.schedule"),
            model_id=parse_id(input.model_id, "input.modelId") if input.model_id else None,
            tool_ids=parse_tool_ids(input.tool_ids or [], "input.toolIds"),
            enabled=input.enabled,
            meta=checked_meta("input.meta", input.meta),
            weekly_token_cap=token_cap("input.weeklyTokenCap", input.weekly_token_cap),
            max_tokens_per_run=token_cap("input.maxTokensPerRun", input.max_tokens_per_run),
        )
        async with transaction(info) as conn:
            try:
                agent_id = await definitions.create_agent(
                    conn,
                    viewer.user_id,
                    draft,
                    now=info.context.now,
                    max_agents=services(info)["settings"].max_agents_per_owner,
                )
            except TooManyAgents as exc:
                raise BadUserInput("input", str(exc)) from exc
            except ModelMissing as exc:
                raise BadUserInput("input.modelId", str(exc)) from exc
            except ToolsNotAllowed as exc:
                raise BadUserInput("input.toolIds", str(exc)) from exc
            return await fresh_agent(info, conn, agent_id)

    @described_mutation(description="The owner only: FORBIDDEN to an admin on another's agent.")
    async def update_agent(self, info: Info, id: strawberry.ID, input: UpdateAgentInput) -> Agent:
        info.context.require_viewer()
        agent_id = parse_id(id, "id")
        await owned_agent(info, agent_id, "edit it", owner_only=True)
        changes: dict[str, Any] = {}
        if input.name is not strawberry.UNSET:
            if input.name is None:
                raise BadUserInput("input.name", "cannot be null")
            changes["name"] = checked_text("input.name", input.name, NAME_MAX_CHARS)
        if input.prompt is not strawberry.UNSET:
            if input.prompt is None:
                raise BadUserInput("input.prompt", "cannot be null")
            changes["prompt"] = checked_text("input.prompt", input.prompt, PROMPT_MAX_CHARS)
        if input.description is not strawberry.UNSET:
            changes["description"] = (
                checked_text(
                    "input.description", input.description, DESCRIPTION_MAX_CHARS, allow_blank=True
                )
                if input.description is not None
                else None
            )
        if input.schedule is not strawberry.UNSET:
            changes["schedule"] = schedule_json(input.schedule, "input.schedule")
        if input.model_id is not strawberry.UNSET:
            if input.model_id is None:
                raise BadUserInput("input.modelId", "cannot be null: pick a model from the list")
            changes["model_id"] = parse_id(input.model_id, "input.modelId")
        if input.meta is not strawberry.UNSET:
            changes["meta"] = checked_meta("input.meta", input.meta)
        if input.weekly_token_cap is not strawberry.UNSET:
            changes["weekly_token_cap"] = token_cap("input.weeklyTokenCap", input.weekly_token_cap)
        if input.max_tokens_per_run is not strawberry.UNSET:
            changes["max_tokens_per_run"] = token_cap(
                "input.maxTokensPerRun", input.max_tokens_per_run
            )
        async with transaction(info) as conn:
            if changes:
                try:
                    await definitions.update_agent(conn, agent_id, changes, now=info.context.now)
                except ModelMissing as exc:
                    raise BadUserInput("input.modelId", str(exc)) from exc
            return await fresh_agent(info, conn, agent_id)

    @described_mutation(
        description=(
            "Returns the deleted agent's id; its runs and tool links go with it. The agent "
            "vanishes from every view at once and never runs again; runs that count in this "
            "week's budget keep counting (the row stays hidden until they no longer can)."
        )
    )
    async def delete_agent(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_viewer()
        agent_id = parse_id(id, "id")
        found = await owned_agent(info, agent_id, "delete it")
        async with transaction(info) as conn:
            try:
                await deletion.delete_agent(
                    conn,
                    agent_id,
                    now=info.context.now,
                    by_admin=viewer.is_admin,
                    database_clock=True,
                    actor_id=viewer.user_id,
                )
            except UnderReview as exc:
                raise Forbidden(str(exc), lock="ADMIN_PAUSED") from exc
            if not is_owner(viewer, found.user_id) or found.admin_paused:
                # An admin deleting another's agent, or one under review: audited.
                await admin_service.record_agent_deleted(
                    conn,
                    agent_id,
                    owner_id=found.user_id,
                    name=found.name,
                    actor_id=viewer.user_id,
                )
        info.context.loaders.forget_agent(agent_id)
        return strawberry.ID(str(agent_id))

    @described_mutation(
        description="The owner's switch. Owners only: an admin uses setAdminPaused."
    )
    async def set_agent_enabled(self, info: Info, id: strawberry.ID, enabled: bool) -> Agent:
        info.context.require_viewer()
        agent_id = parse_id(id, "id")
        await owned_agent(
            info, agent_id, "switch it on or off (admins use setAdminPaused)", owner_only=True
        )
        async with transaction(info) as conn:
            await definitions.update_agent(
                conn, agent_id, {"enabled": enabled}, now=info.context.now
            )
            return await fresh_agent(info, conn, agent_id)

    @described_mutation(
        description=(
            "Replaces the optional-tool selection. Every tool must be allowed for agents now, "
            "including ones the agent already has: a tool an admin has since disallowed is "
            "refused (BAD_USER_INPUT on toolIds) and must be left out. Owner only."
        )
    )
    async def set_agent_tools(
        self, info: Info, agent_id: strawberry.ID, tool_ids: list[strawberry.ID]
    ) -> Agent:
        return await _change_tools(
            info,
            agent_id,
            "toolIds",
            lambda conn, ident: definitions.set_agent_tools(
                conn, ident, parse_tool_ids(tool_ids, "toolIds")
            ),
        )

    @described_mutation(
        description=("Adds one optional tool; it must be allowed for agents now. The owner only.")
    )
    async def attach_tool(
        self, info: Info, agent_id: strawberry.ID, tool_id: strawberry.ID
    ) -> Agent:
        return await _change_tools(
            info,
            agent_id,
            "toolId",
            lambda conn, ident: definitions.attach_tool(conn, ident, parse_id(tool_id, "toolId")),
        )

    @described_mutation(
        description="Removes one optional tool, also one an admin has disallowed. The owner only."
    )
    async def detach_tool(
        self, info: Info, agent_id: strawberry.ID, tool_id: strawberry.ID
    ) -> Agent:
        return await _change_tools(
            info,
            agent_id,
            "toolId",
            lambda conn, ident: definitions.detach_tool(conn, ident, parse_id(tool_id, "toolId")),
        )
