"""DataLoaders: a page of agents with its relations costs a constant number of SQL statements."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import Api
from tests.support.factories import Factories

QUERY = """{ viewer { agents { id model { name } tools { name } lastRun { id state }
  activeRun { id } owner { displayName } runs(first: 5) { edges { node { id state } } } }
  budget { usedTokens } } }"""


@contextmanager
def counting_statements(database: str) -> Iterator[list[str]]:
    """Statements sent to `database` by any engine (the server's lives in its own thread)."""
    statements: list[str] = []
    lock = threading.Lock()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if conn.engine.url.database == database:
            with lock:
                statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(Engine, "before_cursor_execute", count)


async def _agents_with_relations(factories: Factories, owner: int, count: int) -> None:
    model = await factories.model()
    tool = await factories.tool(f"tool_for_{owner}")
    for i in range(count):
        agent = await factories.agent(user_id=owner, model_id=model["id"], name=f"a{i}")
        await factories.run(agent_id=agent["id"], state="succeeded", tokens_used=3)
        await factories.run(agent_id=agent["id"], state="running")
        async with factories.engine.begin() as conn:
            from sqlalchemy import text

            await conn.execute(
                text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
                {"a": agent["id"], "t": tool["id"]},
            )


async def test_statement_count_is_the_same_for_10_and_100_agents(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    small, large = 51, 52
    await factories.user(id=small)
    await factories.user(id=large)
    await _agents_with_relations(factories, small, 10)
    await _agents_with_relations(factories, large, 100)
    # Warm up: provisioning on first sight is a one-off, not part of the page's cost.
    for owner in (small, large):
        await api.data("{ viewer { isAdmin } }", None, as_user=owner)

    database = engine.url.database
    assert database is not None
    counts = {}
    for owner, size in ((small, 10), (large, 100)):
        with counting_statements(database) as statements:
            data = await api.data(QUERY, None, as_user=owner)
        agents = data["viewer"]["agents"]
        assert len(agents) == size
        assert all(a["lastRun"] and a["activeRun"] and a["tools"] and a["model"] for a in agents)
        assert all(len(a["runs"]["edges"]) == 2 for a in agents)
        counts[size] = len(statements)
    assert counts[10] == counts[100], counts
    assert 0 < counts[100] <= 12, counts


async def test_a_page_reads_its_agents_and_their_relations_before_the_budget(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    """The page's reads (its agents, then their models, tools and runs in one statement) go in
    one turn of the request's connection, the budget after them: its statement is answered while
    the page is completed (`Loaders._page_turn`)."""
    owner = 54
    await factories.user(id=owner)
    await _agents_with_relations(factories, owner, 3)
    await api.data("{ viewer { isAdmin } }", None, as_user=owner)
    database = engine.url.database
    assert database is not None
    # The budget asked for first: its read still goes after the page's.
    page = (
        "{ viewer { budget { usedTokens } agents { model { id } tools { id } lastRun { id } } } }"
    )
    with counting_statements(database) as statements:
        data = await api.data(page, None, as_user=owner)
    assert isinstance(data["viewer"]["budget"]["usedTokens"], int)
    assert [a["lastRun"] is not None for a in data["viewer"]["agents"]] == [True] * 3
    kinds = [
        next(
            (kind for word, kind in _KINDS if word in statement),
            "other",
        )
        for statement in statements
    ]
    assert kinds == ["viewer", "agents", "relations", "budget"], kinds


# The page's statements by a word only each has.
_KINDS = (
    ("JOIN users", "viewer"),
    ("AS selected", "relations"),  # models, tools and runs in one (`db.pages`)
    ("SUM(", "budget"),
    ("FROM agent_models", "models"),
    ("FROM agent_tools", "tools"),
    ("FROM agent_runs", "runs"),
    ("FROM agents", "agents"),
)


RUNS_PAGE = """query($id: ID!) { agent(id: $id) { deliveryTargets { name }
  runs(first: 100) { edges { node { id promptTokens
    steps { index kind name output } deliveries { status target { name } } } } } } }"""


async def _runs_with_steps(factories: Factories, owner: int, count: int, target: int) -> int:
    from sqlalchemy import text

    agent = await factories.agent(user_id=owner)
    async with factories.engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO agent_delivery_targets (agent_id, target_id) VALUES (:a, :t)"),
            {"a": agent["id"], "t": target},
        )
    for _ in range(count):
        run = await factories.run(agent_id=agent["id"], state="running")
        async with factories.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO agent_run_steps (run_id, index, kind, name, output, started_at)"
                    " VALUES (:r, 0, 'model_call', 'm', 'hi', now()),"
                    " (:r, 1, 'tool_call', 'calculator', '4', now())"
                ),
                {"r": run["id"]},
            )
            # Finishing writes the run's delivery (the outbox trigger).
            await conn.execute(
                text(
                    "UPDATE agent_runs SET state = 'succeeded', finished_at = now() WHERE id = :r"
                ),
                {"r": run["id"]},
            )
    return int(agent["id"])


async def test_a_page_of_runs_with_steps_and_deliveries_costs_the_same_for_10_and_100(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    owner = 53
    await factories.user(id=owner)
    async with factories.engine.begin() as conn:
        from sqlalchemy import text

        target = (
            await conn.execute(
                text(
                    "INSERT INTO delivery_targets (name, url, secret_env)"
                    " VALUES ('Ops', 'https://hooks.example.com/', 'S') RETURNING id"
                )
            )
        ).scalar_one()
    small = await _runs_with_steps(factories, owner, 10, target)
    large = await _runs_with_steps(factories, owner, 100, target)
    await api.data("{ viewer { isAdmin } }", None, as_user=owner)

    database = engine.url.database
    assert database is not None
    counts = {}
    for agent, size in ((small, 10), (large, 100)):
        with counting_statements(database) as statements:
            data = await api.data(RUNS_PAGE, {"id": str(agent)}, as_user=owner)
        runs = [e["node"] for e in data["agent"]["runs"]["edges"]]
        assert len(runs) == size
        assert all(len(r["steps"]) == 2 and len(r["deliveries"]) == 1 for r in runs)
        assert runs[0]["steps"][1] == {
            "index": 1,
            "kind": "TOOL_CALL",
            "name": "calculator",
            "output": "4",
        }
        counts[size] = len(statements)
    assert counts[10] == counts[100], counts


RELATIONS = "id model { name } tools { name } lastRun { id state } activeRun { id state }"


async def test_a_pages_prefetched_relations_answer_what_each_agent_answers(
    api: Api, factories: Factories
) -> None:
    owner = 53
    await factories.user(id=owner)
    await _agents_with_relations(factories, owner, 3)
    bare = await factories.agent(user_id=owner, model_id=None, name="bare")  # no relations at all

    page = await api.data(f"{{ viewer {{ agents {{ {RELATIONS} }} }} }}", None, as_user=owner)
    one_by_one = [
        (
            await api.data(
                f"query($id: ID!) {{ agent(id: $id) {{ {RELATIONS} }} }}",
                {"id": a["id"]},
                as_user=owner,
            )
        )["agent"]
        for a in page["viewer"]["agents"]
    ]

    assert page["viewer"]["agents"] == one_by_one
    assert {a["id"] for a in one_by_one} >= {str(bare["id"])}
    assert all(a["lastRun"]["state"] == "SUCCEEDED" for a in one_by_one if a["model"])


async def test_a_page_leaves_no_reference_cycles_to_the_collector(
    api: Api, factories: Factories
) -> None:
    """A request's executor, context, loaders and rows are freed by reference counting when it
    ends: garbage left to the collector costs the api a collection pass per few dozen pages."""
    import gc

    owner = 53
    await factories.user(id=owner)
    await _agents_with_relations(factories, owner, 5)
    await api.data(QUERY, None, as_user=owner)  # warm: provisioning, caches
    ours = {"Executor", "Context", "Loaders", "DataLoader", "AgentRow", "RunRow", "Agent", "Run"}
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            data = await api.data(QUERY, None, as_user=owner)
            assert len(data["viewer"]["agents"]) == 5
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage} & ours)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


RUN_FIELDS = """id trigger state reason tokensUsed error startedAt finishedAt heartbeatAt
  createdAt promptTokens completionTokens cost __typename"""
AGENT_FIELDS = """id name description prompt enabled adminPaused nextRunAt meta createdAt
  updatedAt __typename model { id name } tools { name }"""


async def test_a_page_reads_narrow_rows_and_shows_what_whole_rows_show(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    owner = 54
    await factories.user(id=owner)
    model = await factories.model()
    done = await factories.agent(
        user_id=owner,
        model_id=model["id"],
        name="done",
        description="d",
        meta={"team": "ops"},
        schedule={"type": "interval", "every_hours": 6},
        next_run_at=datetime.now(UTC),
    )
    tool = await factories.tool("narrow_page_tool")
    await factories._insert("agent_tools", {"agent_id": done["id"], "tool_id": tool["id"]})
    broken = await factories.agent(user_id=owner, model_id=model["id"], name="broken")
    await factories.agent(user_id=owner, model_id=model["id"], name="new")
    now = datetime.now(UTC)
    await factories.run(
        agent_id=done["id"],
        state="succeeded",
        output="the answer",
        tokens_used=30,
        prompt_tokens=10,
        completion_tokens=20,
        cost=Decimal("0.000123"),
        started_at=now,
        finished_at=now,
        heartbeat_at=now,
    )
    await factories.run(agent_id=done["id"], state="running", started_at=now)
    await factories.run(agent_id=broken["id"], state="failed", error="no", reason="error")
    await api.data("{ viewer { isAdmin } }", None, as_user=owner)

    database = engine.url.database
    assert database is not None
    shown = f"{AGENT_FIELDS} lastRun {{ {RUN_FIELDS} }} activeRun {{ ...run }}"
    run = f"fragment run on Run {{ {RUN_FIELDS} }}"
    page = f"{{ viewer {{ agents {{ ... on Agent {{ {shown} }} }} }} }} {run}"
    with counting_statements(database) as statements:
        agents = (await api.data(page, None, as_user=owner))["viewer"]["agents"]
    [runs_read] = [s for s in statements if "agent_runs" in s and "UNION ALL" in s]
    assert "*" not in runs_read and "output" not in runs_read, runs_read
    [agents_read] = [s for s in statements if "FROM agents WHERE user_id" in s]
    assert "*" not in agents_read and "schedule" not in agents_read, agents_read

    # What each agent shows alone (whole rows, read one agent at a time).
    one = f"query($id: ID!) {{ agent(id: $id) {{ ...a }} }} fragment a on Agent {{ {shown} }} {run}"
    alone = [(await api.data(one, {"id": agent["id"]}, as_user=owner))["agent"] for agent in agents]
    assert agents == alone
    assert agents[0]["meta"] == {"team": "ops"}
    assert agents[0]["tools"] == [{"name": "narrow_page_tool"}]
    assert [a["lastRun"] and a["lastRun"]["state"] for a in agents] == ["SUCCEEDED", "FAILED", None]
    assert agents[0]["lastRun"]["cost"] == "0.000123"
    assert agents[0]["activeRun"]["state"] == "RUNNING"

    # Fields a narrow row cannot show (the owner's output, the status) read whole rows.
    with counting_statements(database) as statements:
        data = await api.data(
            "{ viewer { agents { status lastRun { id output } } } }", None, as_user=owner
        )
    assert [a["lastRun"] and a["lastRun"]["output"] for a in data["viewer"]["agents"]] == [
        "the answer",
        None,
        None,
    ]
    assert [a["status"] for a in data["viewer"]["agents"]] == ["SCHEDULED", "MANUAL", "MANUAL"]
    [runs_read] = [s for s in statements if "agent_runs" in s and "UNION ALL" in s]
    assert "ARRAY(SELECT r FROM agent_runs r " in runs_read  # whole rows, of the table's type
    [agents_read] = [s for s in statements if "FROM agents WHERE user_id" in s]
    assert "SELECT *" in agents_read
