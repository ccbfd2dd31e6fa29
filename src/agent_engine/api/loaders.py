"""Per-request DataLoaders: one statement per kind of row, however many objects ask for it.

A page of agents with their model, tools, owner, last and active run and the owner's budget costs
the same handful of statements for 10 agents as for 100.

The request's shared connection and the loaders' shared futures: `api/reads.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from strawberry.dataloader import DataLoader

from agent_engine.api.reads import CONNECTION_LINGER_SECONDS as CONNECTION_LINGER_SECONDS
from agent_engine.api.reads import Fetch, RequestReads, RunPageKey
from agent_engine.api.reads import SharedLoader as SharedLoader
from agent_engine.db import agents as agents_db
from agent_engine.db import approvals as approvals_db
from agent_engine.db import catalog, deliveries, pages, run_steps, run_traces
from agent_engine.db import connection_waits as waits_db
from agent_engine.db import runs as runs_db
from agent_engine.db import tool_sources as tool_sources_db
from agent_engine.db import users as users_db
from agent_engine.db.agents import AgentRow
from agent_engine.db.alerts import BudgetAlertRow
from agent_engine.db.approvals import ApprovalRow
from agent_engine.db.catalog import AgentModelRow, ToolRow
from agent_engine.db.connection_waits import PendingConnection
from agent_engine.db.deliveries import DeliveryTargetRow, RunDeliveryRow
from agent_engine.db.platform import PlatformSettings
from agent_engine.db.run_steps import StepRow
from agent_engine.db.runs import RunRow
from agent_engine.db.tool_sources import ToolSourceRow
from agent_engine.db.users import UserRow
from agent_engine.domain.budget import Budget

T = TypeVar("T")


@dataclass(frozen=True)
class PageRelations:
    """The related rows of a page of agents, by agent id (models by model id)."""

    models: dict[int, AgentModelRow]
    tools: dict[int, list[ToolRow]]
    active_runs: dict[int, RunRow]
    last_runs: dict[int, RunRow]


class Loaders:
    def __init__(self, engine: AsyncEngine, *, now: datetime) -> None:
        self._reads = RequestReads(engine, now=now)
        # Agents a page already read, until (if ever) `agent` is asked for.
        self._primed_agents: dict[int, AgentRow] = {}

    # Each loader is made when first asked for (a request uses a few of them). Their load
    # functions belong to `RequestReads` (`api/reads.py`), which knows nothing of the loaders: no
    # reference cycle, so a request's loaders and their cached rows are freed when the request
    # ends, not by the garbage collector.

    @functools.cached_property
    def agent(self) -> DataLoader[int, AgentRow | None]:
        loader = self._reads.by_key(agents_db.live_agents_by_id, lambda row: row.id)
        loader.prime_many(self._primed_agents, force=True)
        self._primed_agents.clear()
        return loader

    @functools.cached_property
    def agent_as_it_was(self) -> DataLoader[int, AgentRow | None]:
        """Hidden (deleted) agents included: the agent a run or an approval read before the
        deletion shows (`Run.agent` and `ToolApproval.agent` are non-null)."""
        return self._reads.by_key(agents_db.agents_as_they_were, lambda row: row.id)

    @functools.cached_property
    def user(self) -> DataLoader[int, UserRow | None]:
        return self._reads.by_key(users_db.users_by_id, lambda row: row.id)

    @functools.cached_property
    def model(self) -> DataLoader[int, AgentModelRow | None]:
        return self._reads.by_key(catalog.models_by_id, lambda row: row.id)

    @functools.cached_property
    def run(self) -> DataLoader[int, RunRow | None]:
        return self._reads.by_key(runs_db.runs_by_id, lambda row: row.id)

    @functools.cached_property
    def last_run(self) -> DataLoader[int, RunRow | None]:
        return self._reads.by_key(runs_db.last_finished_runs, lambda row: row.agent_id)

    @functools.cached_property
    def active_run(self) -> DataLoader[int, RunRow | None]:
        return self._reads.by_key(runs_db.active_runs, lambda row: row.agent_id)

    @functools.cached_property
    def tools_of_agent(self) -> DataLoader[int, list[ToolRow]]:
        return self._reads.grouped(catalog.tools_of_agents)

    @functools.cached_property
    def tool(self) -> DataLoader[int, ToolRow | None]:
        return self._reads.by_key(catalog.tools_by_id, lambda row: row.id)

    @functools.cached_property
    def auto_approved_of_agent(self) -> DataLoader[int, list[ToolRow]]:
        return self._reads.grouped(catalog.auto_approved_of_agents)

    # Approvals: the one a run is parked on, and every one of a run (its steps').

    @functools.cached_property
    def pending_approval(self) -> DataLoader[int, ApprovalRow | None]:
        return self._reads.by_key(approvals_db.pending_of_runs, lambda row: row.run_id)

    @functools.cached_property
    def pending_connection(self) -> DataLoader[int, PendingConnection | None]:
        """The owner's connection a parked run waits for (`db/connection_waits.py`)."""
        return self._reads.by_key(waits_db.pending_of_runs, lambda row: row.run_id)

    @functools.cached_property
    def approvals_of_run(self) -> DataLoader[int, list[ApprovalRow]]:
        return self._reads.grouped(_keyed(approvals_db.approvals_of_runs, lambda row: row.run_id))

    @functools.cached_property
    def trace_parent(self) -> DataLoader[int, tuple[int, str] | None]:
        """The run's saved trace context (tracing on): (run id, W3C traceparent)."""
        return self._reads.by_key(run_traces.trace_parents, lambda row: row[0])

    # MCP sources of tools, and the tools of sources.

    @functools.cached_property
    def tool_source(self) -> DataLoader[int, ToolSourceRow | None]:
        return self._reads.by_key(tool_sources_db.sources_by_id, lambda row: row.id)

    @functools.cached_property
    def tools_of_source(self) -> DataLoader[int, list[ToolRow]]:
        return self._reads.grouped(_keyed(catalog.tools_of_sources, lambda row: row.source_id or 0))

    @functools.cached_property
    def connected_owners(self) -> DataLoader[int, int]:
        """How many owners have a CONNECTED account at each source: one statement per page."""
        return SharedLoader(load_fn=self._reads.load_connected_owners)

    @functools.cached_property
    def budget(self) -> DataLoader[int, Budget]:
        return SharedLoader(load_fn=self._reads.load_budgets)

    # The transcript and deliveries of a page of runs, one statement each.

    @functools.cached_property
    def steps_of_run(self) -> DataLoader[int, list[StepRow]]:
        return self._reads.grouped(_keyed(run_steps.steps_of_runs, lambda row: row.run_id))

    @functools.cached_property
    def deliveries_of_run(self) -> DataLoader[int, list[RunDeliveryRow]]:
        return self._reads.grouped(_keyed(deliveries.deliveries_of_runs, lambda row: row.run_id))

    @functools.cached_property
    def targets_of_agent(self) -> DataLoader[int, list[DeliveryTargetRow]]:
        return self._reads.grouped(deliveries.targets_of_agents)

    @functools.cached_property
    def agents_of_owner(self) -> DataLoader[int, list[AgentRow]]:
        return self._reads.grouped(_keyed(agents_db.live_agents_of_owners, lambda row: row.user_id))

    @functools.cached_property
    def run_page(self) -> DataLoader[RunPageKey, list[RunRow]]:
        return SharedLoader(load_fn=self._reads.load_run_pages)

    # Spend: the week's cost per owner, each agent's pace, this week's alerts.

    @functools.cached_property
    def budget_cost(self) -> DataLoader[int, Decimal | None]:
        return SharedLoader(load_fn=self._reads.load_budget_costs)

    @functools.cached_property
    def agent_week_tokens(self) -> DataLoader[int, int]:
        """Each agent's tokens in the current budget week: one statement per page of agents."""
        return SharedLoader(load_fn=self._reads.load_agent_week_tokens)

    @functools.cached_property
    def retry_of_run(self) -> DataLoader[int, RunRow | None]:
        """The retry run of each run, if any (`Run.retriedBy`)."""
        return self._reads.by_key(runs_db.retries_of_runs, lambda row: row.retry_of or 0)

    @functools.cached_property
    def expected_tokens(self) -> DataLoader[int, int | None]:
        return SharedLoader(load_fn=self._reads.load_expected_tokens)

    @functools.cached_property
    def alerts_this_week(self) -> DataLoader[int, list[BudgetAlertRow]]:
        return SharedLoader(load_fn=self._reads.load_alerts_this_week)

    async def platform(self) -> PlatformSettings:
        """Platform settings, read once per request."""
        return await self._reads.platform()

    def prime_platform(self, stored: dict[str, Any]) -> None:
        """The stored settings (one JSON object) the request read with its viewer."""
        self._reads.prime_platform(stored)

    def forget_platform(self) -> None:
        """The request changed the settings (`updatePlatformSettings`)."""
        self._reads.forget_platform()

    async def page_relations(
        self,
        agent_ids: Sequence[int],
        model_ids: Sequence[int],
        run_columns: Collection[str] | None = None,
    ) -> PageRelations:
        """Everything a page of agents shows about each, in one statement (`db.pages`) and one
        turn of the request's connection (`_page_turn`).

        The rows of the per-agent loaders, read directly: a page asks for all of its keys at
        once, so a future per key and agent (DataLoader) would only cost CPU. With
        `run_columns`, the runs are narrow rows of those columns (`runs.active_and_last_runs`).
        """
        async with self._page_turn() as conn:
            return await _page_relations(conn, agent_ids, model_ids, run_columns)

    async def narrow_page(
        self,
        owner_id: int,
        agent_columns: Collection[str],
        run_columns: Collection[str] | None,
    ) -> tuple[list[AgentRow], PageRelations]:
        """The owner's live agents as narrow rows of `agent_columns` (never primed, since `agent`
        answers whole rows) and their relations (`page_relations`), in one turn."""
        async with self._page_turn() as conn:
            rows = await agents_db.live_agents_of_owners(conn, [owner_id], agent_columns)
            if not rows:
                return rows, PageRelations({}, {}, {}, {})
            model_ids = sorted({r.model_id for r in rows if r.model_id is not None})
            found = await _page_relations(conn, [r.id for r in rows], model_ids, run_columns)
        return rows, found

    @contextlib.asynccontextmanager
    async def _page_turn(self) -> AsyncIterator[AsyncConnection]:
        """The request's connection for all of a page's reads, one after the other with no
        other read of the request between them. A read that waited meanwhile (the viewer's
        budget, which nothing else waits for) is then let send its statement before the page's
        objects are made and completed, so the database answers it while the api works: at one
        client that hides the budget's statement behind the page's CPU instead of adding it
        to the page's wait."""
        async with self._reads.connection() as conn:
            yield conn
        await asyncio.sleep(0)  # the waiting read's task runs up to its statement's answer

    def prime_agent(self, row: AgentRow) -> None:
        """An agent row read for the request: `agent` answers it without a statement (kept
        as a row until `agent` is first asked for: a page primes a hundred and rarely asks)."""
        loader: DataLoader[int, AgentRow | None] | None = self.__dict__.get("agent")
        if loader is None:
            self._primed_agents[row.id] = row
        else:
            loader.prime(row.id, row, force=True)

    def forget_agent(self, agent_id: int) -> None:
        """After a write: the next read of this agent's rows goes to the database."""
        self._primed_agents.pop(agent_id, None)
        for name in ("agent", "tools_of_agent", "active_run", "last_run", "targets_of_agent"):
            loader: DataLoader[int, Any] | None = self.__dict__.get(name)  # made if ever asked
            if loader is not None and loader.cache_map.get(agent_id) is not None:
                loader.clear(agent_id)  # clear() raises on a missing key

    async def release(self) -> None:
        """Return the shared connection to the pool now (the end of a request)."""
        await self._reads.release()

    def connection(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """The request's shared autocommit connection, by turns (also for the viewer's lookup,
        so a request checks out one pooled connection, not two)."""
        return self._reads.connection()


async def _page_relations(
    conn: AsyncConnection,
    agent_ids: Sequence[int],
    model_ids: Sequence[int],
    run_columns: Collection[str] | None,
) -> PageRelations:
    found = await pages.page_relations(conn, agent_ids, model_ids, run_columns)
    tools: dict[int, list[ToolRow]] = {i: [] for i in agent_ids}
    for agent_id, tool in found.tools:
        tools[agent_id].append(tool)
    return PageRelations(
        {r.id: r for r in found.models},
        tools,
        {r.agent_id: r for r in found.active_runs},
        {r.agent_id: r for r in found.last_runs},
    )


def _keyed(fetch: Fetch[T], key: Callable[[T], int]) -> Fetch[tuple[int, T]]:
    """`fetch` with each row paired with the key it is grouped by."""

    async def keyed(conn: AsyncConnection, ids: Sequence[int]) -> list[tuple[int, T]]:
        return [(key(row), row) for row in await fetch(conn, ids)]

    return keyed
