"""An owner's operations over HTTP: definitions, schedule → nextRunAt, tools, runs, budget."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import FIXED_NOW, Api, codes, error
from tests.support.factories import Factories

OWNER = 11

AGENT_FIELDS = """
  id name description prompt enabled adminPaused status canStart nextRunAt
  upcomingRunTimes(limit: 3) coreTools meta createdAt updatedAt
  schedule { __typename ... on IntervalSchedule { everyHours }
             ... on CalendarSchedule { cadence weekday time } }
  model { id name isDefault } owner { id timezone } tools { id name agentsAllowed }
  activeRun { id state } lastRun { id state }
"""

CREATE = (
    f"mutation($input: CreateAgentInput!) {{ createAgent(input: $input) {{ {AGENT_FIELDS} }} }}"
)
UPDATE = (
    "mutation($id: ID!, $input: UpdateAgentInput!) "
    f"{{ updateAgent(id: $id, input: $input) {{ {AGENT_FIELDS} }} }}"
)


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_create_agent_preselects_default_model_and_computes_next_run(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER, timezone="Europe/Berlin")
    await factories.model(name="other")
    default = await factories.model(name="default", is_default=True)
    schedule = {"calendar": {"cadence": "WEEKLY", "weekday": 0, "time": "09:00"}}
    data = await api.data(
        CREATE,
        {"input": {"name": "Digest", "prompt": "What changed?", "schedule": schedule}},
        as_user=OWNER,
    )
    agent = data["createAgent"]
    assert agent["model"] == {"id": str(default["id"]), "name": "default", "isDefault": True}
    assert agent["status"] == "SCHEDULED"
    assert agent["canStart"] is True
    assert agent["schedule"] == {
        "__typename": "CalendarSchedule",
        "cadence": "WEEKLY",
        "weekday": 0,
        "time": "09:00",
    }
    # Mondays at 09:00 in Berlin after Wednesday 2025-03-12 10:00 UTC; the third is after the
    # spring-forward of 30 March (CET +01:00, then CEST +02:00).
    berlin = ZoneInfo("Europe/Berlin")
    expected = [
        datetime(2025, 3, 17, 9, 0, tzinfo=berlin),
        datetime(2025, 3, 24, 9, 0, tzinfo=berlin),
        datetime(2025, 3, 31, 9, 0, tzinfo=berlin),
    ]
    assert [e.utcoffset() for e in expected] == [timedelta(hours=h) for h in (1, 1, 2)]
    assert when(agent["nextRunAt"]) == expected[0]
    assert [when(t) for t in agent["upcomingRunTimes"]] == expected
    assert agent["coreTools"] == ["search_knowledge", "read_document", "related_documents"]
    assert agent["owner"] == {"id": str(OWNER), "timezone": "Europe/Berlin"}


async def test_interval_schedule_and_manual_agent(api: Api, factories: Factories) -> None:
    await factories.model(is_default=True)
    interval = await api.data(
        CREATE,
        {"input": {"name": "i", "prompt": "p", "schedule": {"interval": {"everyHours": 6}}}},
        as_user=OWNER,
    )
    agent = interval["createAgent"]
    assert agent["schedule"] == {"__typename": "IntervalSchedule", "everyHours": 6}
    assert when(agent["nextRunAt"]) == FIXED_NOW + timedelta(hours=6)
    manual = (await api.data(CREATE, {"input": {"name": "m", "prompt": "p"}}, as_user=OWNER))[
        "createAgent"
    ]
    assert manual["status"] == "MANUAL"
    assert manual["nextRunAt"] is None
    assert manual["upcomingRunTimes"] == []


async def test_create_with_tools_meta_and_disabled(api: Api, factories: Factories) -> None:
    await factories.model(is_default=True)
    tool = await factories.tool("web_lookup")
    data = await api.data(
        CREATE,
        {
            "input": {
                "name": "n",
                "prompt": "p",
                "description": "card subtitle",
                "toolIds": [str(tool["id"])],
                "enabled": False,
                "meta": {"colour": "blue"},
                "schedule": {"interval": {"everyHours": 1}},
            }
        },
        as_user=OWNER,
    )
    agent = data["createAgent"]
    assert [t["name"] for t in agent["tools"]] == ["web_lookup"]
    assert agent["meta"] == {"colour": "blue"}
    assert agent["description"] == "card subtitle"
    assert agent["status"] == "DISABLED"
    assert agent["nextRunAt"] is None  # the gate is closed: the trigger keeps it null
    assert agent["upcomingRunTimes"] == []


async def test_update_absent_unchanged_null_clears_schedule_change_reslots(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    await factories.user(id=OWNER, timezone="UTC")
    model = await factories.model()
    row = await factories.agent(
        user_id=OWNER,
        model_id=model["id"],
        description="d",
        meta={"a": 1},
        schedule={"type": "interval", "every_hours": 2},
        next_run_at=FIXED_NOW + timedelta(minutes=5),
    )
    # Renaming keeps the schedule and its slot.
    renamed = (
        await api.data(UPDATE, {"id": str(row["id"]), "input": {"name": "R"}}, as_user=OWNER)
    )["updateAgent"]
    assert renamed["name"] == "R"
    assert renamed["description"] == "d"
    assert renamed["meta"] == {"a": 1}
    assert when(renamed["nextRunAt"]) == FIXED_NOW + timedelta(minutes=5)
    # A new schedule moves the slot.
    api.clock.now = FIXED_NOW + timedelta(hours=1)
    moved = (
        await api.data(
            UPDATE,
            {"id": str(row["id"]), "input": {"schedule": {"interval": {"everyHours": 3}}}},
            as_user=OWNER,
        )
    )["updateAgent"]
    assert when(moved["nextRunAt"]) == FIXED_NOW + timedelta(hours=4)
    # Explicit nulls clear description, schedule and meta.
    cleared = (
        await api.data(
            UPDATE,
            {"id": str(row["id"]), "input": {"description": None, "schedule": None, "meta": None}},
            as_user=OWNER,
        )
    )["updateAgent"]
    assert cleared["description"] is None
    assert cleared["schedule"] is None
    assert cleared["meta"] is None
    assert cleared["nextRunAt"] is None
    assert cleared["status"] == "MANUAL"
    async with engine.connect() as conn:
        stored = (
            await conn.execute(
                text("SELECT schedule, next_run_at FROM agents WHERE id = :id"), {"id": row["id"]}
            )
        ).one()
    assert stored.schedule is None
    assert stored.next_run_at is None


async def test_update_model_opens_the_gate_and_slots(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER)
    model = await factories.model()
    row = await factories.agent(
        user_id=OWNER, model_id=None, schedule={"type": "interval", "every_hours": 5}
    )
    agent = (
        await api.data(
            f"query($id: ID!) {{ agent(id: $id) {{ {AGENT_FIELDS} }} }}",
            {"id": str(row["id"])},
            as_user=OWNER,
        )
    )["agent"]
    assert agent["status"] == "NO_MODEL"
    assert agent["canStart"] is False
    updated = (
        await api.data(
            UPDATE, {"id": str(row["id"]), "input": {"modelId": str(model["id"])}}, as_user=OWNER
        )
    )["updateAgent"]
    assert updated["status"] == "SCHEDULED"
    assert when(updated["nextRunAt"]) == FIXED_NOW + timedelta(hours=5)


async def test_set_agent_enabled_clears_and_recomputes_next_run(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    row = await factories.agent(
        user_id=OWNER,
        schedule={"type": "interval", "every_hours": 1},
        next_run_at=FIXED_NOW + timedelta(minutes=30),
    )
    query = """mutation($id: ID!, $on: Boolean!) {
        setAgentEnabled(id: $id, enabled: $on) { enabled status nextRunAt } }"""
    off = (await api.data(query, {"id": str(row["id"]), "on": False}, as_user=OWNER))[
        "setAgentEnabled"
    ]
    assert off == {"enabled": False, "status": "DISABLED", "nextRunAt": None}
    api.clock.now = FIXED_NOW + timedelta(hours=2)
    on = (await api.data(query, {"id": str(row["id"]), "on": True}, as_user=OWNER))[
        "setAgentEnabled"
    ]
    assert on["status"] == "SCHEDULED"
    assert when(on["nextRunAt"]) == FIXED_NOW + timedelta(hours=3)


async def test_delete_agent_takes_runs_and_links(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    await factories.user(id=OWNER)
    row = await factories.agent(user_id=OWNER)
    await factories.run(agent_id=row["id"], state="succeeded")
    data = await api.data(
        "mutation($id: ID!) { deleteAgent(id: $id) }", {"id": str(row["id"])}, as_user=OWNER
    )
    assert data["deleteAgent"] == str(row["id"])
    async with engine.connect() as conn:
        left = (
            await conn.execute(
                text("SELECT count(*) FROM agent_runs WHERE agent_id = :id"), {"id": row["id"]}
            )
        ).scalar_one()
    assert left == 0
    again = await api.body(
        "mutation($id: ID!) { deleteAgent(id: $id) }", {"id": str(row["id"])}, as_user=OWNER
    )
    assert codes(again) == ["NOT_FOUND"]


async def test_tool_selection_accepts_only_allowed_tools(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER)
    row = await factories.agent(user_id=OWNER)
    allowed = await factories.tool("allowed_a")
    other = await factories.tool("allowed_b")
    disallowed = await factories.tool("forbidden_c", agents_allowed=False)
    agent_id = str(row["id"])
    set_tools = """mutation($a: ID!, $t: [ID!]!) {
        setAgentTools(agentId: $a, toolIds: $t) { tools { name } } }"""
    data = await api.data(
        set_tools, {"a": agent_id, "t": [str(allowed["id"]), str(other["id"])]}, as_user=OWNER
    )
    assert [t["name"] for t in data["setAgentTools"]["tools"]] == ["allowed_a", "allowed_b"]
    refused = await api.body(
        set_tools, {"a": agent_id, "t": [str(disallowed["id"])]}, as_user=OWNER
    )
    assert error(refused)["extensions"] == {"code": "BAD_USER_INPUT", "field": "toolIds"}
    detach = "mutation($a: ID!, $t: ID!) { detachTool(agentId: $a, toolId: $t) { tools { name } } }"
    data = await api.data(detach, {"a": agent_id, "t": str(other["id"])}, as_user=OWNER)
    assert [t["name"] for t in data["detachTool"]["tools"]] == ["allowed_a"]
    attach = "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { tools { name } } }"
    data = await api.data(attach, {"a": agent_id, "t": str(other["id"])}, as_user=OWNER)
    assert [t["name"] for t in data["attachTool"]["tools"]] == ["allowed_a", "allowed_b"]
    refused = await api.body(attach, {"a": agent_id, "t": str(disallowed["id"])}, as_user=OWNER)
    assert error(refused)["extensions"] == {"code": "BAD_USER_INPUT", "field": "toolId"}
    # A tool the admin disallows later stays in the selection, flagged.
    await api.data(
        "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: false) { id } }",
        {"t": str(allowed["id"])},
        as_user=999,
        admin=True,
    )
    data = await api.data(
        "query($id: ID!) { agent(id: $id) { tools { name agentsAllowed } } }",
        {"id": agent_id},
        as_user=OWNER,
    )
    assert data["agent"]["tools"][0] == {"name": "allowed_a", "agentsAllowed": False}
    available = await api.data("{ tools { name } }", None, as_user=OWNER)
    assert "allowed_a" not in [t["name"] for t in available["tools"]]


async def test_start_run_queued_then_skipped_already_running(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    row = await factories.agent(user_id=OWNER)
    start = """mutation($a: ID!) {
        startRun(agentId: $a) { id state reason trigger tokensUsed agent { id } } }"""
    first = (await api.data(start, {"a": str(row["id"])}, as_user=OWNER))["startRun"]
    assert first["state"] == "QUEUED"
    assert first["trigger"] == "MANUAL"
    assert first["agent"] == {"id": str(row["id"])}
    second = (await api.data(start, {"a": str(row["id"])}, as_user=OWNER))["startRun"]
    assert second["state"] == "SKIPPED"
    assert second["reason"] == "ALREADY_RUNNING"
    assert second["tokensUsed"] == 0
    agent = (
        await api.data(
            "query($id: ID!) { agent(id: $id) { activeRun { id } lastRun { id reason } } }",
            {"id": str(row["id"])},
            as_user=OWNER,
        )
    )["agent"]
    assert agent["activeRun"] == {"id": first["id"]}
    assert agent["lastRun"] == {"id": second["id"], "reason": "ALREADY_RUNNING"}


async def test_start_run_budget_exceeded_is_journaled(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER)
    await factories.setting("agent_weekly_token_cap", 100)
    row = await factories.agent(user_id=OWNER)
    await factories.run(
        agent_id=row["id"],
        state="succeeded",
        tokens_used=150,
        started_at=FIXED_NOW - timedelta(hours=2),
        finished_at=FIXED_NOW - timedelta(hours=1),
    )
    run = (
        await api.data(
            "mutation($a: ID!) { startRun(agentId: $a) { state reason } }",
            {"a": str(row["id"])},
            as_user=OWNER,
        )
    )["startRun"]
    assert run == {"state": "SKIPPED", "reason": "BUDGET_EXCEEDED"}
    budget = (
        await api.data(
            """{ viewer { budget { capTokens usedTokens remainingTokens exceeded
                windowStart windowEnd timezone } } }""",
            None,
            as_user=OWNER,
        )
    )["viewer"]["budget"]
    assert budget["capTokens"] == 100
    assert budget["usedTokens"] == 150
    assert budget["remainingTokens"] == 0
    assert budget["exceeded"] is True
    assert when(budget["windowStart"]) <= FIXED_NOW < when(budget["windowEnd"])
    assert budget["timezone"] == "UTC"


async def test_start_run_closed_gate_names_the_lock_and_writes_nothing(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    await factories.user(id=OWNER)
    cases = {
        "DISABLED": {"enabled": False},
        "ADMIN_PAUSED": {"admin_paused": True, "enabled": False},
        "NO_MODEL": {"model_id": None},
    }
    for lock, values in cases.items():
        row = await factories.agent(user_id=OWNER, **values)
        body = await api.body(
            "mutation($a: ID!) { startRun(agentId: $a) { id } }",
            {"a": str(row["id"])},
            as_user=OWNER,
        )
        assert error(body)["extensions"] == {"code": "AGENT_NOT_STARTABLE", "lock": lock}
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM agent_runs"))).scalar_one() == 0


async def test_run_journal_paging_with_cursors_and_states(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER)
    row = await factories.agent(user_id=OWNER)
    runs = [
        await factories.run(
            agent_id=row["id"],
            state="succeeded" if i % 2 else "failed",
            reason=None if i % 2 else "error",
        )
        for i in range(5)
    ]
    query = """query($id: ID!, $after: String, $states: [RunState!]) { agent(id: $id) {
        runs(first: 2, after: $after, states: $states) {
          edges { cursor node { id state } } pageInfo { hasNextPage endCursor } } } }"""
    seen: list[str] = []
    after = None
    while True:
        page = (await api.data(query, {"id": str(row["id"]), "after": after}, as_user=OWNER))[
            "agent"
        ]["runs"]
        seen += [e["node"]["id"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
        assert after == page["edges"][-1]["cursor"]
        assert str(page["edges"][-1]["node"]["id"]) not in after  # opaque
    assert seen == [str(r["id"]) for r in reversed(runs)]
    failed = (await api.data(query, {"id": str(row["id"]), "states": ["FAILED"]}, as_user=OWNER))[
        "agent"
    ]["runs"]
    assert {e["node"]["state"] for e in failed["edges"]} == {"FAILED"}


async def test_run_query_and_viewer(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER, display_name="Ada", email="ada@example.com")
    row = await factories.agent(user_id=OWNER, name="mine")
    run = await factories.run(agent_id=row["id"], state="running", started_at=FIXED_NOW)
    data = await api.data(
        """query($id: ID!) { run(id: $id) { id state startedAt agent { name } }
           viewer { isAdmin user { id email displayName timezone } agents { name } } }""",
        {"id": str(run["id"])},
        as_user=OWNER,
    )
    assert data["run"]["state"] == "RUNNING"
    assert data["run"]["agent"] == {"name": "mine"}
    assert data["viewer"] == {
        "isAdmin": False,
        "user": {
            "id": str(OWNER),
            "email": "ada@example.com",
            "displayName": "Ada",
            "timezone": "UTC",
        },
        "agents": [{"name": "mine"}],
    }


async def test_first_sight_provisions_user_from_claims(api: Api, engine: AsyncEngine) -> None:
    token = api.token(77, email="new@example.com", name="New Person", timezone="Asia/Tokyo")
    data = await api.data(
        "{ viewer { user { id email displayName timezone } } }", None, token=token
    )
    assert data["viewer"]["user"] == {
        "id": "77",
        "email": "new@example.com",
        "displayName": "New Person",
        "timezone": "Asia/Tokyo",
    }
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM users WHERE id = 77"))).one()
    assert row.is_active is True


async def test_agent_models_list(api: Api, factories: Factories) -> None:
    await factories.model(name="a", is_default=True)
    await factories.model(name="b", provider="openai", model="gpt-4o-mini")
    data = await api.data("{ agentModels { name provider model isDefault } }", None, as_user=OWNER)
    assert data["agentModels"] == [
        {"name": "a", "provider": "builtin", "model": "builtin-digest", "isDefault": True},
        {"name": "b", "provider": "openai", "model": "gpt-4o-mini", "isDefault": False},
    ]
