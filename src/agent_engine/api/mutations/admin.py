"""The admin's mutations on agents, owners, the model list and the tool catalog (FORBIDDEN to
owners). An admin pauses (`setAdminPaused`) rather than switching an agent off."""

from __future__ import annotations

import strawberry
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import admin as admin_service
from agent_engine.agents import admin_rules
from agent_engine.agents import credentials as credential_rules
from agent_engine.agents.errors import Missing
from agent_engine.api.errors import BadUserInput, Conflict
from agent_engine.api.guards import MODEL_FIELD_MAX_CHARS, checked_text
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import AgentModelInput
from agent_engine.api.mutations.common import (
    CONTENDED_RETRIES,
    contended,
    fresh_agent,
    transaction,
)
from agent_engine.api.mutations.validation import checked_base_url, price_changes
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.agents import Agent
from agent_engine.api.types.catalog import AgentModel, Tool
from agent_engine.api.types.users import User, shown_user
from agent_engine.db import catalog
from agent_engine.db.models.agents import ADMIN_PAUSE_NOTE_MAX_CHARS
from agent_engine.domain.credentials import credential_env_problem
from agent_engine.oauth.flow import forget_owner_connections
from agent_engine.runs import model_slots


@strawberry.type
class AdminMutation:
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
        async with transaction(info) as conn:
            await admin_service.set_admin_paused(
                conn,
                ident,
                paused=paused,
                note=note or None,
                actor_id=viewer.user_id,
                now=info.context.now,
            )
            return await fresh_agent(info, conn, ident)

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
        async with transaction(info) as conn:
            switched_off = await admin_service.deactivate_owner(
                conn, ident, actor_id=viewer.user_id
            )
        # Their accounts at OWNER_OAUTH sources: revoked where the server offers it, forgotten.
        settings = services(info)["settings"]
        await forget_owner_connections(
            services(info)["engine"],
            owner_id=ident,
            actor_id=viewer.user_id,
            keys=settings.token_keyring(),
        )
        return switched_off

    @described_mutation(
        description=(
            "Admin only. Lets the user sign in again. Their agents stay switched off until they "
            "switch them on."
        )
    )
    async def reactivate_owner(self, info: Info, user_id: strawberry.ID) -> User:
        viewer = info.context.require_admin()
        ident = parse_id(user_id, "userId")
        async with transaction(info) as conn:
            row = await admin_service.reactivate_owner(conn, ident, actor_id=viewer.user_id)
        return await shown_user(info, row)

    @described_mutation(description="Admin only. Creates (no id) or replaces a model on the list.")
    async def upsert_agent_model(self, info: Info, input: AgentModelInput) -> AgentModel:
        viewer = info.context.require_admin()
        model_id = parse_id(input.id, "input.id") if input.id is not None else None
        if problem := admin_rules.provider_problem(input.provider):
            raise BadUserInput("input.provider", problem)
        base_url = checked_base_url("input.baseUrl", input.base_url)
        prefixes = services(info)["settings"].credential_prefixes
        if problem := credential_env_problem(input.api_key_env, allowed_prefixes=prefixes):
            raise BadUserInput("input.apiKeyEnv", problem)
        limit = input.max_concurrent_runs
        if limit is not strawberry.UNSET and (
            problem := admin_rules.max_concurrent_runs_problem(limit)
        ):
            raise BadUserInput("input.maxConcurrentRuns", problem)
        fallback_id = (
            parse_id(input.fallback_model_id, FALLBACK_FIELD)
            if input.fallback_model_id is not None
            and input.fallback_model_id is not strawberry.UNSET
            else None
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
            fallback_model_id=fallback_id,
            keep_fallback=input.fallback_model_id is strawberry.UNSET,
        )
        prices = price_changes(input)
        async with transaction(info) as conn:
            # Under the credential-names lock: a target saved at the same moment is seen.
            if problem := await credential_rules.credential_key_problem(
                conn, input.api_key_env, allowed_prefixes=prefixes
            ):
                raise BadUserInput("input.apiKeyEnv", problem)
            saved = await admin_service.upsert_model(conn, model_id, draft, actor_id=viewer.user_id)
            await admin_service.set_model_prices(conn, saved.id, prices)
            if input.fallback_model_id is not strawberry.UNSET:
                await _set_fallback(conn, saved.id, fallback_id)
            row = await catalog.fetch_model(conn, saved.id)
            if row is None:  # saved in this transaction: it cannot be gone
                raise Missing("model", saved.id)
        if saved.limit_widened:
            # Runs waiting for a slot of this model start now, not at the reaper's next pass.
            await model_slots.wake_after_limit_change(
                services(info)["engine"],
                saved.id,
                limit=saved.limit,
                enqueue=services(info)["enqueue"],
            )
        return AgentModel.from_row(row)

    @described_mutation(
        description=(
            "Admin only. Removes the model from the allowed list; agents that used it stop "
            "(NO_MODEL)."
        )
    )
    async def remove_agent_model(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_admin()
        model_id = parse_id(id, "id")
        # The removal writes every agent of the model: should PostgreSQL still pick it as a
        # deadlock's victim against another multi-row write, it is tried again.
        for attempt in range(1, CONTENDED_RETRIES + 1):
            try:
                async with transaction(info) as conn:
                    await admin_service.remove_model(conn, model_id, actor_id=viewer.user_id)
                break
            except Conflict as exc:
                if attempt == CONTENDED_RETRIES or not contended(exc):
                    raise
        return strawberry.ID(str(model_id))

    @described_mutation(description="Admin only.")
    async def set_tool_allowed(self, info: Info, tool_id: strawberry.ID, allowed: bool) -> Tool:
        viewer = info.context.require_admin()
        ident = parse_id(tool_id, "toolId")
        async with transaction(info) as conn:
            await admin_service.set_tool_allowed(conn, ident, allowed, actor_id=viewer.user_id)
            row = await catalog.fetch_tool(conn, ident)
            if row is None:  # changed in this transaction: it cannot be gone
                raise Missing("tool", ident)
        return Tool.from_row(row)


FALLBACK_FIELD = "input.fallbackModelId"


async def _set_fallback(conn: AsyncConnection, model_id: int, fallback_id: int | None) -> None:
    """The model's fallback, in the upsert's transaction: another model of the list (key-share
    locked, so it cannot be removed before the commit), never one whose chain comes back to this
    model — the database's trigger decides that under its lock, so two admins closing a loop
    from both ends at once cannot both succeed."""
    if fallback_id is None:
        await catalog.set_model_fallback(conn, model_id, None)
        return
    if fallback_id == model_id:
        raise BadUserInput(FALLBACK_FIELD, "must be another model than this one")
    if not await catalog.share_model(conn, fallback_id):
        raise BadUserInput(FALLBACK_FIELD, f"no model {fallback_id} on the allowed list")
    try:
        async with conn.begin_nested():
            await catalog.set_model_fallback(conn, model_id, fallback_id)
    except IntegrityError as exc:
        if _constraint_of(exc) != catalog.FALLBACK_CYCLE_CONSTRAINT:
            raise
        raise BadUserInput(
            FALLBACK_FIELD,
            f"model {fallback_id}'s fallback chain comes back to this model (a chain must end)",
        ) from exc


def _constraint_of(exc: IntegrityError) -> str | None:
    cause: BaseException | None = exc.orig
    while cause is not None:
        name = getattr(cause, "constraint_name", None)
        if isinstance(name, str):
            return name
        cause = cause.__cause__
    return None
