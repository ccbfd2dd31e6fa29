"""Spend over the run journal: tokens and cost per owner in a budget week, each agent's recent
tokens (its pace), the admin's spend report. A constant number of statements however many agents
or owners; the rules that use them live in `domain/budget.py` and `domain/forecast.py`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db.rows import AnyRow, columns
from agent_engine.domain.budget import BudgetWindow
from agent_engine.domain.forecast import EXPECTED_TOKENS_SAMPLE_RUNS

# The runs that count in their owner's (`a.user_id`) budget week: finished in [:start, :end).
# Many owners at once (the scheduler's batch): the planner joins the week's runs to their agents.
WEEK_RUNS_OF_OWNERS = (
    " FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    " WHERE r.finished_at >= :start AND r.finished_at < :end"
)


def _owner_week(owner: str, *, per_agent: str, total: str) -> str:
    """SQL: a sum over one owner's budget week (`owner` names the owner's id in the enclosing
    statement): `per_agent` sums each agent's runs (`r`) of the week as `w.used`, `total` sums
    those.

    Summed agent by agent, each agent's week one range of `ix_agent_runs_budget (agent_id,
    finished_at) INCLUDE (tokens_used)` (index-only for tokens): a probe per agent of the owner,
    whatever the week holds for everyone else. Written as a join on the week
    (`WEEK_RUNS_OF_OWNERS`), the planner read this week's finished runs through `finished_at`
    whenever its statistics predated them (a burst's first hour, before autovacuum's ANALYZE):
    every run of the week for each sum, twice a run, and the full stampede's claims took 100 ms
    each on a busy server.
    """
    return (
        f"(SELECT {total} FROM agents a CROSS JOIN LATERAL"
        f" (SELECT {per_agent} AS used FROM agent_runs r WHERE r.agent_id = a.id"
        " AND r.finished_at >= :start AND r.finished_at < :end) w"
        f" WHERE a.user_id = {owner})"
    )


def owner_week_tokens(owner: str) -> str:
    """SQL: the tokens of one owner's budget week (`owner` names the owner's id in the enclosing
    statement): the claim, the one-statement request, the alert after a finish, a page's budget.

    The week's row of `budget_weeks` when there is one: the database adds each finished run's
    tokens to it as the run is written (migration `e0008_budget_weeks`), so it equals the sum in
    every snapshot. Without one (no run of the week has counted yet, or the database keyed the
    week differently) the sum itself, agent by agent.
    """
    return (
        "COALESCE((SELECT b.tokens_used FROM budget_weeks b"
        f" WHERE b.user_id = {owner} AND b.window_start = :start AND b.window_end = :end), "
        + _owner_week(owner, per_agent="SUM(r.tokens_used)", total="COALESCE(SUM(w.used), 0)")
        + ")"
    )


def agent_week_tokens(agent: str) -> str:
    """SQL: the tokens of one agent's budget week (`:start`/`:end`; `agent` names the agent's id
    in the enclosing statement): one range of `ix_agent_runs_budget`, index-only."""
    return (
        "(SELECT COALESCE(SUM(r.tokens_used), 0) FROM agent_runs r"
        f" WHERE r.agent_id = {agent} AND r.finished_at >= :start AND r.finished_at < :end)"
    )


# A page of agents' weeks in one statement: a probe of the index per agent.
_SPENT_BY_AGENT_SQL = text(
    "SELECT t.agent_id, " + agent_week_tokens("t.agent_id") + " AS used"
    " FROM unnest(CAST(:agent_ids AS bigint[])) AS t(agent_id)"
)

# The agents whose own cap (`weekly_token_cap`) their week has reached: one statement for a batch,
# an index probe per capped agent (agents without a cap are not summed).
_AGENTS_OVER_CAP_SQL = text(
    "SELECT a.id FROM agents a WHERE a.id = ANY(CAST(:agent_ids AS bigint[]))"
    " AND a.weekly_token_cap IS NOT NULL AND "
    + agent_week_tokens("a.id")
    + " >= a.weekly_token_cap"
)

_SPENT_OF_OWNER_SQL = text("SELECT " + owner_week_tokens("CAST(:owner_id AS bigint)"))
# SUM ignores NULLs: NULL when none of the week's runs was priced.
_COST_OF_OWNER_SQL = text(
    "SELECT "
    + _owner_week("CAST(:owner_id AS bigint)", per_agent="SUM(r.cost)", total="SUM(w.used)")
)

_SPENT_BY_OWNER_SQL = text(
    "SELECT a.user_id, COALESCE(SUM(r.tokens_used), 0) AS used"
    + WEEK_RUNS_OF_OWNERS
    + " AND a.user_id = ANY(CAST(:owner_ids AS bigint[])) GROUP BY a.user_id"
)

# SUM ignores NULLs: NULL when none of the week's runs was priced.
_COST_BY_OWNER_SQL = text(
    "SELECT a.user_id, SUM(r.cost) AS cost"
    + WEEK_RUNS_OF_OWNERS
    + " AND a.user_id = ANY(CAST(:owner_ids AS bigint[])) GROUP BY a.user_id"
)

# The newest succeeded or failed runs of each agent, newest first: one index-only probe of
# `ix_agent_runs_pace` per agent.
_RECENT_TOKENS_SQL = text(
    "SELECT t.agent_id, ARRAY("
    "   SELECT r.tokens_used FROM agent_runs r"
    "   WHERE r.agent_id = t.agent_id AND r.state IN ('succeeded', 'failed')"
    f"  ORDER BY r.id DESC LIMIT {EXPECTED_TOKENS_SAMPLE_RUNS}"
    " ) AS recent"
    " FROM unnest(CAST(:agent_ids AS bigint[])) AS t(agent_id)"
)

# The admin's report: one aggregate over the week's finished runs, read through the
# `finished_at` index, whatever the number of owners. Skipped runs spent nothing and are left out.
_SPEND_BY_OWNER_SQL = text(
    "SELECT a.user_id AS owner_id, COALESCE(SUM(r.tokens_used), 0) AS tokens,"
    " SUM(r.cost) AS cost, count(*) AS runs"
    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
    " WHERE r.finished_at >= :start AND r.finished_at < :end AND r.state <> 'skipped'"
    " GROUP BY a.user_id"
    " ORDER BY tokens DESC, a.user_id"
)


@dataclass(frozen=True, slots=True)
class OwnerSpend:
    owner_id: int
    tokens: int
    cost: Decimal | None  # None: none of the week's runs was priced
    runs: int

    @classmethod
    def from_row(cls, row: AnyRow) -> OwnerSpend:
        m = columns(row)
        return cls(
            owner_id=int(m["owner_id"]),
            tokens=int(m["tokens"]),
            cost=m["cost"],
            runs=int(m["runs"]),
        )


async def spent_tokens(
    conn: AsyncConnection, owner_ids: Collection[int], *, window: BudgetWindow
) -> dict[int, int]:
    """Tokens spent per owner in the window; owners with no finished runs may be absent."""
    if not owner_ids:
        return {}
    if len(owner_ids) == 1:
        (owner_id,) = owner_ids
        ((used,),) = await direct.fetch(
            conn,
            _SPENT_OF_OWNER_SQL,
            {"owner_id": owner_id, "start": window.start, "end": window.end},
        )
        return {owner_id: int(used)}
    rows = await direct.fetch(
        conn,
        _SPENT_BY_OWNER_SQL,
        {"owner_ids": list(owner_ids), "start": window.start, "end": window.end},
    )
    return {int(owner_id): int(used) for owner_id, used in rows}


async def agents_spent_tokens(
    conn: AsyncConnection, agent_ids: Collection[int], *, window: BudgetWindow
) -> dict[int, int]:
    """Tokens each agent spent in the window (its runs finished in it), one statement."""
    if not agent_ids:
        return {}
    rows = await conn.execute(
        _SPENT_BY_AGENT_SQL,
        {"agent_ids": list(agent_ids), "start": window.start, "end": window.end},
    )
    return {int(agent_id): int(used) for agent_id, used in rows}


async def agents_at_cap(
    conn: AsyncConnection, agent_ids: Collection[int], *, window: BudgetWindow
) -> set[int]:
    """The agents with a cap of their own that their runs finished in the window reached."""
    if not agent_ids:
        return set()
    rows = await conn.execute(
        _AGENTS_OVER_CAP_SQL,
        {"agent_ids": list(agent_ids), "start": window.start, "end": window.end},
    )
    return {int(agent_id) for (agent_id,) in rows}


async def spent_costs(
    conn: AsyncConnection, owner_ids: Collection[int], *, window: BudgetWindow
) -> dict[int, Decimal | None]:
    """The week's cost per owner; None for owners with no priced run in the window."""
    if not owner_ids:
        return {}
    if len(owner_ids) == 1:
        (owner_id,) = owner_ids
        ((cost,),) = await direct.fetch(
            conn,
            _COST_OF_OWNER_SQL,
            {"owner_id": owner_id, "start": window.start, "end": window.end},
        )
        return {owner_id: cost}
    rows = await conn.execute(
        _COST_BY_OWNER_SQL,
        {"owner_ids": list(owner_ids), "start": window.start, "end": window.end},
    )
    found = {int(owner_id): cost for owner_id, cost in rows}
    return {owner_id: found.get(owner_id) for owner_id in owner_ids}


async def recent_tokens(conn: AsyncConnection, agent_ids: Collection[int]) -> dict[int, list[int]]:
    """Tokens of each agent's newest succeeded or failed runs (at most 10), newest first."""
    if not agent_ids:
        return {}
    rows = await conn.execute(_RECENT_TOKENS_SQL, {"agent_ids": list(agent_ids)})
    return {int(agent_id): [int(t) for t in recent] for agent_id, recent in rows}


async def spend_by_owner(conn: AsyncConnection, *, window: BudgetWindow) -> list[OwnerSpend]:
    """Every owner's tokens, cost and runs in the window, most tokens first: one statement."""
    rows = await conn.execute(_SPEND_BY_OWNER_SQL, {"start": window.start, "end": window.end})
    return [OwnerSpend.from_row(row) for row in rows]
