"""The admin's levers: the pause lock, owners, the allowed model list, the tool catalog, platform
settings. Each lever records its audit entry (`agents.audit.record`) in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import definitions
from agent_engine.agents.audit import AuditAction, record, redacted_url
from agent_engine.agents.errors import Contended, Missing
from agent_engine.agents.zones import reslot_calendar_agents_without_owner_zone
from agent_engine.db import agents as agents_db
from agent_engine.db import catalog, platform, users
from agent_engine.db.platform import write_platform_setting
from agent_engine.domain.gate import ResumeStop
from agent_engine.domain.zones import zone_or_utc
from agent_engine.runs import resume_gate

# GraphQL-side names of the platform settings → their keys in platform_settings.
SETTING_KEYS = {
    "weekly_token_cap": platform.WEEKLY_TOKEN_CAP,
    "timezone": platform.TIMEZONE,
    "platform_prompt": platform.PLATFORM_PROMPT,
    "iteration_cap": platform.ITERATION_CAP,
    "currency": platform.CURRENCY,
    "budget_alert_percents": platform.BUDGET_ALERT_PERCENTS,
    "run_retention_days": platform.RUN_RETENTION_DAYS,
}


@dataclass(frozen=True)
class ModelDraft:
    name: str
    provider: str
    model: str
    base_url: str | None
    api_key_env: str | None
    is_default: bool
    # None = no limit. `keep_max_concurrent_runs`: leave the stored limit as it is (an update that
    # did not mention it); a new model then has none.
    max_concurrent_runs: int | None = None
    keep_max_concurrent_runs: bool = False
    # The fallback the upsert writes (for the audit log; written by the mutation, validated
    # there); `keep_fallback`: the input did not mention it.
    fallback_model_id: int | None = None
    keep_fallback: bool = True


@dataclass(frozen=True)
class SavedModel:
    id: int
    # The concurrency limit before and after the save (a raised or lifted limit frees slots).
    previous_limit: int | None
    limit: int | None

    @property
    def limit_widened(self) -> bool:
        if self.limit == self.previous_limit:
            return False
        return self.limit is None or (
            self.previous_limit is not None and self.limit > self.previous_limit
        )


async def set_admin_paused(
    conn: AsyncConnection,
    agent_id: int,
    *,
    paused: bool,
    note: str | None,
    actor_id: int,
    now: datetime,
) -> None:
    """The admin's sticky lock. The note is the owner's to read while paused (cleared on unpause,
    a CHECK holds it) and is kept in the audit log either way."""
    before = await agents_db.lock_agent(conn, agent_id)
    if before is None:
        raise Missing("agent", agent_id)
    await definitions.update_agent(
        conn,
        agent_id,
        {"admin_paused": paused, "admin_pause_note": note if paused else None},
        now=now,
    )
    details: dict[str, Any] = {"agentName": before.name, "note": note}
    if paused:
        # Under review: a run parked on its owner's approval does not go on either.
        stopped = await resume_gate.stop_parked_runs(
            conn, [agent_id], ResumeStop.ADMIN_PAUSED, actor_id=actor_id
        )
        if stopped:
            details["runsCancelled"] = [str(run_id) for run_id in stopped]
    else:
        details["previousNote"] = before.admin_pause_note
    await record(
        conn,
        actor_id,
        AuditAction.AGENT_ADMIN_PAUSED if paused else AuditAction.AGENT_ADMIN_UNPAUSED,
        agent_id=agent_id,
        user_id=before.user_id,
        details={**details, "wasPaused": before.admin_paused},
    )


async def record_agent_deleted(
    conn: AsyncConnection, agent_id: int, *, owner_id: int, name: str, actor_id: int
) -> None:
    """An admin deleted someone else's agent (an owner deleting their own is not audited); called
    in the deletion's transaction."""
    await record(
        conn,
        actor_id,
        AuditAction.AGENT_DELETED,
        agent_id=agent_id,
        user_id=owner_id,
        details={"agentName": name},
    )


async def deactivate_owner(conn: AsyncConnection, user_id: int, *, actor_id: int) -> int:
    """Switch every agent of the user off and mark the user inactive; returns how many were on.

    Writes the owner's own switch (`enabled`), so only the owner can turn the agents back on. The
    user's open WebSocket sessions close within seconds (api.sessions sweeps for deactivations).
    Audited as `user.deactivated` by `actor_id`, in this transaction.
    """
    if not await users.deactivate(conn, user_id):
        raise Missing("user", user_id)
    switched_off = await agents_db.switch_off_agents_of_owner(conn, user_id)
    stopped = await resume_gate.stop_parked_runs(
        conn,
        await agents_db.agent_ids_of_owner(conn, user_id),
        ResumeStop.OWNER_INACTIVE,
        actor_id=actor_id,
    )
    details: dict[str, Any] = {"agentsSwitchedOff": switched_off}
    if stopped:
        details["runsCancelled"] = [str(run_id) for run_id in stopped]
    await record(conn, actor_id, AuditAction.USER_DEACTIVATED, user_id=user_id, details=details)
    return len(switched_off)


async def reactivate_owner(conn: AsyncConnection, user_id: int, *, actor_id: int) -> users.UserRow:
    """Let the user sign in again; returns the users row. Their agents stay switched off: only
    the owner turns them back on (the seed's life cycle). Audited as `user.reactivated` by
    `actor_id`, in this transaction.
    """
    row = await users.reactivate(conn, user_id)
    if row is None:
        raise Missing("user", user_id)
    await record(
        conn,
        actor_id,
        AuditAction.USER_REACTIVATED,
        user_id=user_id,
        details={"email": row.email},
    )
    return row


def _model_details(model: ModelDraft | catalog.AgentModelRow) -> dict[str, Any]:
    """What the audit log keeps of a model: no credentials (the key is never stored; the URL
    loses user info and query)."""
    return {
        "name": model.name,
        "provider": model.provider,
        "model": model.model,
        "baseUrl": redacted_url(model.base_url),
        "apiKeyEnv": model.api_key_env,
        "isDefault": bool(model.is_default),
        "fallbackModelId": None
        if model.fallback_model_id is None
        else str(model.fallback_model_id),
    }


async def upsert_model(
    conn: AsyncConnection, model_id: int | None, draft: ModelDraft, *, actor_id: int
) -> SavedModel:
    before = None
    if model_id is not None:
        found = await catalog.lock_model(conn, model_id)
        if found is None:
            raise Missing("model", model_id)
        before = _model_details(found)
    saved = await _write_model(conn, model_id, draft)
    after = _model_details(draft)
    if draft.keep_fallback:
        after["fallbackModelId"] = before["fallbackModelId"] if before is not None else None
    details: dict[str, Any] = {"modelId": saved.id, "created": before is None, "model": after}
    if before is not None:
        details["changes"] = {
            key: {"old": before[key], "new": value}
            for key, value in after.items()
            if before[key] != value
        }
    await record(conn, actor_id, AuditAction.MODEL_UPSERTED, details=details)
    return saved


async def _write_model(
    conn: AsyncConnection, model_id: int | None, draft: ModelDraft
) -> SavedModel:
    limit = None if draft.keep_max_concurrent_runs else draft.max_concurrent_runs
    try:
        if draft.is_default:
            # One default at a time (a partial unique index); the new one takes the flag.
            await catalog.clear_other_default(conn, model_id)
        fields = catalog.ModelFields(
            name=draft.name,
            provider=draft.provider,
            model=draft.model,
            base_url=draft.base_url,
            api_key_env=draft.api_key_env,
            is_default=draft.is_default,
            max_concurrent_runs=limit,
        )
        if model_id is None:
            saved = await catalog.insert_model(conn, fields)
        else:
            found = await catalog.update_model(
                conn, model_id, fields, keep_limit=draft.keep_max_concurrent_runs
            )
            if found is None:
                raise Missing("model", model_id)
            saved = found
    except IntegrityError as exc:
        raise Contended("another default model was set at the same time; retry") from exc
    return SavedModel(saved.id, saved.previous, saved.limit)


async def set_model_prices(
    conn: AsyncConnection, model_id: int, prices: Mapping[str, Decimal | None]
) -> None:
    """Set (or, with None, clear) the given prices of a model. Runs already finished keep the
    cost they were given: it was fixed at their finish."""
    if not prices:
        return
    if not await catalog.set_model_prices(conn, model_id, prices):
        raise Missing("model", model_id)


async def remove_model(conn: AsyncConnection, model_id: int, *, actor_id: int) -> None:
    """Delete from the allowed list; the FK's SET NULL stops the agents that used it, and their
    parked runs end.

    The parked runs end before the model row is locked: a claim resuming one of them holds the
    run's row and then may lock a limited model's row, so this takes them in the same order."""
    stopped = await resume_gate.stop_parked_runs(
        conn,
        await agents_db.agent_ids_of_model(conn, model_id),
        ResumeStop.NO_MODEL,
        actor_id=actor_id,
    )
    deleted = await catalog.delete_model(conn, model_id)
    if deleted is None:
        raise Missing("model", model_id)
    details: dict[str, Any] = {"modelId": model_id, "model": _model_details(deleted)}
    if stopped:
        details["runsCancelled"] = [str(run_id) for run_id in stopped]
    await record(conn, actor_id, AuditAction.MODEL_REMOVED, details=details)


async def set_tool_allowed(
    conn: AsyncConnection, tool_id: int, allowed: bool, *, actor_id: int
) -> None:
    before = await catalog.lock_tool(conn, tool_id)
    if before is None:
        raise Missing("tool", tool_id)
    await catalog.set_tool_allowed(conn, tool_id, allowed)
    await record(
        conn,
        actor_id,
        AuditAction.TOOL_ALLOWED if allowed else AuditAction.TOOL_DISALLOWED,
        details={"toolId": tool_id, "name": before.name, "wasAllowed": before.agents_allowed},
    )


async def update_platform_settings(
    conn: AsyncConnection, changes: Mapping[str, Any], *, actor_id: int, now: datetime
) -> None:
    """Write the given settings (None clears the cap). A new organisation zone moves the calendar
    slots of owners who have no zone of their own. The audit entry keeps old → new per setting
    given (GraphQL names)."""
    before = await platform.load_platform_settings(conn)
    for name, value in changes.items():
        await write_platform_setting(conn, SETTING_KEYS[name], value)
    if changes:
        await record(
            conn,
            actor_id,
            AuditAction.SETTINGS_UPDATED,
            details={
                _camel(name): {"old": getattr(before, name), "new": value}
                for name, value in changes.items()
            },
        )
    new_zone = changes.get("timezone")
    if new_zone is not None and new_zone != before.timezone:
        await reslot_calendar_agents_without_owner_zone(conn, zone=zone_or_utc(new_zone), now=now)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
