"""Statements on delivery targets, the agents' choice of them, and the outbox (`run_deliveries`).

The outbox rows are written by the database (the `agent_runs_on_finish` trigger,
see schema/database.sql); these statements
lease them to the sender and record attempts. Only the message holding the current lease token
matches a row, so a duplicate or late message changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns


@dataclass(frozen=True, slots=True)
class DeliveryTargetRow:
    """One `delivery_targets` row."""

    id: int
    name: str
    url: str
    secret_env: str
    enabled: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: AnyRow) -> DeliveryTargetRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            name=values["name"],
            url=values["url"],
            secret_env=values["secret_env"],
            enabled=bool(values["enabled"]),
            created_at=values["created_at"],
            updated_at=values["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """A leased delivery with what one attempt needs of its target."""

    id: int
    webhook_id: str
    payload: Any
    attempts: int
    url: str
    secret_env: str
    target_name: str = ""

    @classmethod
    def from_row(cls, row: AnyRow) -> DeliveryRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            webhook_id=values["webhook_id"],
            payload=values["payload"],
            attempts=int(values["attempts"]),
            url=values["url"],
            secret_env=values["secret_env"],
            target_name=values["target_name"],
        )


@dataclass(frozen=True, slots=True)
class DueDelivery:
    id: int
    target_id: int


# --- targets ----------------------------------------------------------------------------------

INSERT_TARGET = text(
    "INSERT INTO delivery_targets (name, url, secret_env, enabled)"
    " VALUES (:name, :url, :secret_env, :enabled) RETURNING id"
)
UPDATE_TARGET = text(
    "UPDATE delivery_targets SET name = :name, url = :url, secret_env = :secret_env,"
    " enabled = :enabled, updated_at = now() WHERE id = :id RETURNING id"
)
DELETE_TARGET = text("DELETE FROM delivery_targets WHERE id = :id RETURNING id")
SELECT_TARGET = text("SELECT * FROM delivery_targets WHERE id = :id")
ENABLED_TARGETS = text(
    "SELECT id FROM delivery_targets WHERE id = ANY(CAST(:ids AS bigint[])) AND enabled"
)
CLEAR_AGENT_TARGETS = text("DELETE FROM agent_delivery_targets WHERE agent_id = :agent_id")
ATTACH_AGENT_TARGETS = text(
    "INSERT INTO agent_delivery_targets (agent_id, target_id)"
    " SELECT :agent_id, unnest(CAST(:ids AS bigint[])) ON CONFLICT DO NOTHING"
)


async def insert_target(
    conn: AsyncConnection, *, name: str, url: str, secret_env: str, enabled: bool
) -> int:
    params = {"name": name, "url": url, "secret_env": secret_env, "enabled": enabled}
    return int((await conn.execute(INSERT_TARGET, params)).scalar_one())


async def update_target(
    conn: AsyncConnection, target_id: int, *, name: str, url: str, secret_env: str, enabled: bool
) -> bool:
    """Replace the target's fields; False when it does not exist."""
    params = {"id": target_id, "name": name, "url": url, "secret_env": secret_env}
    found = await conn.execute(UPDATE_TARGET, {**params, "enabled": enabled})
    return found.scalar_one_or_none() is not None


async def delete_target(conn: AsyncConnection, target_id: int) -> bool:
    """Delete the target (links and deliveries cascade); False when it does not exist."""
    return (await conn.execute(DELETE_TARGET, {"id": target_id})).scalar_one_or_none() is not None


async def fetch_target(conn: AsyncConnection, target_id: int) -> DeliveryTargetRow | None:
    row = (await conn.execute(SELECT_TARGET, {"id": target_id})).mappings().one_or_none()
    return None if row is None else DeliveryTargetRow.from_row(row)


async def enabled_targets(conn: AsyncConnection, target_ids: Sequence[int]) -> set[int]:
    """Those of the targets that exist and are enabled (nothing locked)."""
    rows = await conn.execute(ENABLED_TARGETS, {"ids": list(target_ids)})
    return {int(row.id) for row in rows}


async def replace_agent_targets(
    conn: AsyncConnection, agent_id: int, target_ids: Sequence[int]
) -> None:
    await conn.execute(CLEAR_AGENT_TARGETS, {"agent_id": agent_id})
    if target_ids:
        await conn.execute(ATTACH_AGENT_TARGETS, {"agent_id": agent_id, "ids": list(target_ids)})


# --- the outbox -------------------------------------------------------------------------------

IN_FLIGHT = text(
    "SELECT target_id, count(*) AS n FROM run_deliveries"
    " WHERE status = 'pending' AND leased_until > :now GROUP BY target_id"
)
LOCK_DUE = text(
    "SELECT id, target_id FROM run_deliveries"
    " WHERE status = 'pending' AND next_attempt_at <= :now"
    " AND (leased_until IS NULL OR leased_until <= :now)"
    " ORDER BY next_attempt_at, id LIMIT :limit FOR UPDATE SKIP LOCKED"
)
LEASE = text(
    "UPDATE run_deliveries SET lease_token = t.token, leased_until = :until"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[])) AS t(id, token)"
    " WHERE run_deliveries.id = t.id"
)
LOAD_LEASED = text(
    "SELECT d.id, d.webhook_id, d.payload, d.attempts, t.url, t.secret_env,"
    " t.name AS target_name"
    " FROM run_deliveries d JOIN delivery_targets t ON t.id = d.target_id"
    " WHERE d.id = :id AND d.status = 'pending' AND d.lease_token = :token"
)
RECORD_ATTEMPT = text(
    "UPDATE run_deliveries SET status = :status, attempts = attempts + 1,"
    " last_status_code = :code, last_error = :error, delivered_at = :delivered_at,"
    " next_attempt_at = :next_at, finished_at = :finished_at,"
    " lease_token = NULL, leased_until = NULL"
    " WHERE id = :id AND status = 'pending' AND lease_token = :token"
)


async def in_flight_by_target(conn: AsyncConnection, *, now: datetime) -> Counter[int]:
    """Pending deliveries whose lease has not expired, per target."""
    rows = await conn.execute(IN_FLIGHT, {"now": now})
    return Counter({int(row.target_id): int(row.n) for row in rows})


async def lock_due(conn: AsyncConnection, *, now: datetime, limit: int) -> list[DueDelivery]:
    """Pending deliveries due and not leased, oldest due first, skipping rows others hold."""
    rows = await conn.execute(LOCK_DUE, {"now": now, "limit": limit})
    return [DueDelivery(int(row.id), int(row.target_id)) for row in rows]


async def lease(
    conn: AsyncConnection, delivery_ids: Sequence[int], tokens: Sequence[str], *, until: datetime
) -> None:
    await conn.execute(LEASE, {"ids": list(delivery_ids), "tokens": list(tokens), "until": until})


async def load_leased(conn: AsyncConnection, delivery_id: int, token: str) -> DeliveryRow | None:
    """The delivery if it is pending and `token` is its current lease."""
    row = (
        (await conn.execute(LOAD_LEASED, {"id": delivery_id, "token": token}))
        .mappings()
        .one_or_none()
    )
    return None if row is None else DeliveryRow.from_row(row)


async def record_attempt(
    conn: AsyncConnection,
    delivery_id: int,
    token: str,
    *,
    status: str,
    status_code: int | None,
    error: str | None,
    delivered_at: datetime | None,
    next_attempt_at: datetime | None,
    finished_at: datetime | None,
) -> None:
    """Count the attempt and end the lease; matches nothing unless `token` is the lease."""
    await conn.execute(
        RECORD_ATTEMPT,
        {
            "id": delivery_id,
            "token": token,
            "status": status,
            "code": status_code,
            "error": error,
            "delivered_at": delivered_at,
            "next_at": next_attempt_at,
            "finished_at": finished_at,
        },
    )


# --- reads for the API ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunDeliveryRow:
    """One run's delivery to one target, with the target."""

    run_id: int
    target: DeliveryTargetRow
    status: str
    webhook_id: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    next_attempt_at: datetime | None


ALL_TARGETS = text("SELECT * FROM delivery_targets ORDER BY name, id")
ENABLED_TARGET_LIST = text("SELECT * FROM delivery_targets WHERE enabled ORDER BY name, id")
DELIVERIES_OF_RUNS = text(
    "SELECT d.run_id, d.status, d.webhook_id, d.attempts, d.last_status_code, d.last_error,"
    " d.delivered_at, d.next_attempt_at, t.*"
    " FROM run_deliveries d JOIN delivery_targets t ON t.id = d.target_id"
    " WHERE d.run_id = ANY(CAST(:ids AS bigint[])) ORDER BY d.run_id, t.name, t.id"
)
TARGETS_OF_AGENTS = text(
    "SELECT adt.agent_id, t.* FROM agent_delivery_targets adt"
    " JOIN delivery_targets t ON t.id = adt.target_id"
    " WHERE adt.agent_id = ANY(CAST(:ids AS bigint[])) ORDER BY t.name, t.id"
)


async def list_targets(conn: AsyncConnection, *, enabled_only: bool) -> list[DeliveryTargetRow]:
    """The targets by name: all, or the enabled ones."""
    rows = await conn.execute(ENABLED_TARGET_LIST if enabled_only else ALL_TARGETS)
    return [DeliveryTargetRow.from_row(row) for row in rows.mappings()]


async def deliveries_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[RunDeliveryRow]:
    """The runs' deliveries, by run and target name."""
    rows = await conn.execute(DELIVERIES_OF_RUNS, {"ids": list(run_ids)})
    return [
        RunDeliveryRow(
            run_id=int(row["run_id"]),
            target=DeliveryTargetRow.from_row(row),
            status=row["status"],
            webhook_id=row["webhook_id"],
            attempts=int(row["attempts"]),
            last_status_code=row["last_status_code"],
            last_error=row["last_error"],
            delivered_at=row["delivered_at"],
            next_attempt_at=row["next_attempt_at"],
        )
        for row in rows.mappings()
    ]


async def targets_of_agents(
    conn: AsyncConnection, agent_ids: Sequence[int]
) -> list[tuple[int, DeliveryTargetRow]]:
    """(agent id, target) for each agent's selection, by target name."""
    rows = await conn.execute(TARGETS_OF_AGENTS, {"ids": list(agent_ids)})
    return [(int(row["agent_id"]), DeliveryTargetRow.from_row(row)) for row in rows.mappings()]
