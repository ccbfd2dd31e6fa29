"""The admin's queries and levers over HTTP."""

from __future__ import annotations

import json
from datetime import timedelta

import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import FIXED_NOW, Api, codes, error
from tests.support.factories import Factories

ADMIN = 900


async def test_admin_agents_filters_and_pages(api: Api, factories: Factories) -> None:
    owner = await factories.user()
    other = await factories.user()
    model = await factories.model()
    scheduled = await factories.agent(
        user_id=owner["id"], model_id=model["id"], schedule={"type": "interval", "every_hours": 1}
    )
    manual = await factories.agent(user_id=owner["id"], model_id=model["id"])
    paused = await factories.agent(user_id=other["id"], model_id=model["id"], admin_paused=True)
    disabled = await factories.agent(user_id=other["id"], model_id=model["id"], enabled=False)
    no_model = await factories.agent(user_id=other["id"], model_id=None)
    query = """query($first: Int!, $after: String, $owner: ID, $status: AgentStatus) {
      adminAgents(first: $first, after: $after, ownerId: $owner, status: $status) {
        edges { cursor node { id status owner { id } } } pageInfo { hasNextPage endCursor } } }"""

    async def ids(**variables: object) -> list[str]:
        page = (await api.data(query, {"first": 50, **variables}, as_user=ADMIN, admin=True))[
            "adminAgents"
        ]
        return [e["node"]["id"] for e in page["edges"]]

    everyone = [str(a["id"]) for a in (no_model, disabled, paused, manual, scheduled)]
    assert await ids() == everyone
    assert await ids(owner=str(owner["id"])) == [str(manual["id"]), str(scheduled["id"])]
    for status, agent in {
        "SCHEDULED": scheduled,
        "MANUAL": manual,
        "ADMIN_PAUSED": paused,
        "DISABLED": disabled,
        "NO_MODEL": no_model,
    }.items():
        assert await ids(status=status) == [str(agent["id"])], status
    first = (await api.data(query, {"first": 2}, as_user=ADMIN, admin=True))["adminAgents"]
    assert first["pageInfo"]["hasNextPage"] is True
    second = (
        await api.data(
            query, {"first": 2, "after": first["pageInfo"]["endCursor"]}, as_user=ADMIN, admin=True
        )
    )["adminAgents"]
    assert [e["node"]["id"] for e in second["edges"]] == everyone[2:4]


async def test_admin_runs_and_tools_and_settings(api: Api, factories: Factories) -> None:
    agent = await factories.agent()
    other = await factories.agent()
    runs = [await factories.run(agent_id=agent["id"], state="succeeded") for _ in range(2)]
    await factories.run(agent_id=other["id"], state="running")
    await factories.tool("hidden", agents_allowed=False)
    await factories.setting("agent_weekly_token_cap", 5000)
    await factories.setting("timezone", "Europe/Paris")
    data = await api.data(
        """query($a: ID!) {
          all: adminRuns { edges { node { id } } }
          mine: adminRuns(agentId: $a, states: [SUCCEEDED]) { edges { node { id agent { id } } } }
          adminTools { name agentsAllowed }
          platformSettings { weeklyTokenCap timezone platformPrompt iterationCap } }""",
        {"a": str(agent["id"])},
        as_user=ADMIN,
        admin=True,
    )
    assert len(data["all"]["edges"]) == 3
    assert [e["node"]["id"] for e in data["mine"]["edges"]] == [str(r["id"]) for r in runs[::-1]]
    assert {"name": "hidden", "agentsAllowed": False} in data["adminTools"]
    assert data["platformSettings"] == {
        "weeklyTokenCap": 5000,
        "timezone": "Europe/Paris",
        "platformPrompt": "",
        "iterationCap": 8,
    }


async def test_set_admin_paused_is_sticky_for_the_owner(api: Api, factories: Factories) -> None:
    owner = await factories.user()
    agent = await factories.agent(
        user_id=owner["id"],
        schedule={"type": "interval", "every_hours": 2},
        next_run_at=FIXED_NOW + timedelta(hours=1),
    )
    pause = """mutation($a: ID!, $p: Boolean!) { setAdminPaused(agentId: $a, paused: $p) {
        adminPaused status nextRunAt canStart } }"""
    paused = (await api.data(pause, {"a": str(agent["id"]), "p": True}, as_user=ADMIN, admin=True))[
        "setAdminPaused"
    ]
    assert paused == {
        "adminPaused": True,
        "status": "ADMIN_PAUSED",
        "nextRunAt": None,
        "canStart": False,
    }
    body = await api.body(pause, {"a": str(agent["id"]), "p": False}, as_user=owner["id"])
    assert codes(body) == ["FORBIDDEN"]
    body = await api.body(
        "mutation($a: ID!) { startRun(agentId: $a) { id } }",
        {"a": str(agent["id"])},
        as_user=owner["id"],
    )
    assert error(body)["extensions"]["lock"] == "ADMIN_PAUSED"
    resumed = (
        await api.data(pause, {"a": str(agent["id"]), "p": False}, as_user=ADMIN, admin=True)
    )["setAdminPaused"]
    assert resumed["status"] == "SCHEDULED"
    assert resumed["nextRunAt"] is not None


async def test_deactivate_owner_switches_agents_off_and_refuses_the_user(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    owner = await factories.user()
    for enabled in (True, True, False):
        await factories.agent(user_id=owner["id"], enabled=enabled)
    data = await api.data(
        "mutation($u: ID!) { deactivateOwner(userId: $u) }",
        {"u": str(owner["id"])},
        as_user=ADMIN,
        admin=True,
    )
    assert data["deactivateOwner"] == 2
    async with engine.connect() as conn:
        enabled = (
            await conn.execute(
                text("SELECT count(*) FROM agents WHERE user_id = :u AND enabled"),
                {"u": owner["id"]},
            )
        ).scalar_one()
        active = (
            await conn.execute(
                text("SELECT is_active FROM users WHERE id = :u"), {"u": owner["id"]}
            )
        ).scalar_one()
    assert enabled == 0
    assert active is False
    # The deactivated user's valid token is refused (FORBIDDEN), and the row stays inactive.
    body = await api.body("{ viewer { isAdmin } }", None, token=api.token(owner["id"], name="Back"))
    assert codes(body) == ["FORBIDDEN"]
    async with engine.connect() as conn:
        row = (
            await conn.execute(text("SELECT * FROM users WHERE id = :u"), {"u": owner["id"]})
        ).one()
    assert row.is_active is False
    assert row.display_name != "Back"
    missing = await api.body(
        'mutation { deactivateOwner(userId: "424242") }', None, as_user=ADMIN, admin=True
    )
    assert codes(missing) == ["NOT_FOUND"]
    self_lockout = await api.body(
        f'mutation {{ deactivateOwner(userId: "{ADMIN}") }}', None, as_user=ADMIN, admin=True
    )
    assert codes(self_lockout) == ["CONFLICT"]


async def test_models_upsert_default_and_removal_stops_agents(
    api: Api, factories: Factories
) -> None:
    upsert = """mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) {
        id name provider model isDefault baseUrl apiKeyEnv } }"""
    first = (
        await api.data(
            upsert,
            {
                "input": {
                    "name": "Local",
                    "provider": "builtin",
                    "model": "digest",
                    "isDefault": True,
                }
            },
            as_user=ADMIN,
            admin=True,
        )
    )["upsertAgentModel"]
    second = (
        await api.data(
            upsert,
            {
                "input": {
                    "name": "GPT",
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "baseUrl": "https://llm.internal/v1",
                    "apiKeyEnv": "OPENAI_API_KEY",
                    "isDefault": True,
                }
            },
            as_user=ADMIN,
            admin=True,
        )
    )["upsertAgentModel"]
    assert second["isDefault"] is True
    models = (await api.data("{ agentModels { id isDefault } }", None, as_user=ADMIN, admin=True))[
        "agentModels"
    ]
    assert {m["id"]: m["isDefault"] for m in models} == {first["id"]: False, second["id"]: True}
    renamed = (
        await api.data(
            upsert,
            {"input": {"id": first["id"], "name": "Local 2", "provider": "builtin", "model": "d"}},
            as_user=ADMIN,
            admin=True,
        )
    )["upsertAgentModel"]
    assert renamed["name"] == "Local 2"
    unknown = await api.body(
        upsert,
        {"input": {"id": "987654", "name": "x", "provider": "builtin", "model": "d"}},
        as_user=ADMIN,
        admin=True,
    )
    assert codes(unknown) == ["NOT_FOUND"]

    owner = await factories.user()
    agent = await factories.agent(
        user_id=owner["id"],
        model_id=int(second["id"]),
        schedule={"type": "interval", "every_hours": 1},
        next_run_at=FIXED_NOW + timedelta(minutes=10),
    )
    removed = await api.data(
        "mutation($id: ID!) { removeAgentModel(id: $id) }",
        {"id": second["id"]},
        as_user=ADMIN,
        admin=True,
    )
    assert removed["removeAgentModel"] == second["id"]
    after = (
        await api.data(
            "query($id: ID!) { agent(id: $id) { status model { id } nextRunAt canStart } }",
            {"id": str(agent["id"])},
            as_user=owner["id"],
        )
    )["agent"]
    assert after == {"status": "NO_MODEL", "model": None, "nextRunAt": None, "canStart": False}
    again = await api.body(
        "mutation($id: ID!) { removeAgentModel(id: $id) }",
        {"id": second["id"]},
        as_user=ADMIN,
        admin=True,
    )
    assert codes(again) == ["NOT_FOUND"]


async def test_set_tool_allowed_and_platform_settings(api: Api, factories: Factories) -> None:
    tool = await factories.tool("toggle_me", agents_allowed=False)
    data = await api.data(
        "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: true) { name agentsAllowed } }",
        {"t": str(tool["id"])},
        as_user=ADMIN,
        admin=True,
    )
    assert data["setToolAllowed"] == {"name": "toggle_me", "agentsAllowed": True}
    missing = await api.body(
        'mutation { setToolAllowed(toolId: "55555", allowed: true) { id } }',
        None,
        as_user=ADMIN,
        admin=True,
    )
    assert codes(missing) == ["NOT_FOUND"]
    update = """mutation($input: PlatformSettingsInput!) { updatePlatformSettings(input: $input) {
        weeklyTokenCap timezone platformPrompt iterationCap } }"""
    data = await api.data(
        update,
        {
            "input": {
                "weeklyTokenCap": 10000,
                "timezone": "America/New_York",
                "platformPrompt": "Be kind.",
                "iterationCap": 4,
            }
        },
        as_user=ADMIN,
        admin=True,
    )
    assert data["updatePlatformSettings"] == {
        "weeklyTokenCap": 10000,
        "timezone": "America/New_York",
        "platformPrompt": "Be kind.",
        "iterationCap": 4,
    }
    # Absent: unchanged. Explicit null: no cap.
    data = await api.data(update, {"input": {"weeklyTokenCap": None}}, as_user=ADMIN, admin=True)
    assert data["updatePlatformSettings"]["weeklyTokenCap"] is None
    assert data["updatePlatformSettings"]["timezone"] == "America/New_York"
    budget = await api.data(
        "{ viewer { budget { capTokens remainingTokens exceeded } } }",
        None,
        as_user=ADMIN,
        admin=True,
    )
    assert budget["viewer"]["budget"] == {
        "capTokens": None,
        "remainingTokens": None,
        "exceeded": False,
    }


async def test_fields_after_a_settings_change_in_one_document_see_the_new_settings(
    api: Api, factories: Factories
) -> None:
    # An admin without a zone of their own: their zone is the platform's.
    await factories.user(id=ADMIN, timezone=None)
    data = await api.data(
        """mutation { updatePlatformSettings(input: {timezone: "Asia/Tokyo"}) { timezone }
          createAgent(input: {name: "After", prompt: "p"}) { owner { timezone } } }""",
        None,
        as_user=ADMIN,
        admin=True,
    )
    assert data["updatePlatformSettings"] == {"timezone": "Asia/Tokyo"}
    assert data["createAgent"]["owner"] == {"timezone": "Asia/Tokyo"}


async def test_model_concurrency_limit_is_validated_kept_and_lifted(
    api: Api, factories: Factories
) -> None:
    upsert = """mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) {
        id maxConcurrentRuns } }"""
    base = {"name": "GPT", "provider": "openai", "model": "gpt-4o-mini"}
    created = (await api.data(upsert, {"input": base}, as_user=ADMIN, admin=True))[
        "upsertAgentModel"
    ]
    assert created["maxConcurrentRuns"] is None  # absent on create: no limit
    model_id = created["id"]
    limited = await api.data(
        upsert,
        {"input": {**base, "id": model_id, "maxConcurrentRuns": 3}},
        as_user=ADMIN,
        admin=True,
    )
    assert limited["upsertAgentModel"]["maxConcurrentRuns"] == 3

    for bad in (0, -1, 10_001):
        refused = await api.body(
            upsert,
            {"input": {**base, "id": model_id, "maxConcurrentRuns": bad}},
            as_user=ADMIN,
            admin=True,
        )
        assert codes(refused) == ["BAD_USER_INPUT"], bad
        assert error(refused)["extensions"]["field"] == "input.maxConcurrentRuns"
    kept = await api.data(
        upsert, {"input": {**base, "id": model_id, "name": "GPT 2"}}, as_user=ADMIN, admin=True
    )
    assert kept["upsertAgentModel"]["maxConcurrentRuns"] == 3  # absent: unchanged
    lifted = await api.data(
        upsert,
        {"input": {**base, "id": model_id, "maxConcurrentRuns": None}},
        as_user=ADMIN,
        admin=True,
    )
    assert lifted["upsertAgentModel"]["maxConcurrentRuns"] is None
    highest = await api.data(
        upsert,
        {"input": {**base, "id": model_id, "maxConcurrentRuns": 10_000}},
        as_user=ADMIN,
        admin=True,
    )
    assert highest["upsertAgentModel"]["maxConcurrentRuns"] == 10_000
    listed = (
        await api.data("{ agentModels { id maxConcurrentRuns } }", None, as_user=ADMIN, admin=True)
    )["agentModels"]
    assert {"id": model_id, "maxConcurrentRuns": 10_000} in listed


async def test_raising_a_models_limit_sends_the_runs_waiting_for_its_slots(
    api: Api, factories: Factories
) -> None:
    model = await factories.model(provider="openai", model="m", max_concurrent_runs=1)

    async def run(state: str) -> int:
        agent = await factories.agent(model_id=model["id"])
        return int((await factories.run(agent["id"], state=state, model_id=model["id"]))["id"])

    await run("running")
    waiting = [await run("queued") for _ in range(3)]
    broker = redis.Redis.from_url(api.settings.redis_url or "")
    try:
        broker.flushdb()
        await api.data(
            """mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) { id } }""",
            {
                "input": {
                    "id": str(model["id"]),
                    "name": "m",
                    "provider": "openai",
                    "model": "m",
                    "maxConcurrentRuns": 3,
                }
            },
            as_user=ADMIN,
            admin=True,
        )
        sent = [json.loads(body)["args"][0] for body in broker.hvals("dramatiq:runs.msgs")]
    finally:
        broker.close()
    # Two new slots (three, one taken): the two oldest waiting runs get their messages.
    assert sorted(sent) == waiting[:2]
