"""Delivery targets: the owner's choice for an agent, and the admin's list of targets."""

from __future__ import annotations

import strawberry

from agent_engine.agents import audit
from agent_engine.agents import credentials as credential_rules
from agent_engine.agents.errors import Missing
from agent_engine.api.errors import BadUserInput
from agent_engine.api.guards import NAME_MAX_CHARS, checked_text
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import DeliveryTargetInput
from agent_engine.api.mutations.common import fresh_agent, owned_agent, transaction
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.types.agents import Agent
from agent_engine.api.types.delivery import DeliveryTarget
from agent_engine.db import deliveries
from agent_engine.delivery import targets as delivery_targets
from agent_engine.domain.delivery import secret_env_problem, target_url_problem

MAX_DELIVERY_TARGET_IDS = 20


@strawberry.type
class AgentDeliveryMutation:
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
        async with transaction(info) as conn:
            try:
                await delivery_targets.set_agent_targets(conn, ident, wanted)
            except delivery_targets.TargetsNotAvailable as exc:
                raise BadUserInput("targetIds", str(exc)) from exc
            return await fresh_agent(info, conn, ident)


@strawberry.type
class DeliveryTargetMutation:
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
        async with transaction(info) as conn:
            # Under the credential-names lock: a model saved at the same moment is seen.
            if problem := await credential_rules.target_secret_problem(conn, input.secret_env):
                raise BadUserInput("input.secretEnv", problem)
            saved = await delivery_targets.upsert_target(conn, target_id, draft)
            row = await deliveries.fetch_target(conn, saved)
            if row is None:  # saved in this transaction: it cannot be gone
                raise Missing("delivery target", saved)
            # The secret itself is never stored: the audit keeps the variable's name.
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.DELIVERY_TARGET_UPSERTED,
                details={
                    "targetId": str(saved),
                    "created": target_id is None,
                    "name": row.name,
                    "url": audit.redacted_url(row.url),
                    "secretEnv": row.secret_env,
                    "enabled": row.enabled,
                },
            )
        return DeliveryTarget.from_row(row, admin=True)

    @described_mutation(
        description="Admin only. Removes the target; agents lose it from their selection."
    )
    async def remove_delivery_target(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_admin()
        target_id = parse_id(id, "id")
        async with transaction(info) as conn:
            await delivery_targets.remove_target(conn, target_id)
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.DELIVERY_TARGET_REMOVED,
                details={"targetId": str(target_id)},
            )
        return strawberry.ID(str(target_id))
