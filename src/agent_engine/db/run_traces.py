"""A run's trace context (`agent_runs.trace_parent`, migration `e0013_run_trace`): the statements
of tracing (`runs/run_trace.py`), run only while tracing is on, and the one `Run.traceId` reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import direct
from agent_engine.db.lane import autocommit

# What the run's span is named by, and the trace it continues (a resume).
LOAD_RUN_TRACE = text(
    "SELECT a.name AS agent_name, r.trace_parent FROM agent_runs r"
    " JOIN agents a ON a.id = r.agent_id WHERE r.id = :run_id"
)
# A run parked before tracing was on names its trace at its resume (a fresh run's start saves it,
# `db.runs.START`); an earlier one is kept: one trace per run.
SAVE_TRACE_PARENT = text(
    "UPDATE agent_runs SET trace_parent = COALESCE(trace_parent, :trace_parent) WHERE id = :run_id"
)
# The approval a run just parked on (the park event names it).
PENDING_APPROVAL = text(
    "SELECT id, tool_name FROM tool_approvals WHERE run_id = :run_id AND status = 'pending'"
    " ORDER BY id DESC LIMIT 1"
)
DELIVERY_TRACE_PARENT = text(
    "SELECT r.trace_parent FROM run_deliveries d JOIN agent_runs r ON r.id = d.run_id"
    " WHERE d.id = :delivery_id"
)
TRACE_PARENTS = text(
    "SELECT id, trace_parent FROM agent_runs WHERE id = ANY(:ids) AND trace_parent IS NOT NULL"
)


@dataclass(frozen=True)
class RunTrace:
    agent_name: str
    trace_parent: str | None


async def load_run_trace(conn: AsyncConnection, run_id: int) -> RunTrace | None:
    row = (await conn.execute(LOAD_RUN_TRACE, {"run_id": run_id})).first()
    return None if row is None else RunTrace(str(row.agent_name), row.trace_parent)


async def save_trace_parent(engine: AsyncEngine, run_id: int, trace_parent: str) -> None:
    """Save the run's traceparent unless it has one."""
    async with engine.begin() as conn:
        await conn.execute(SAVE_TRACE_PARENT, {"run_id": run_id, "trace_parent": trace_parent})


async def pending_approval(engine: AsyncEngine, run_id: int) -> tuple[int, str] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(PENDING_APPROVAL, {"run_id": run_id})).first()
    return None if row is None else (int(row.id), str(row.tool_name))


async def delivery_trace_parent(engine: AsyncEngine, delivery_id: int) -> str | None:
    async with autocommit(engine) as conn:
        row = await direct.fetch_one(conn, DELIVERY_TRACE_PARENT, {"delivery_id": delivery_id})
    return None if row is None or row.trace_parent is None else str(row.trace_parent)


async def trace_parents(conn: AsyncConnection, run_ids: Sequence[int]) -> list[tuple[int, str]]:
    """(run id, traceparent) of the runs of `run_ids` that have one (`Run.traceId`'s loader)."""
    rows = await conn.execute(TRACE_PARENTS, {"ids": list(run_ids)})
    return [(int(row.id), str(row.trace_parent)) for row in rows]
