"""The `agent_runs` row and the reads the API makes of the journal: runs by id, each agent's
active and last finished run (whole or narrow), journal pages per agent and across agents, a
run's retry and its owner.

The statements of a run's life (request, claim, start, heartbeat, finish, cancel, reap) live in
`db/runs.py`, which re-exports these names.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db.rows import AnyRow, columns, narrow, read_rows
from agent_engine.domain.runs import TERMINAL_STATES, UNFINISHED_STATES, RunState


@dataclass(frozen=True, slots=True)
class RunRow:
    """One `agent_runs` row."""

    id: int
    agent_id: int
    trigger: str
    state: str
    reason: str | None
    output: str | None
    tokens_used: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    model_id: int | None
    last_sent_at: datetime | None
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal | None
    # A retry run: the failed run it continues (e0012_runs_recover).
    retry_of: int | None = None

    @classmethod
    def from_row(cls, row: AnyRow) -> RunRow:
        m = columns(row)
        return cls(
            id=int(m["id"]),
            agent_id=int(m["agent_id"]),
            trigger=m["trigger"],
            state=m["state"],
            reason=m["reason"],
            output=m["output"],
            tokens_used=int(m["tokens_used"]),
            error=m["error"],
            started_at=m["started_at"],
            finished_at=m["finished_at"],
            heartbeat_at=m["heartbeat_at"],
            created_at=m["created_at"],
            model_id=m["model_id"],
            last_sent_at=m["last_sent_at"],
            prompt_tokens=int(m["prompt_tokens"]),
            completion_tokens=int(m["completion_tokens"]),
            cost=m["cost"],
            retry_of=m.get("retry_of"),
        )


# --- reads for the API ----------------------------------------------------------------------------


def _states_sql(states: frozenset[RunState]) -> str:
    """A literal state list: the partial indexes match on it, as a parameter they would not."""
    return ", ".join(f"'{state.value}'" for state in RunState if state in states)


RUNS_BY_ID = text("SELECT * FROM agent_runs WHERE id = ANY(CAST(:ids AS bigint[]))")
# For `lastRun`: the newest finished run per agent via the journal index, one LATERAL probe each.
_LAST_FINISHED_RUNS = (
    "SELECT {outer} FROM unnest(CAST(:ids AS bigint[])) AS a(id)"
    " CROSS JOIN LATERAL (SELECT {columns} FROM agent_runs"
    f"   WHERE agent_id = a.id AND state IN ({_states_sql(TERMINAL_STATES)})"
    "   ORDER BY id DESC LIMIT 1) AS r"
)
_ACTIVE_RUNS = (
    "SELECT {columns} FROM agent_runs WHERE agent_id = ANY(CAST(:ids AS bigint[]))"
    f" AND state IN ({_states_sql(UNFINISHED_STATES)})"
)
LAST_FINISHED_RUNS = text(_LAST_FINISHED_RUNS.format(outer="r.*", columns="*"))
ACTIVE_RUNS = text(_ACTIVE_RUNS.format(columns="*"))
_UNFINISHED = frozenset(str(state) for state in UNFINISHED_STATES)
# What a narrow read of runs always has: the key, the agent and the state (which tells an active
# run from a finished one).
_NARROW_RUN_KEYS = ("id", "agent_id", "state")


def active_and_last_runs_sql(columns: tuple[str, ...] | None) -> str:
    """SQL: the active and the last finished run of each agent of `:ids` (a run's state tells
    which it is: the two sets of states do not meet); only `columns` of each run when given."""
    listed = "*" if columns is None else ", ".join(columns)
    outer = "r.*" if columns is None else ", ".join(f"r.{column}" for column in columns)
    return (
        f"{_ACTIVE_RUNS.format(columns=listed)}"
        f" UNION ALL {_LAST_FINISHED_RUNS.format(outer=outer, columns=listed)}"
    )


@functools.lru_cache(maxsize=64)
def _active_and_last_runs(columns: tuple[str, ...] | None) -> TextClause:
    """Both for a page of agents in one round trip."""
    return text(active_and_last_runs_sql(columns))


def narrow_run_columns(columns: Collection[str] | None) -> tuple[str, ...] | None:
    """The columns of a narrow read of runs showing `columns` (with the key, agent and state);
    None for whole rows."""
    return None if columns is None else narrow(RunRow, columns, always=_NARROW_RUN_KEYS)


def split_active_and_last(rows: Iterable[RunRow]) -> tuple[list[RunRow], list[RunRow]]:
    """Runs of `active_and_last_runs_sql` told apart by their state."""
    active: list[RunRow] = []
    last: list[RunRow] = []
    for row in rows:
        (active if row.state in _UNFINISHED else last).append(row)
    return active, last


# A journal page per agent: every `Agent.runs` of a request with the same arguments in one
# statement (an index probe per agent on ix_agent_runs_journal), not one statement per agent.
_RUN_PAGES = (
    "SELECT r.* FROM unnest(CAST(:ids AS bigint[])) AS a(id)"
    " CROSS JOIN LATERAL (SELECT * FROM agent_runs WHERE agent_id = a.id{filters}"
    "   ORDER BY id DESC LIMIT :limit) AS r"
)
RUN_OWNER = text(
    "SELECT a.user_id FROM agent_runs r JOIN agents a ON a.id = r.agent_id WHERE r.id = :id"
)


async def _runs(conn: AsyncConnection, statement: TextClause, ids: Sequence[int]) -> list[RunRow]:
    rows = await direct.fetch(conn, statement, {"ids": list(ids)})
    return read_rows(rows, RunRow)


async def runs_by_id(conn: AsyncConnection, run_ids: Sequence[int]) -> list[RunRow]:
    return await _runs(conn, RUNS_BY_ID, run_ids)


# `Run.retriedBy`: the retry of each run, through the unique index on `retry_of`.
RETRIES_OF_RUNS = text("SELECT * FROM agent_runs WHERE retry_of = ANY(CAST(:ids AS bigint[]))")


async def retries_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[RunRow]:
    """The retry run of each of the runs (runs not retried are left out)."""
    return await _runs(conn, RETRIES_OF_RUNS, run_ids)


async def last_finished_runs(conn: AsyncConnection, agent_ids: Sequence[int]) -> list[RunRow]:
    """Each agent's newest finished run (agents without one are left out)."""
    return await _runs(conn, LAST_FINISHED_RUNS, agent_ids)


async def active_runs(conn: AsyncConnection, agent_ids: Sequence[int]) -> list[RunRow]:
    """Each agent's unfinished run, if any."""
    return await _runs(conn, ACTIVE_RUNS, agent_ids)


async def active_and_last_runs(
    conn: AsyncConnection, agent_ids: Sequence[int], columns: Collection[str] | None = None
) -> tuple[list[RunRow], list[RunRow]]:
    """`active_runs` and `last_finished_runs` of the same agents, in one statement.

    With `columns`, each row is read narrow: only those columns and the key, agent and state;
    reading any other attribute of such a row raises AttributeError (`read_rows(partial=True)`).
    A page that shows a run's id need not decode its output, error, cost and five timestamps.
    """
    chosen = narrow_run_columns(columns)
    rows = await direct.fetch(conn, _active_and_last_runs(chosen), {"ids": list(agent_ids)})
    return split_active_and_last(read_rows(rows, RunRow, partial=chosen is not None))


async def run_pages(
    conn: AsyncConnection,
    agent_ids: Sequence[int],
    *,
    limit: int,
    after: int | None,
    states: Sequence[str] | None,
) -> list[RunRow]:
    """Up to `limit` runs per agent, newest first, below the keyset cursor `after`."""
    filters = ""
    params: dict[str, Any] = {"ids": sorted(set(agent_ids)), "limit": limit}
    if after is not None:
        filters += " AND id < :after"
        params["after"] = after
    if states is not None:
        filters += " AND state = ANY(CAST(:states AS text[]))"
        params["states"] = list(states)
    rows = await conn.execute(text(_RUN_PAGES.format(filters=filters)), params)
    return read_rows(rows, RunRow)


async def journal_page(
    conn: AsyncConnection,
    *,
    limit: int,
    after: int | None = None,
    agent_id: int | None = None,
    states: Sequence[RunState] | None = None,
) -> list[tuple[RunRow, int]]:
    """Runs newest first, keyset-paged by id, each with its agent's owner; runs of hidden
    (deleted) agents are left out."""
    where = ["a.deleted_at IS NULL"]
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        where.append("r.id < :after")
        params["after"] = after
    if agent_id is not None:
        where.append("r.agent_id = :agent_id")
        params["agent_id"] = agent_id
    if states is not None:
        where.append("r.state = ANY(CAST(:states AS text[]))")
        params["states"] = [s.value for s in states]
    statement = text(
        "SELECT r.*, a.user_id AS owner_id FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
        f" WHERE {' AND '.join(where)} ORDER BY r.id DESC LIMIT :limit"
    )
    rows = await conn.execute(statement, params)
    return [(RunRow.from_row(row), int(row["owner_id"])) for row in rows.mappings()]


async def run_owner(conn: AsyncConnection, run_id: int) -> int | None:
    """The owner of the run's agent; None when the run does not exist."""
    owner = (await conn.execute(RUN_OWNER, {"id": run_id})).scalar_one_or_none()
    return None if owner is None else int(owner)
