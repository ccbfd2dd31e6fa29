"""`read_rows` (rows read by position) builds exactly what each class's `from_row` builds by name,
for rows with every kind of column filled and empty, through the statements that use it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import agents as agents_db
from agent_engine.db import catalog, direct, pages, platform, spend, users
from agent_engine.db import runs as runs_db
from agent_engine.db.agents import AgentRow
from agent_engine.db.catalog import AgentModelRow, ToolRow
from agent_engine.db.rows import read_keyed_rows, read_rows
from agent_engine.db.runs import RunRow
from agent_engine.domain.budget import week_window
from tests.support.factories import Factories

TABLES: list[tuple[str, type[Any]]] = [
    ("agents", AgentRow),
    ("agent_models", AgentModelRow),
    ("tools", ToolRow),
    ("agent_runs", RunRow),
]


async def _seed(factories: Factories) -> dict[str, Any]:
    user = await factories.user()
    model = await factories.model(
        base_url="http://models.internal/v1",
        api_key_env="MODEL_KEY",
        max_concurrent_runs=3,
        input_price_per_million=Decimal("1.25"),
        output_price_per_million=Decimal("10"),
    )
    bare = await factories.model(name="Bare")
    full = await factories.agent(
        user["id"],
        model_id=model["id"],
        description="d",
        schedule={"type": "interval", "every_hours": 6},
        meta={"team": "ops", "n": [1, 2]},
        admin_paused=True,
        admin_pause_note="why",
    )
    empty = await factories.agent(user["id"], model_id=None)
    for name in ("calculator", "current_time"):
        tool = await factories.tool(name)
        await factories._insert("agent_tools", {"agent_id": full["id"], "tool_id": tool["id"]})
    await factories.tool("writer", access="write", input_schema={"type": "object"})
    await factories.run(
        full["id"],
        state="succeeded",
        output="done",
        tokens_used=30,
        prompt_tokens=10,
        completion_tokens=20,
        cost=Decimal("0.000123"),
        model_id=model["id"],
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
    )
    await factories.run(full["id"], state="running", error=None)
    await factories.run(empty["id"], state="failed", error="model said no", reason="error")
    return {"user": user, "agents": [full["id"], empty["id"]], "models": [model["id"], bare["id"]]}


async def test_every_column_reads_the_same_by_position_as_by_name(
    engine: AsyncEngine, factories: Factories
) -> None:
    await _seed(factories)
    async with engine.connect() as conn:
        for table, cls in TABLES:
            every = text(f"SELECT * FROM {table} ORDER BY id")
            by_name = [cls.from_row(row) for row in (await conn.execute(every)).mappings()]
            by_position = read_rows(await conn.execute(every), cls)
            assert by_position == by_name, table
            assert len(by_position) >= 2, table


async def test_the_statements_that_read_by_position(
    engine: AsyncEngine, factories: Factories
) -> None:
    seeded = await _seed(factories)
    agent_ids = seeded["agents"]
    async with engine.connect() as conn:
        agents = await agents_db.live_agents_of_owners(conn, [seeded["user"]["id"]])
        assert [a.id for a in agents] == agent_ids
        assert agents[0].meta == {"team": "ops", "n": [1, 2]}
        assert agents[0].schedule == {"type": "interval", "every_hours": 6}
        assert agents[1].model_id is None

        models = {m.id: m for m in await catalog.models_by_id(conn, seeded["models"])}
        assert models[seeded["models"][0]].input_price_per_million == Decimal("1.25")
        assert models[seeded["models"][1]].max_concurrent_runs is None

        tools = await catalog.tools_of_agents(conn, agent_ids)
        assert [(agent, tool.name) for agent, tool in tools] == [
            (agent_ids[0], "calculator"),
            (agent_ids[0], "current_time"),
        ]
        assert all(tool.access == "read" and tool.input_schema is None for _, tool in tools)
        calculator = tools[0][1]
        await conn.execute(
            text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
            {"a": agent_ids[1], "t": calculator.id},
        )
        await conn.commit()
        shared = await catalog.tools_of_agents(conn, agent_ids)
        assert sorted((agent, tool.name) for agent, tool in shared) == [
            (agent_ids[0], "calculator"),
            (agent_ids[0], "current_time"),
            (agent_ids[1], "calculator"),
        ]
        same = [tool for _, tool in shared if tool.name == "calculator"]
        assert same[0] is same[1] and same[0] == calculator  # one object per tool row

        last = {r.agent_id: r for r in await runs_db.last_finished_runs(conn, agent_ids)}
        assert last[agent_ids[0]].output == "done"
        assert last[agent_ids[0]].cost == Decimal("0.000123")
        assert last[agent_ids[1]].error == "model said no"
        active = await runs_db.active_runs(conn, agent_ids)
        assert [(r.agent_id, r.state) for r in active] == [(agent_ids[0], "running")]
        # The page's one statement for both: the same rows, told apart by their state.
        both = await runs_db.active_and_last_runs(conn, agent_ids)
        assert both == (active, await runs_db.last_finished_runs(conn, agent_ids))

        # A column the class lacks, kept beside it; a field without a column takes its default.
        partial = await conn.execute(
            text(
                "SELECT 7 AS agent_id, id, name, description, agents_allowed, created_at FROM tools"
            )
        )
        pairs = read_keyed_rows(partial, "agent_id", ToolRow, same_by="id")
        assert {agent for agent, _ in pairs} == {7}
        assert all(t.access == "read" and t.source_id is None for _, t in pairs)


async def test_a_narrow_read_of_runs_has_only_its_columns_and_no_defaults(
    engine: AsyncEngine, factories: Factories
) -> None:
    seeded = await _seed(factories)
    agent_ids = seeded["agents"]
    async with engine.connect() as conn:
        whole = await runs_db.active_and_last_runs(conn, agent_ids)
        narrow = await runs_db.active_and_last_runs(conn, agent_ids, ["cost"])
        # The same runs, split the same way, with the asked-for column and the keys.
        for whole_runs, narrow_runs in zip(whole, narrow, strict=True):
            assert [(r.id, r.agent_id, r.state, r.cost) for r in narrow_runs] == [
                (r.id, r.agent_id, r.state, r.cost) for r in whole_runs
            ]
        assert {r.cost for r in narrow[1]} == {Decimal("0.000123"), None}
        # A column the read left out is not there: no default stands in for it.
        with pytest.raises(AttributeError):
            narrow[1][0].output  # noqa: B018
        # Every column asked for is a whole row; a name that is no column is refused.
        every = [field for field in RunRow.__dataclass_fields__]
        assert await runs_db.active_and_last_runs(conn, agent_ids, every) == whole
        with pytest.raises(ValueError, match=r"no columns \['id; DROP TABLE agents'\]"):
            await runs_db.active_and_last_runs(conn, agent_ids, ["id; DROP TABLE agents"])


def test_a_partial_read_needs_a_frozen_dataclass_with_slots() -> None:
    class Plain:
        def __init__(self, id: int) -> None:
            self.id = id

    class Result:
        def keys(self) -> list[str]:
            return ["id"]

        def __iter__(self) -> Any:
            return iter([(1,)])

    with pytest.raises(TypeError, match="frozen dataclass with slots"):
        read_rows(Result(), Plain, partial=True)


async def _spent(conn: AsyncConnection, owners: list[int]) -> dict[int, int]:
    window = week_window(datetime.now(UTC), ZoneInfo("UTC"))
    return await spend.spent_tokens(conn, owners, window=window)


async def _settings(conn: AsyncConnection, _: list[int]) -> Any:
    return await platform.load_platform_settings(conn)


async def _user(conn: AsyncConnection, ids: list[int]) -> Any:
    return await users.read_user_with_platform(conn, ids[0])


async def test_autocommit_reads_go_direct_with_the_same_rows_and_are_counted(
    engine: AsyncEngine, factories: Factories
) -> None:
    from sqlalchemy import event

    seeded = await _seed(factories)
    agent_ids, owner = seeded["agents"], seeded["user"]["id"]
    reads = [
        (agents_db.live_agents_of_owners, [owner]),
        (catalog.models_by_id, seeded["models"]),
        (catalog.tools_of_agents, agent_ids),
        (runs_db.active_runs, agent_ids),
        (runs_db.last_finished_runs, agent_ids),
        (runs_db.active_runs, [999_999]),  # no rows
        (_spent, [owner]),
        (_settings, []),
        (_user, [owner]),
        (runs_db.active_and_last_runs, agent_ids),
        (_user, [999_999]),  # nobody
    ]
    await factories.setting("agent_weekly_token_cap", 1000)
    await factories.setting("agent_budget_alert_percents", [50, 80])
    seen: list[tuple[str, bool]] = []

    def count(_conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append((statement, cursor is None))  # no DBAPI cursor: sent by `db.direct`

    async with engine.connect() as conn:  # in a transaction: through SQLAlchemy
        through_sqlalchemy = [await read(conn, ids) for read, ids in reads]
    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            direct_reads = [await read(conn, ids) for read, ids in reads]
            raw = await conn.get_raw_connection()
            assert raw.driver_connection is not None
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert direct_reads == through_sqlalchemy
    assert direct_reads[5] == [] and direct_reads[-1][0] is None  # nobody, with the settings
    assert direct_reads[-1][1] == {
        "agent_weekly_token_cap": 1000,
        "agent_budget_alert_percents": [50, 80],
    }
    assert all(direct_reads[:5]) and all(direct_reads[6:-1])
    assert direct_reads[6] == {owner: 30}
    assert direct_reads[7].weekly_token_cap == 1000
    assert direct_reads[7].budget_alert_percents == (50, 80)
    assert len(seen) == len(reads)
    assert all(direct for _, direct in seen)


@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_page_s_relations_in_one_statement_are_the_three_statements_rows(
    engine: AsyncEngine, factories: Factories, autocommit: bool
) -> None:
    """`db.pages`: models, tools and runs as arrays of composite values in one row read as the
    same typed rows as their own statements (JSON, decimals and timestamps inside them too), whole
    and narrow, straight through asyncpg or through SQLAlchemy."""
    seeded = await _seed(factories)
    agent_ids, model_ids = seeded["agents"], seeded["models"]
    writer = await factories.tool("writer_too", access="write", input_schema={"type": "object"})
    await factories._insert("agent_tools", {"agent_id": agent_ids[1], "tool_id": writer["id"]})
    async with engine.connect() as conn:
        if autocommit:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        whole = await pages.page_relations(conn, agent_ids, model_ids)
        assert whole.models == await catalog.models_by_id(conn, model_ids)
        assert whole.tools == await catalog.tools_of_agents(conn, agent_ids)
        assert [t.input_schema for _, t in whole.tools if t.name == "writer_too"] == [
            {"type": "object"}
        ]
        active, last = await runs_db.active_and_last_runs(conn, agent_ids)
        assert sorted(whole.active_runs, key=lambda r: r.id) == sorted(active, key=lambda r: r.id)
        assert sorted(whole.last_runs, key=lambda r: r.id) == sorted(last, key=lambda r: r.id)
        assert {r.cost for r in whole.last_runs} == {Decimal("0.000123"), None}

        narrow = await pages.page_relations(conn, agent_ids, [], ["cost", "finished_at"])
        assert narrow.models == []
        shown = ("id", "agent_id", "state", "cost", "finished_at")
        by_id = {r.id: r for r in [*active, *last]}
        got = [*narrow.active_runs, *narrow.last_runs]
        assert sorted(r.id for r in got) == sorted(by_id)
        for run in got:
            assert all(getattr(run, c) == getattr(by_id[run.id], c) for c in shown)
            with pytest.raises(AttributeError):
                _ = run.output
        empty = await pages.page_relations(conn, [], [])
        assert empty == ([], [], [], [])


async def test_a_page_s_relations_survive_a_migration_of_their_tables(
    engine: AsyncEngine, factories: Factories
) -> None:
    """A column added while the api runs changes a table's type under a connection that
    decoded it before: the read is answered, not failed (asyncpg learns the type again)."""
    seeded = await _seed(factories)
    agent_ids, model_ids = seeded["agents"], seeded["models"]
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        before = await pages.page_relations(conn, agent_ids, model_ids)
        async with engine.begin() as other:
            await other.execute(text("ALTER TABLE tools ADD COLUMN probe_note text"))
            await other.execute(text("ALTER TABLE agent_models ADD COLUMN probe_note text"))
        try:
            after = await pages.page_relations(conn, agent_ids, model_ids)
            assert after == before
        finally:
            async with engine.begin() as other:
                await other.execute(text("ALTER TABLE tools DROP COLUMN probe_note"))
                await other.execute(text("ALTER TABLE agent_models DROP COLUMN probe_note"))


_FAILING = (
    # (statement, parameters): a type error, a constraint, a bad cast, a missing relation
    ("SELECT 1 / CAST(:zero AS int) AS x", {"zero": 0}),
    (
        "INSERT INTO agent_runs (agent_id, trigger, state, tokens_used)"
        " VALUES (CAST(:agent AS bigint), 'manual', 'queued', 0) RETURNING id",
        {"agent": 999_999},
    ),
    ("SELECT CAST(:value AS int) AS x", {"value": "not a number"}),
    ("SELECT * FROM no_such_table WHERE id = :id", {"id": 1}),
)


@pytest.mark.parametrize(("sql", "params"), _FAILING)
async def test_a_direct_statement_fails_as_through_sqlalchemy(
    engine: AsyncEngine, sql: str, params: dict[str, Any]
) -> None:
    statement = text(sql)
    raised: list[DBAPIError] = []
    for go_direct in (False, True):
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(DBAPIError) as caught:
                if go_direct:
                    await direct.fetch_one(conn, statement, params)
                else:
                    await conn.execute(statement, params)
            raised.append(caught.value)
            # The connection is still usable after a statement's error, either way.
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    through_sqlalchemy, through_asyncpg = raised
    assert type(through_asyncpg) is type(through_sqlalchemy)
    assert type(through_asyncpg.orig) is type(through_sqlalchemy.orig)
    assert through_asyncpg.orig.sqlstate == through_sqlalchemy.orig.sqlstate  # type: ignore[union-attr]
    assert not through_asyncpg.connection_invalidated


async def test_a_direct_statement_on_a_dead_connection_invalidates_it(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        async with engine.connect() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(DBAPIError) as caught:
            await direct.fetch_one(conn, text("SELECT :x AS x"), {"x": 1})
        # As SQLAlchemy reports a dead connection: the finish's and claim's retry key on it.
        assert caught.value.connection_invalidated
        assert conn.invalidated
