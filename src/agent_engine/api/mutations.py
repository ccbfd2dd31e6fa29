"""Mutation fields: parse and check the input, call one function of `agent_engine.agents` (or the
run lifecycle), return the fresh row.

Permissions: owners change only their own agents (someone else's agent is NOT_FOUND to them).
Admins oversee but do not act as the owner: an agent reads the Knowledge Store with its owner's
access, so editing its prompt, starting it or choosing its tools is the owner's alone (FORBIDDEN
to an admin on another's agent), as is the owner's switch (`setAgentEnabled`). An admin pauses
(`setAdminPaused`) and deletes. The admin-only mutations are FORBIDDEN to owners.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import strawberry
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import admin as admin_service
from agent_engine.agents import audit, definitions, deletion
from agent_engine.agents.errors import (
    Contended,
    Missing,
    ModelMissing,
    ToolsNotAllowed,
    TooManyAgents,
)
from agent_engine.api.errors import (
    BadUserInput,
    Conflict,
    Forbidden,
    NotFound,
    StartRefused,
)
from agent_engine.api.guards import (
    BASE_URL_MAX_CHARS,
    DESCRIPTION_MAX_CHARS,
    MAX_CONCURRENT_RUNS,
    MAX_ITERATION_CAP,
    MAX_TOOL_IDS,
    MODEL_FIELD_MAX_CHARS,
    NAME_MAX_CHARS,
    PLATFORM_PROMPT_MAX_CHARS,
    PROMPT_MAX_CHARS,
    checked_meta,
    checked_text,
)
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import (
    AgentModelInput,
    CreateAgentInput,
    DeliveryTargetInput,
    PlatformSettingsInput,
    ScheduleInput,
    UpdateAgentInput,
)
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.types.agents import Agent, Run
from agent_engine.api.types.catalog import AgentModel, PlatformSettings, Tool
from agent_engine.api.types.delivery import DeliveryTarget
from agent_engine.api.types.users import User
from agent_engine.db.models.agents import ADMIN_PAUSE_NOTE_MAX_CHARS
from agent_engine.db.platform import load_platform_settings
from agent_engine.delivery import targets as delivery_targets
from agent_engine.domain.budget import AlertPercentsError, parse_alert_percents
from agent_engine.domain.delivery import secret_env_problem, target_url_problem
from agent_engine.domain.gate import AgentNotStartable
from agent_engine.domain.money import MoneyError, parse_currency, parse_price
from agent_engine.domain.retention import MAX_RETENTION_DAYS, MIN_RETENTION_DAYS
from agent_engine.domain.runs import RunTrigger
from agent_engine.domain.schedule import ScheduleError, parse_schedule, schedule_to_json
from agent_engine.runs import cancel as run_cancel
from agent_engine.runs import model_slots
from agent_engine.runs import request as run_request

Row = dict[str, Any]

PROVIDERS = ("openai", "builtin")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MAX_TOKEN_CAP = 2**62
# Query parameters that carry a credential (`?api_key=…`, `?token=…`, `?sig=…`).
_SECRET_QUERY_NAME = re.compile(r"key|token|secret|passw|signature|credential|^sig$", re.I)
MAX_DELIVERY_TARGET_IDS = 20


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def schedule_json(value: ScheduleInput | None, field: str) -> dict[str, Any] | None:
    """The input's variant through the domain's Schedule union; errors name the input field."""
    if value is None:
        return None
    raw: dict[str, Any]
    if value.interval:
        variant = "interval"
        raw = {"type": "interval", "every_hours": value.interval.every_hours}
    elif value.calendar:
        variant = "calendar"
        calendar = value.calendar
        raw = {"type": "calendar", "cadence": calendar.cadence.value, "time": calendar.time}
        if calendar.weekday is not None:
            raw["weekday"] = calendar.weekday
    else:  # the @oneOf rule makes this unreachable over GraphQL
        raise BadUserInput(field, "give exactly one of interval or calendar")
    try:
        parsed = parse_schedule(raw)
    except ScheduleError as exc:
        path = ".".join(_camel(p) for p in str(exc.field or "").split(".") if p and p != "type")
        raise BadUserInput(
            f"{field}.{variant}" + (f".{path}" if path else ""), exc.message
        ) from exc
    return schedule_to_json(parsed) if parsed is not None else None


def _tool_ids(values: list[strawberry.ID], field: str) -> list[int]:
    if len(values) > MAX_TOOL_IDS:
        raise BadUserInput(field, f"at most {MAX_TOOL_IDS} tools")
    return [parse_id(v, field) for v in values]


@asynccontextmanager
async def _transaction(info: Info) -> AsyncIterator[AsyncConnection]:
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


async def _fresh_agent(info: Info, conn: AsyncConnection, agent_id: int) -> Agent:
    found = (await conn.execute(_LIVE_AGENT, {"id": agent_id})).mappings().one_or_none()
    if found is None:  # deleted by a concurrent request meanwhile
        raise Missing("agent", agent_id)
    row = dict(found)
    info.context.loaders.forget_agent(agent_id)
    info.context.loaders.prime_agent(row)
    return Agent.from_row(row)


async def owned_agent(info: Info, agent_id: int, action: str, *, owner_only: bool = False) -> Row:
    """The agent if the viewer may change it: its owner, or an admin unless `owner_only`.
    NOT_FOUND to other owners (existence is not leaked), FORBIDDEN to an admin if `owner_only`."""
    viewer = info.context.require_viewer()
    async with info.context.engine.connect() as conn:
        found = (await conn.execute(_LIVE_AGENT, {"id": agent_id})).mappings().one_or_none()
    if found is None or (not viewer.is_admin and found["user_id"] != viewer.user_id):
        raise NotFound("agent", agent_id)
    if owner_only and found["user_id"] != viewer.user_id:
        raise Forbidden(f"only the agent's owner can {action}")
    return dict(found)


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
    async with _transaction(info) as conn:
        try:
            await change(conn, ident)
        except ToolsNotAllowed as exc:
            raise BadUserInput(field, str(exc)) from exc
        return await _fresh_agent(info, conn, ident)


@strawberry.type
class Mutation:
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
            tool_ids=_tool_ids(input.tool_ids or [], "input.toolIds"),
            enabled=input.enabled,
            meta=checked_meta("input.meta", input.meta),
        )
        async with _transaction(info) as conn:
            try:
                agent_id = await definitions.create_agent(
                    conn,
                    viewer.user_id,
                    draft,
                    now=info.context.now,
                    max_agents=info.context.settings.max_agents_per_owner,
                )
            except TooManyAgents as exc:
                raise BadUserInput("input", str(exc)) from exc
            except ModelMissing as exc:
                raise BadUserInput("input.modelId", str(exc)) from exc
            except ToolsNotAllowed as exc:
                raise BadUserInput("input.toolIds", str(exc)) from exc
            return await _fresh_agent(info, conn, agent_id)

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
        async with _transaction(info) as conn:
            if changes:
                try:
                    await definitions.update_agent(conn, agent_id, changes, now=info.context.now)
                except ModelMissing as exc:
                    raise BadUserInput("input.modelId", str(exc)) from exc
            return await _fresh_agent(info, conn, agent_id)

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
        async with _transaction(info) as conn:
            await deletion.delete_agent(conn, agent_id, now=info.context.now)
            if found["user_id"] != viewer.user_id:  # an admin deleting someone else's: audited
                await admin_service.record_agent_deleted(
                    conn,
                    agent_id,
                    owner_id=int(found["user_id"]),
                    name=found["name"],
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
        async with _transaction(info) as conn:
            await definitions.update_agent(
                conn, agent_id, {"enabled": enabled}, now=info.context.now
            )
            return await _fresh_agent(info, conn, agent_id)

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
                conn, ident, _tool_ids(tool_ids, "toolIds")
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

    @described_mutation(
        description=(
            "Requests a manual run. Returns the journal row: QUEUED, or SKIPPED with its reason. "
            "A closed start gate is an AGENT_NOT_STARTABLE error and writes no row. The owner "
            "only: FORBIDDEN to an admin on another's agent (it reads the Knowledge Store as "
            "its owner)."
        )
    )
    async def start_run(self, info: Info, agent_id: strawberry.ID) -> Run:
        info.context.require_viewer()
        ident = parse_id(agent_id, "agentId")
        agent = await owned_agent(info, ident, "start it", owner_only=True)
        try:
            row = await run_request.request_run(
                info.context.engine,
                ident,
                trigger=RunTrigger.MANUAL,
                now=info.context.now,
                enqueue=info.context.enqueue,
                send_wait_seconds=info.context.settings.broker_timeout_seconds,
            )
        except run_request.AgentNotFound as exc:
            raise NotFound("agent", ident) from exc
        except AgentNotStartable as exc:
            raise StartRefused(exc) from exc
        return Run.from_row(row, owner_id=int(agent["user_id"]))

    @described_mutation(
        description=(
            "Stops a QUEUED or RUNNING run: it ends FAILED / CANCELLED (a running one within "
            "seconds, keeping the tokens spent so far). Owner or admin. A finished run is a "
            "CONFLICT."
        )
    )
    async def cancel_run(self, info: Info, run_id: strawberry.ID) -> Run:
        viewer = info.context.require_viewer()
        ident = parse_id(run_id, "runId")
        async with info.context.engine.connect() as conn:
            owner = (
                await conn.execute(
                    text(
                        "SELECT a.user_id FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
                        " WHERE r.id = :id"
                    ),
                    {"id": ident},
                )
            ).scalar_one_or_none()
        if owner is None or (not viewer.is_admin and owner != viewer.user_id):
            raise NotFound("run", ident)
        by = "its owner" if owner == viewer.user_id else f"an admin (user {viewer.user_id})"
        try:
            row = await run_cancel.cancel_run(
                info.context.engine,
                ident,
                now=info.context.now,
                error=f"cancelled by {by}",
                # An admin cancelling another owner's run is an admin action.
                audited_actor_id=None if owner == viewer.user_id else viewer.user_id,
                owner_id=owner,
            )
        except run_cancel.RunMissing as exc:
            raise NotFound("run", ident) from exc
        except run_cancel.RunFinished as exc:
            raise Conflict(
                f"run {ident} already finished ({exc.state}): nothing to cancel"
            ) from exc
        return Run.from_row(row)

    @described_mutation(
        description=(
            "Replaces the agent's delivery targets; every target must be enabled. Owner only."
        )
    )
    async def set_agent_delivery_targets(
        self, info: Info, agent_id: strawberry.ID, target_ids: list[strawberry.ID]
    ) -> Agent:
        info.context.require_viewer()
        ident = parse_id(agent_id, "agentId")
        await owned_agent(info, ident, "choose where its runs are delivered", owner_only=True)
        if len(target_ids) > MAX_DELIVERY_TARGET_IDS:
            raise BadUserInput("targetIds", f"at most {MAX_DELIVERY_TARGET_IDS} targets")
        wanted = [parse_id(t, "targetIds") for t in target_ids]
        async with _transaction(info) as conn:
            try:
                await delivery_targets.set_agent_targets(conn, ident, wanted)
            except delivery_targets.TargetsNotAvailable as exc:
                raise BadUserInput("targetIds", str(exc)) from exc
            return await _fresh_agent(info, conn, ident)

    # --- admin ------------------------------------------------------------------------------

    @described_mutation(
        description=(
            "Admin only. The admin's sticky lock. The note (at most "
            f"{ADMIN_PAUSE_NOTE_MAX_CHARS} characters) is shown to the owner "
            "(Agent.adminPauseNote) until unpaused, and kept in the audit log."
        )
    )
    async def set_admin_paused(
        self, info: Info, agent_id: strawberry.ID, paused: bool, note: str | None = None
    ) -> Agent:
        viewer = info.context.require_admin()
        ident = parse_id(agent_id, "agentId")
        if note is not None:
            note = checked_text("note", note, ADMIN_PAUSE_NOTE_MAX_CHARS, allow_blank=True).strip()
        async with _transaction(info) as conn:
            await admin_service.set_admin_paused(
                conn,
                ident,
                paused=paused,
                note=note or None,
                actor_id=viewer.user_id,
                now=info.context.now,
            )
            return await _fresh_agent(info, conn, ident)

    @described_mutation(
        description=(
            "Admin only. Switches off every agent of the user (enabled = false) and marks the "
            "user inactive. Returns how many agents were switched off."
        )
    )
    async def deactivate_owner(self, info: Info, user_id: strawberry.ID) -> int:
        viewer = info.context.require_admin()
        ident = parse_id(user_id, "userId")
        if ident == viewer.user_id:
            raise Conflict("an admin cannot deactivate their own account")
        async with _transaction(info) as conn:
            return await admin_service.deactivate_owner(conn, ident, actor_id=viewer.user_id)

    @described_mutation(
        description=(
            "Admin only. Lets the user sign in again. Their agents stay switched off until they "
            "switch them on."
        )
    )
    async def reactivate_owner(self, info: Info, user_id: strawberry.ID) -> User:
        viewer = info.context.require_admin()
        ident = parse_id(user_id, "userId")
        async with _transaction(info) as conn:
            row = await admin_service.reactivate_owner(conn, ident, actor_id=viewer.user_id)
        platform = await info.context.loaders.platform()
        return User.from_row(row, platform_zone=platform.timezone)

    @described_mutation(description="Admin only. Creates (no id) or replaces a model on the list.")
    async def upsert_agent_model(self, info: Info, input: AgentModelInput) -> AgentModel:
        viewer = info.context.require_admin()
        model_id = parse_id(input.id, "input.id") if input.id is not None else None
        if input.provider not in PROVIDERS:
            raise BadUserInput("input.provider", f"must be one of {', '.join(PROVIDERS)}")
        base_url = _checked_base_url("input.baseUrl", input.base_url)
        if input.api_key_env is not None and not _ENV_NAME.match(input.api_key_env):
            raise BadUserInput("input.apiKeyEnv", "must be an environment variable name")
        limit = input.max_concurrent_runs
        if (
            limit is not strawberry.UNSET
            and limit is not None
            and not (1 <= limit <= MAX_CONCURRENT_RUNS)
        ):
            raise BadUserInput(
                "input.maxConcurrentRuns",
                f"must be between 1 and {MAX_CONCURRENT_RUNS:,}, or null for no limit",
            )
        draft = admin_service.ModelDraft(
            name=checked_text("input.name", input.name, MODEL_FIELD_MAX_CHARS),
            provider=input.provider,
            model=checked_text("input.model", input.model, MODEL_FIELD_MAX_CHARS),
            base_url=base_url,
            api_key_env=input.api_key_env,
            is_default=input.is_default,
            max_concurrent_runs=None if limit is strawberry.UNSET else limit,
            keep_max_concurrent_runs=limit is strawberry.UNSET,
        )
        prices = _price_changes(input)
        async with _transaction(info) as conn:
            saved = await admin_service.upsert_model(conn, model_id, draft, actor_id=viewer.user_id)
            await admin_service.set_model_prices(conn, saved.id, prices)
            row = (
                (
                    await conn.execute(
                        text("SELECT * FROM agent_models WHERE id = :id"), {"id": saved.id}
                    )
                )
                .mappings()
                .one()
            )
        if saved.limit_widened:
            # Runs waiting for a slot of this model start now, not at the reaper's next pass.
            await model_slots.wake_after_limit_change(
                info.context.engine, saved.id, limit=saved.limit, enqueue=info.context.enqueue
            )
        return AgentModel.from_row(dict(row))

    @described_mutation(
        description=(
            "Admin only. Removes the model from the allowed list; agents that used it stop "
            "(NO_MODEL)."
        )
    )
    async def remove_agent_model(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_admin()
        model_id = parse_id(id, "id")
        async with _transaction(info) as conn:
            await admin_service.remove_model(conn, model_id, actor_id=viewer.user_id)
        return strawberry.ID(str(model_id))

    @described_mutation(description="Admin only.")
    async def set_tool_allowed(self, info: Info, tool_id: strawberry.ID, allowed: bool) -> Tool:
        viewer = info.context.require_admin()
        ident = parse_id(tool_id, "toolId")
        async with _transaction(info) as conn:
            await admin_service.set_tool_allowed(conn, ident, allowed, actor_id=viewer.user_id)
            row = (
                (await conn.execute(text("SELECT * FROM tools WHERE id = :id"), {"id": ident}))
                .mappings()
                .one()
            )
        return Tool.from_row(dict(row))

    @described_mutation(
        description=(
            "Admin only. Creates (no id) or replaces a delivery target: an https:// URL (http:// "
            "only to a loopback address), and the environment variable that holds its whsec_ "
            "signing secret on the workers."
        )
    )
    async def upsert_delivery_target(
        self, info: Info, input: DeliveryTargetInput
    ) -> DeliveryTarget:
        viewer = info.context.require_admin()
        target_id = parse_id(input.id, "input.id") if input.id is not None else None
        if problem := target_url_problem(input.url):
            raise BadUserInput("input.url", problem)
        if problem := secret_env_problem(input.secret_env):
            raise BadUserInput("input.secretEnv", problem)
        draft = delivery_targets.TargetDraft(
            name=checked_text("input.name", input.name, NAME_MAX_CHARS),
            url=input.url,
            secret_env=input.secret_env,
            enabled=input.enabled,
        )
        async with _transaction(info) as conn:
            saved = await delivery_targets.upsert_target(conn, target_id, draft)
            row = (
                (
                    await conn.execute(
                        text("SELECT * FROM delivery_targets WHERE id = :id"), {"id": saved}
                    )
                )
                .mappings()
                .one()
            )
            # The secret itself is never stored: the audit keeps the variable's name.
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.DELIVERY_TARGET_UPSERTED,
                details={
                    "targetId": str(saved),
                    "created": target_id is None,
                    "name": row["name"],
                    "url": audit.redacted_url(row["url"]),
                    "secretEnv": row["secret_env"],
                    "enabled": bool(row["enabled"]),
                },
            )
        return DeliveryTarget.from_row(dict(row), admin=True)

    @described_mutation(
        description="Admin only. Removes the target; agents lose it from their selection."
    )
    async def remove_delivery_target(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_admin()
        target_id = parse_id(id, "id")
        async with _transaction(info) as conn:
            await delivery_targets.remove_target(conn, target_id)
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.DELIVERY_TARGET_REMOVED,
                details={"targetId": str(target_id)},
            )
        return strawberry.ID(str(target_id))

    @described_mutation(description="Admin only.")
    async def update_platform_settings(
        self, info: Info, input: PlatformSettingsInput
    ) -> PlatformSettings:
        viewer = info.context.require_admin()
        changes: dict[str, Any] = {}
        if input.weekly_token_cap is not strawberry.UNSET:
            cap = input.weekly_token_cap
            if cap is not None and not 0 <= cap <= _MAX_TOKEN_CAP:
                raise BadUserInput("input.weeklyTokenCap", "must be zero or more, or null")
            changes["weekly_token_cap"] = cap
        if input.timezone is not strawberry.UNSET:
            changes["timezone"] = _zone_name("input.timezone", input.timezone)
        if input.platform_prompt is not strawberry.UNSET:
            changes["platform_prompt"] = checked_text(
                "input.platformPrompt",
                input.platform_prompt or "",
                PLATFORM_PROMPT_MAX_CHARS,
                allow_blank=True,
            )
        if input.iteration_cap is not strawberry.UNSET:
            iteration_cap = input.iteration_cap
            if iteration_cap is None or not 1 <= iteration_cap <= MAX_ITERATION_CAP:
                raise BadUserInput(
                    "input.iterationCap", f"must be between 1 and {MAX_ITERATION_CAP}"
                )
            changes["iteration_cap"] = iteration_cap
        if input.currency is not strawberry.UNSET:
            if input.currency is None:
                raise BadUserInput("input.currency", "cannot be null")
            try:
                changes["currency"] = parse_currency(input.currency)
            except MoneyError as exc:
                raise BadUserInput("input.currency", str(exc)) from exc
        if input.budget_alert_percents is not strawberry.UNSET:
            if input.budget_alert_percents is None:
                raise BadUserInput(
                    "input.budgetAlertPercents", "cannot be null; an empty list records no alerts"
                )
            try:
                changes["budget_alert_percents"] = list(
                    parse_alert_percents(input.budget_alert_percents)
                )
            except AlertPercentsError as exc:
                raise BadUserInput("input.budgetAlertPercents", str(exc)) from exc
        # Settings changes (currency and alert thresholds included) go through the one
        # update_platform_settings path, where they can be audited as a whole.
        if input.run_retention_days is not strawberry.UNSET:
            days = input.run_retention_days
            if days is not None and not MIN_RETENTION_DAYS <= days <= MAX_RETENTION_DAYS:
                raise BadUserInput(
                    "input.runRetentionDays",
                    f"must be between {MIN_RETENTION_DAYS} and {MAX_RETENTION_DAYS} days, "
                    "or null to keep every run",
                )
            changes["run_retention_days"] = days
        async with _transaction(info) as conn:
            await admin_service.update_platform_settings(
                conn, changes, actor_id=viewer.user_id, now=info.context.now
            )
            current = await load_platform_settings(conn)
        return PlatformSettings.from_value(current)


def _checked_base_url(field: str, value: str | None) -> str | None:
    """An http(s) URL with no credentials in it: keys live in the environment (`apiKeyEnv`),
    never in the database or in what the API shows."""
    if value is None:
        return None
    checked_text(field, value, BASE_URL_MAX_CHARS)
    try:
        parts = urlsplit(value)
        has_userinfo = parts.username is not None or parts.password is not None
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise BadUserInput(field, "must be an http(s) URL") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadUserInput(field, "must be an http(s) URL")
    if has_userinfo:
        raise BadUserInput(
            field,
            "must not contain credentials (user:password@): put the key in the environment "
            "variable named by apiKeyEnv",
        )
    names = {name for name, _ in parse_qsl(parts.query, keep_blank_values=True)}
    secret_params = sorted(name for name in names if _SECRET_QUERY_NAME.search(name))
    if secret_params:
        raise BadUserInput(
            field,
            f"must not carry credentials in its query ({', '.join(secret_params)}): put the key "
            "in the environment variable named by apiKeyEnv",
        )
    return value


# The price fields of AgentModelInput and their GraphQL names.
_PRICE_FIELDS = {
    "input_price_per_million": "input.inputPricePerMillion",
    "output_price_per_million": "input.outputPricePerMillion",
}


def _price_changes(input: AgentModelInput) -> dict[str, Decimal | None]:
    """The prices the input sets: absent = unchanged, null = not priced, else a valid price."""
    changes: dict[str, Decimal | None] = {}
    for name, field in _PRICE_FIELDS.items():
        value = getattr(input, name)
        if value is strawberry.UNSET:
            continue
        try:
            changes[name] = parse_price(value) if value is not None else None
        except MoneyError as exc:
            raise BadUserInput(field, str(exc)) from exc
    return changes


def _zone_name(field: str, value: str | None) -> str:
    if value is None:
        raise BadUserInput(field, "cannot be null")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadUserInput(field, f"unknown IANA time zone {value[:64]!r}") from exc
    return value
