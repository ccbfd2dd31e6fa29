"""A request's reads for its DataLoaders (`api/loaders.py`).

The batches of a request share one pooled connection (autocommit: no BEGIN/ROLLBACK around each
read), taken by turns since resolvers run concurrently and an AsyncConnection is not for
concurrent use. It is held only while batches run or follow each other: released after
`CONNECTION_LINGER_SECONDS` without one (and at the end of the request), so a request never
holds it while another of its resolvers waits for the pool indefinitely.

A loader's future is shared by every field that asks for the same key, so no one of them may
cancel it (`SharedLoader`): graphql-core cancels the sibling fields of an error in a non-null
position, and a cancelled shared future would end every other field waiting on that key with a
`CancelledError` (which no resolver catches, and which used to escape the app as an HTTP 500).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from strawberry.dataloader import DataLoader

from agent_engine.db import runs as runs_db
from agent_engine.db.alerts import BudgetAlertRow, alerts_of_owners
from agent_engine.db.connections import connected_counts
from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.db.runs import RunRow
from agent_engine.db.spend import agents_spent_tokens, recent_tokens, spent_costs
from agent_engine.domain.budget import Budget, week_window
from agent_engine.domain.forecast import expected_tokens_per_run
from agent_engine.runs.budget import owners_budgets

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
Fetch = Callable[[AsyncConnection, Sequence[int]], Awaitable[list[T]]]


# (agent id, rows to fetch, keyset cursor, states filter)
RunPageKey = tuple[int, int, int | None, tuple[str, ...] | None]


# Long enough to bridge the event-loop turns between one level of resolvers and the next.
CONNECTION_LINGER_SECONDS = 0.01


class SharedLoader(DataLoader[K, V]):
    """A DataLoader whose futures no consumer can cancel.

    `load` hands each caller a shield of the shared future while it is pending: cancelling a
    caller (graphql-core cancels the siblings of a failed non-null field) cancels its shield
    only, and the batch still answers everyone else. A settled future is handed out as it is
    (nothing can cancel it any more), which keeps the usual, cached case free of the shield."""

    def load(self, key: K) -> Awaitable[V]:
        future = cast("asyncio.Future[V]", super().load(key))  # a Future, typed Awaitable
        return future if future.done() else asyncio.shield(future)


class RequestReads:
    """A request's reads: its shared connection, its platform settings and the load functions of
    its DataLoaders (which hold these, never the `Loaders`)."""

    def __init__(self, engine: AsyncEngine, *, now: datetime) -> None:
        self._engine = engine
        self._now = now
        self._platform: asyncio.Future[PlatformSettings] | None = None
        self._stored_platform: dict[str, Any] | None = None
        self._conn: AsyncConnection | None = None
        self._turn = asyncio.Lock()
        self._users = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._releasing: asyncio.Task[None] | None = None

    async def platform(self) -> PlatformSettings:
        if self._platform is None:
            if self._stored_platform is not None:
                # Read with the viewer (the usual case): parsed now, no task to schedule.
                self._platform = asyncio.get_running_loop().create_future()
                try:
                    self._platform.set_result(PlatformSettings.from_rows(self._stored_platform))
                except Exception as error:  # as the task would hold it
                    self._platform.set_exception(error)
            else:
                self._platform = asyncio.ensure_future(self._load_platform())
        return await asyncio.shield(self._platform)

    async def release(self) -> None:
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        async with self._turn:
            await self._close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
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

    def prime_platform(self, stored: dict[str, Any]) -> None:
        """The settings as this request already read them (`db.users.read_user_with_platform`),
        parsed when first asked for."""
        self._stored_platform = stored

    def forget_platform(self) -> None:
        """The settings changed in this request: the fields after the change read them again."""
        self._platform = None
        self._stored_platform = None

    async def _load_platform(self) -> PlatformSettings:
        async with self.connection() as conn:
            return await load_platform_settings(conn)

    async def fetch(self, fetch: Fetch[T], ids: Sequence[int]) -> list[T]:
        async with self.connection() as conn:
            return await fetch(conn, ids)

    def by_key(self, fetch: Fetch[T], key: Callable[[T], int]) -> DataLoader[int, T | None]:
        async def load(ids: Sequence[int]) -> list[T | None]:
            found = {key(row): row for row in await self.fetch(fetch, ids)}
            return [found.get(i) for i in ids]

        return SharedLoader(load_fn=load)

    def grouped(self, fetch: Fetch[tuple[int, T]]) -> DataLoader[int, list[T]]:
        async def load(ids: Sequence[int]) -> list[list[T]]:
            grouped: dict[int, list[T]] = {i: [] for i in ids}
            for owner, row in await self.fetch(fetch, ids):
                grouped[owner].append(row)
            return [grouped[i] for i in ids]

        return SharedLoader(load_fn=load)

    async def load_run_pages(self, keys: Sequence[RunPageKey]) -> list[list[RunRow]]:
        groups: dict[tuple[int, int | None, tuple[str, ...] | None], list[int]] = {}
        for agent_id, limit, after, states in keys:
            groups.setdefault((limit, after, states), []).append(agent_id)
        pages: dict[RunPageKey, list[RunRow]] = {}
        for (limit, after, states), agent_ids in groups.items():
            for agent_id in agent_ids:
                pages[(agent_id, limit, after, states)] = []
            async with self.connection() as conn:
                rows = await runs_db.run_pages(
                    conn, agent_ids, limit=limit, after=after, states=states
                )
            for row in rows:
                pages[(row.agent_id, limit, after, states)].append(row)
        return [pages[key] for key in keys]

    async def load_budgets(self, owner_ids: Sequence[int]) -> list[Budget]:
        platform = await self.platform()
        async with self.connection() as conn:
            budgets = await owners_budgets(conn, list(owner_ids), now=self._now, platform=platform)
        return [budgets[i] for i in owner_ids]

    async def load_budget_costs(self, owner_ids: Sequence[int]) -> list[Decimal | None]:
        platform = await self.platform()
        window = week_window(self._now, platform.zone)
        async with self.connection() as conn:
            costs = await spent_costs(conn, list(owner_ids), window=window)
        return [costs[i] for i in owner_ids]

    async def load_agent_week_tokens(self, agent_ids: Sequence[int]) -> list[int]:
        platform = await self.platform()
        window = week_window(self._now, platform.zone)
        async with self.connection() as conn:
            used = await agents_spent_tokens(conn, list(agent_ids), window=window)
        return [used.get(i, 0) for i in agent_ids]

    async def load_connected_owners(self, source_ids: Sequence[int]) -> list[int]:
        async with self.connection() as conn:
            counts = await connected_counts(conn, list(source_ids))
        return [counts.get(i, 0) for i in source_ids]

    async def load_expected_tokens(self, agent_ids: Sequence[int]) -> list[int | None]:
        async with self.connection() as conn:
            recent = await recent_tokens(conn, list(agent_ids))
        return [expected_tokens_per_run(recent.get(i, [])) for i in agent_ids]

    async def load_alerts_this_week(self, owner_ids: Sequence[int]) -> list[list[BudgetAlertRow]]:
        platform = await self.platform()
        window = week_window(self._now, platform.zone)
        async with self.connection() as conn:
            alerts = await alerts_of_owners(conn, list(owner_ids), window_start=window.start)
        return [alerts.get(i, []) for i in owner_ids]
