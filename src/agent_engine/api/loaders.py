"""Per-request DataLoaders: one statement per kind of row, however many objects ask for it.

A page of agents with their model, tools, owner, last and active run and the owner's budget costs
the same handful of statements for 10 agents as for 100.

The batches of a request share one pooled connection (autocommit: no BEGIN/ROLLBACK around each
read), taken by turns since resolvers run concurrently and an AsyncConnection is not for
concurrent use. It is held only while batches run or follow each other: released after
`CONNECTION_LINGER_SECONDS` without one (and at the end of the request), so a request never
holds it while another of its resolvers waits for the pool indefinitely.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from strawberry.dataloader import DataLoader

from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.domain.budget import Budget, week_window
from agent_engine.domain.forecast import expected_tokens_per_run
from agent_engine.runs.alerts import BudgetAlert, alerts_of_owners
from agent_engine.runs.budget import owners_budgets
from agent_engine.runs.spend import recent_tokens, spent_costs

Row = dict[str, Any]

# Finished runs, for `lastRun`: the newest per agent via the journal index, one LATERAL probe each.
_LAST_FINISHED_RUNS = text(
    "SELECT r.* FROM unnest(CAST(:ids AS bigint[])) AS a(id)"
    " CROSS JOIN LATERAL (SELECT * FROM agent_runs"
    "   WHERE agent_id = a.id AND state IN ('succeeded', 'failed', 'skipped')"
    "   ORDER BY id DESC LIMIT 1) AS r"
)
_ACTIVE_RUNS = text(
    "SELECT * FROM agent_runs WHERE agent_id = ANY(CAST(:ids AS bigint[]))"
    " AND state IN ('queued', 'running')"
)
# Hidden (deleted) agents are in no view; only the budget sum still reads them.
_AGENTS_OF_OWNERS = text(
    "SELECT * FROM agents WHERE user_id = ANY(CAST(:ids AS bigint[])) AND deleted_at IS NULL"
    " ORDER BY id"
)
_TOOLS_OF_AGENTS = text(
    "SELECT at.agent_id, t.* FROM agent_tools at JOIN tools t ON t.id = at.tool_id"
    " WHERE at.agent_id = ANY(CAST(:ids AS bigint[])) ORDER BY t.name"
)

_STEPS_OF_RUNS = text(
    "SELECT * FROM agent_run_steps WHERE run_id = ANY(CAST(:ids AS bigint[]))"
    " ORDER BY run_id, index"
)
_DELIVERIES_OF_RUNS = text(
    "SELECT d.*, t.name AS target_name, t.url AS target_url, t.secret_env AS target_secret_env,"
    " t.enabled AS target_enabled"
    " FROM run_deliveries d JOIN delivery_targets t ON t.id = d.target_id"
    " WHERE d.run_id = ANY(CAST(:ids AS bigint[])) ORDER BY d.run_id, t.name, t.id"
)
_TARGETS_OF_AGENTS = text(
    "SELECT adt.agent_id, t.* FROM agent_delivery_targets adt"
    " JOIN delivery_targets t ON t.id = adt.target_id"
    " WHERE adt.agent_id = ANY(CAST(:ids AS bigint[])) ORDER BY t.name, t.id"
)


# A journal page per agent: every `Agent.runs` of a request with the same arguments in one
# statement (an index probe per agent on ix_agent_runs_journal), not one statement per agent.
_RUN_PAGES = (
    "SELECT r.* FROM unnest(CAST(:ids AS bigint[])) AS a(id)"
    " CROSS JOIN LATERAL (SELECT * FROM agent_runs WHERE agent_id = a.id{filters}"
    "   ORDER BY id DESC LIMIT :limit) AS r"
)

# (agent id, rows to fetch, keyset cursor, states filter)
RunPageKey = tuple[int, int, int | None, tuple[str, ...] | None]


# Long enough to bridge the event-loop turns between one level of resolvers and the next.
CONNECTION_LINGER_SECONDS = 0.01


def _by_id(table: str) -> TextClause:
    return text(f"SELECT * FROM {table} WHERE id = ANY(CAST(:ids AS bigint[]))")


_AGENTS_BY_ID = text(
    "SELECT * FROM agents WHERE id = ANY(CAST(:ids AS bigint[])) AND deleted_at IS NULL"
)
_USERS_BY_ID = _by_id("users")
_MODELS_BY_ID = _by_id("agent_models")
_RUNS_BY_ID = _by_id("agent_runs")


@dataclass(frozen=True)
class PageRelations:
    """The related rows of a page of agents, by agent id (models by model id)."""

    models: dict[int, Row]
    tools: dict[int, list[Row]]
    active_runs: dict[int, Row]
    last_runs: dict[int, Row]


class Loaders:
    def __init__(self, engine: AsyncEngine, *, now: datetime) -> None:
        self._engine = engine
        self._now = now
        self._platform: asyncio.Task[PlatformSettings] | None = None
        self._conn: AsyncConnection | None = None
        self._turn = asyncio.Lock()
        self._users = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._releasing: asyncio.Task[None] | None = None
        self.agent: DataLoader[int, Row | None] = self._rows_by_key(_AGENTS_BY_ID, "id")
        self.user: DataLoader[int, Row | None] = self._rows_by_key(_USERS_BY_ID, "id")
        self.model: DataLoader[int, Row | None] = self._rows_by_key(_MODELS_BY_ID, "id")
        self.run: DataLoader[int, Row | None] = self._rows_by_key(_RUNS_BY_ID, "id")
        self.last_run: DataLoader[int, Row | None] = self._rows_by_key(
            _LAST_FINISHED_RUNS, "agent_id"
        )
        self.active_run: DataLoader[int, Row | None] = self._rows_by_key(_ACTIVE_RUNS, "agent_id")
        self.tools_of_agent: DataLoader[int, list[Row]] = DataLoader(
            load_fn=self._load_tools_of_agents
        )
        self.budget: DataLoader[int, Budget] = DataLoader(load_fn=self._load_budgets)
        # The transcript and deliveries of a page of runs, one statement each.
        self.steps_of_run: DataLoader[int, list[Row]] = self._grouped(_STEPS_OF_RUNS, "run_id")
        self.deliveries_of_run: DataLoader[int, list[Row]] = self._grouped(
            _DELIVERIES_OF_RUNS, "run_id"
        )
        self.targets_of_agent: DataLoader[int, list[Row]] = self._grouped(
            _TARGETS_OF_AGENTS, "agent_id", drop_key=True
        )
        self.agents_of_owner: DataLoader[int, list[Row]] = DataLoader(
            load_fn=self._load_agents_of_owners
        )
        self.run_page: DataLoader[RunPageKey, list[Row]] = DataLoader(load_fn=self._load_run_pages)
        # Spend (issue 17): the week's cost per owner, each agent's pace, this week's alerts.
        self.budget_cost: DataLoader[int, Decimal | None] = DataLoader(
            load_fn=self._load_budget_costs
        )
        self.expected_tokens: DataLoader[int, int | None] = DataLoader(
            load_fn=self._load_expected_tokens
        )
        self.alerts_this_week: DataLoader[int, list[BudgetAlert]] = DataLoader(
            load_fn=self._load_alerts_this_week
        )

    async def platform(self) -> PlatformSettings:
        """Platform settings, read once per request."""
        if self._platform is None:
            self._platform = asyncio.ensure_future(self._load_platform())
        return await asyncio.shield(self._platform)

    async def page_relations(
        self, agent_ids: Sequence[int], model_ids: Sequence[int]
    ) -> PageRelations:
        """Everything a page of agents shows about each, one statement per kind of row.

        The same statements as the per-agent loaders, called directly: a page asks for all of
        its keys at once, so a future per key and agent (DataLoader) would only cost CPU.
        """
        models = {int(r["id"]): r for r in await self._fetch(_MODELS_BY_ID, model_ids)}
        tools: dict[int, list[Row]] = {i: [] for i in agent_ids}
        for row in await self._fetch(_TOOLS_OF_AGENTS, agent_ids):
            tools[int(row.pop("agent_id"))].append(row)
        active = {int(r["agent_id"]): r for r in await self._fetch(_ACTIVE_RUNS, agent_ids)}
        last = {int(r["agent_id"]): r for r in await self._fetch(_LAST_FINISHED_RUNS, agent_ids)}
        return PageRelations(models, tools, active, last)

    def prime_agent(self, row: Row) -> None:
        self.agent.prime(int(row["id"]), row, force=True)

    def forget_agent(self, agent_id: int) -> None:
        """After a write: the next read of this agent's rows goes to the database."""
        loaders: tuple[DataLoader[int, Any], ...] = (
            self.agent,
            self.tools_of_agent,
            self.active_run,
            self.last_run,
            self.targets_of_agent,
        )
        for loader in loaders:
            if loader.cache_map.get(agent_id) is not None:  # clear() raises on a missing key
                loader.clear(agent_id)

    async def release(self) -> None:
        """Return the shared connection to the pool now (the end of a request)."""
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        async with self._turn:
            await self._close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """The request's shared autocommit connection, by turns (also for the viewer's lookup,
        so a request checks out one pooled connection, not two)."""
        self._users += 1
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        try:
            async with self._turn:
                if self._conn is None:
                    conn = await self._engine.connect()
                    self._conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                try:
                    yield self._conn
                except BaseException:
                    await self._close()  # a failed or cancelled statement: start afresh
                    raise
        finally:
            self._users -= 1
            if self._users == 0 and self._conn is not None:
                self._release_timer = asyncio.get_running_loop().call_later(
                    CONNECTION_LINGER_SECONDS, self._release_if_idle
                )

    def _release_if_idle(self) -> None:
        self._release_timer = None
        if self._users == 0 and self._conn is not None:
            self._releasing = asyncio.ensure_future(self.release())

    async def _close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close()

    async def _load_platform(self) -> PlatformSettings:
        async with self.connection() as conn:
            return await load_platform_settings(conn)

    def _rows_by_key(self, statement: TextClause, key: str) -> DataLoader[int, Row | None]:
        async def load(ids: Sequence[int]) -> list[Row | None]:
            rows = await self._fetch(statement, ids)
            found = {int(row[key]): row for row in rows}
            return [found.get(i) for i in ids]

        return DataLoader(load_fn=load)

    def _grouped(
        self, statement: TextClause, key: str, *, drop_key: bool = False
    ) -> DataLoader[int, list[Row]]:
        async def load(ids: Sequence[int]) -> list[list[Row]]:
            grouped: dict[int, list[Row]] = {i: [] for i in ids}
            for row in await self._fetch(statement, ids):
                owner = int(row.pop(key) if drop_key else row[key])
                grouped[owner].append(row)
            return [grouped[i] for i in ids]

        return DataLoader(load_fn=load)

    async def _load_tools_of_agents(self, ids: Sequence[int]) -> list[list[Row]]:
        grouped: dict[int, list[Row]] = {i: [] for i in ids}
        for row in await self._fetch(_TOOLS_OF_AGENTS, ids):
            agent_id = int(row.pop("agent_id"))
            grouped[agent_id].append(row)
        return [grouped[i] for i in ids]

    async def _load_agents_of_owners(self, owner_ids: Sequence[int]) -> list[list[Row]]:
        grouped: dict[int, list[Row]] = {i: [] for i in owner_ids}
        for row in await self._fetch(_AGENTS_OF_OWNERS, owner_ids):
            grouped[int(row["user_id"])].append(row)
        return [grouped[i] for i in owner_ids]

    async def _load_run_pages(self, keys: Sequence[RunPageKey]) -> list[list[Row]]:
        groups: dict[tuple[int, int | None, tuple[str, ...] | None], list[int]] = {}
        for agent_id, limit, after, states in keys:
            groups.setdefault((limit, after, states), []).append(agent_id)
        pages: dict[RunPageKey, list[Row]] = {}
        for (limit, after, states), agent_ids in groups.items():
            filters = ""
            params: dict[str, Any] = {"ids": sorted(set(agent_ids)), "limit": limit}
            if after is not None:
                filters += " AND id < :after"
                params["after"] = after
            if states is not None:
                filters += " AND state = ANY(CAST(:states AS text[]))"
                params["states"] = list(states)
            for agent_id in agent_ids:
                pages[(agent_id, limit, after, states)] = []
            async with self.connection() as conn:
                result = await conn.execute(text(_RUN_PAGES.format(filters=filters)), params)
                for row in result.mappings():
                    pages[(int(row["agent_id"]), limit, after, states)].append(dict(row))
        return [pages[key] for key in keys]

    async def _load_budgets(self, owner_ids: Sequence[int]) -> list[Budget]:
        platform = await self.platform()
        async with self.connection() as conn:
            budgets = await owners_budgets(conn, list(owner_ids), now=self._now, platform=platform)
        return [budgets[i] for i in owner_ids]

    async def _load_budget_costs(self, owner_ids: Sequence[int]) -> list[Decimal | None]:
        platform = await self.platform()
        window = week_window(self._now, platform.zone)
        async with self.connection() as conn:
            costs = await spent_costs(conn, list(owner_ids), window=window)
        return [costs[i] for i in owner_ids]

    async def _load_expected_tokens(self, agent_ids: Sequence[int]) -> list[int | None]:
        async with self.connection() as conn:
            recent = await recent_tokens(conn, list(agent_ids))
        return [expected_tokens_per_run(recent.get(i, [])) for i in agent_ids]

    async def _load_alerts_this_week(self, owner_ids: Sequence[int]) -> list[list[BudgetAlert]]:
        platform = await self.platform()
        window = week_window(self._now, platform.zone)
        async with self.connection() as conn:
            alerts = await alerts_of_owners(conn, list(owner_ids), window_start=window.start)
        return [alerts.get(i, []) for i in owner_ids]

    async def _fetch(self, statement: TextClause, ids: Sequence[int]) -> list[Row]:
        async with self.connection() as conn:
            result = await conn.execute(statement, {"ids": list(ids)})
            return [dict(row) for row in result.mappings()]
