"""Bad input of every kind gets the documented error and changes nothing in the database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import Api
from tests.support.factories import Factories

OWNER = 31
OTHER = 32
ADMIN = 33
TABLES = (
    "users",
    "agents",
    "agent_runs",
    "agent_tools",
    "agent_models",
    "tools",
    "platform_settings",
)


async def snapshot(engine: AsyncEngine) -> dict[str, list[Any]]:
    async with engine.connect() as conn:
        return {
            table: [tuple(r) for r in await conn.execute(text(f"SELECT * FROM {table} ORDER BY 1"))]
            for table in TABLES
        }


CREATE = "mutation($input: CreateAgentInput!) { createAgent(input: $input) { id } }"
MODEL = 'mutation { upsertAgentModel(input: {name: "x", %s}) { id } }'
UPDATE = (
    "mutation($id: ID!, $input: UpdateAgentInput!) { updateAgent(id: $id, input: $input) { id } }"
)


def create(**fields: Any) -> tuple[str, dict[str, Any]]:
    return CREATE, {"input": {"name": "n", "prompt": "p", **fields}}


async def test_bad_input_is_refused_and_changes_nothing(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    await factories.user(id=OWNER)
    await factories.user(id=OTHER)
    await factories.user(id=ADMIN)
    model = await factories.model(is_default=True)
    mine = await factories.agent(user_id=OWNER, model_id=model["id"])
    theirs = await factories.agent(user_id=OTHER, model_id=model["id"])
    theirs_run = await factories.run(agent_id=theirs["id"], state="succeeded")
    disallowed = await factories.tool("nope", agents_allowed=False)
    owner = api.token(OWNER)
    admin = api.token(ADMIN, admin=True)
    await api.data("{ viewer { isAdmin } }", None, token=owner)
    await api.data("{ viewer { isAdmin } }", None, token=admin)

    interval = lambda hours: {"interval": {"everyHours": hours}}  # noqa: E731
    calendar = lambda **c: {"calendar": {"cadence": "DAILY", "time": "09:00", **c}}  # noqa: E731
    cases: list[tuple[str, tuple[str, dict[str, Any]], str, str | None, str]] = [
        # (name, (document, variables), code, field, token)
        (
            "interval 0",
            create(schedule=interval(0)),
            "BAD_USER_INPUT",
            "input.schedule.interval.everyHours",
            owner,
        ),
        (
            "interval 169",
            create(schedule=interval(169)),
            "BAD_USER_INPUT",
            "input.schedule.interval.everyHours",
            owner,
        ),
        (
            "bad time",
            create(schedule=calendar(time="25:00")),
            "BAD_USER_INPUT",
            "input.schedule.calendar.time",
            owner,
        ),
        (
            "time words",
            create(schedule=calendar(time="nine")),
            "BAD_USER_INPUT",
            "input.schedule.calendar.time",
            owner,
        ),
        (
            "weekly without weekday",
            create(schedule=calendar(cadence="WEEKLY")),
            "BAD_USER_INPUT",
            "input.schedule.calendar.weekday",
            owner,
        ),
        (
            "weekday 7",
            create(schedule=calendar(cadence="WEEKLY", weekday=7)),
            "BAD_USER_INPUT",
            "input.schedule.calendar.weekday",
            owner,
        ),
        ("both variants", create(schedule={**interval(2), **calendar()}), "*", None, owner),
        ("empty schedule", create(schedule={}), "*", None, owner),
        ("long name", create(name="x" * 201), "BAD_USER_INPUT", "input.name", owner),
        ("blank name", create(name="   "), "BAD_USER_INPUT", "input.name", owner),
        ("long prompt", create(prompt="x" * 20_001), "BAD_USER_INPUT", "input.prompt", owner),
        (
            "long description",
            create(description="x" * 2_001),
            "BAD_USER_INPUT",
            "input.description",
            owner,
        ),
        ("big meta", create(meta={"k": "x" * 17_000}), "BAD_USER_INPUT", "input.meta", owner),
        ("meta not object", create(meta=[1, 2]), "BAD_USER_INPUT", "input.meta", owner),
        ("unknown model", create(modelId="999999"), "BAD_USER_INPUT", "input.modelId", owner),
        ("bad model id", create(modelId="abc"), "BAD_USER_INPUT", "input.modelId", owner),
        (
            "disallowed tool",
            create(toolIds=[str(disallowed["id"])]),
            "BAD_USER_INPUT",
            "input.toolIds",
            owner,
        ),
        ("unknown tool", create(toolIds=["888888"]), "BAD_USER_INPUT", "input.toolIds", owner),
        (
            "wrong type",
            (CREATE, {"input": {"name": 5, "prompt": "p"}}),
            "BAD_USER_INPUT",
            None,
            owner,
        ),
        (
            "wrong enabled",
            (CREATE, {"input": {"name": "n", "prompt": "p", "enabled": "yes"}}),
            "BAD_USER_INPUT",
            None,
            owner,
        ),
        ("missing prompt", (CREATE, {"input": {"name": "n"}}), "BAD_USER_INPUT", None, owner),
        (
            "update others",
            (UPDATE, {"id": str(theirs["id"]), "input": {"name": "x"}}),
            "NOT_FOUND",
            None,
            owner,
        ),
        (
            "update unknown",
            (UPDATE, {"id": "777777", "input": {"name": "x"}}),
            "NOT_FOUND",
            None,
            owner,
        ),
        (
            "update bad id",
            (UPDATE, {"id": "-1", "input": {"name": "x"}}),
            "BAD_USER_INPUT",
            "id",
            owner,
        ),
        (
            "update null name",
            (UPDATE, {"id": str(mine["id"]), "input": {"name": None}}),
            "BAD_USER_INPUT",
            "input.name",
            owner,
        ),
        (
            "update null prompt",
            (UPDATE, {"id": str(mine["id"]), "input": {"prompt": None}}),
            "BAD_USER_INPUT",
            "input.prompt",
            owner,
        ),
        (
            "update null model",
            (UPDATE, {"id": str(mine["id"]), "input": {"modelId": None}}),
            "BAD_USER_INPUT",
            "input.modelId",
            owner,
        ),
        (
            "update bad schedule",
            (UPDATE, {"id": str(mine["id"]), "input": {"schedule": interval(0)}}),
            "BAD_USER_INPUT",
            "input.schedule.interval.everyHours",
            owner,
        ),
        (
            "update unknown model",
            (UPDATE, {"id": str(mine["id"]), "input": {"modelId": "424242"}}),
            "BAD_USER_INPUT",
            "input.modelId",
            owner,
        ),
        (
            "delete others",
            ("mutation($id: ID!) { deleteAgent(id: $id) }", {"id": str(theirs["id"])}),
            "NOT_FOUND",
            None,
            owner,
        ),
        (
            "others run",
            ("query($id: ID!) { run(id: $id) { id } }", {"id": str(theirs_run["id"])}),
            "NOT_FOUND",
            None,
            owner,
        ),
        ("unknown run", ('query { run(id: "5555555") { id } }', {}), "NOT_FOUND", None, owner),
        (
            "page too big",
            (
                "query($id: ID!) { agent(id: $id) { runs(first: 101) { edges { cursor } } } }",
                {"id": str(mine["id"])},
            ),
            "BAD_USER_INPUT",
            "first",
            owner,
        ),
        (
            "page zero",
            ("{ adminRuns(first: 0) { edges { cursor } } }", {}),
            "BAD_USER_INPUT",
            "first",
            admin,
        ),
        (
            "bad cursor",
            ('{ adminRuns(after: "garbage!") { edges { cursor } } }', {}),
            "BAD_USER_INPUT",
            "after",
            admin,
        ),
        (
            "foreign cursor",
            ("query($c: String) { adminAgents(after: $c) { edges { cursor } } }", {"c": "cnVuOjE"}),
            "BAD_USER_INPUT",
            "after",
            admin,
        ),
        (
            "upcoming limit",
            (
                "query($id: ID!) { agent(id: $id) { upcomingRunTimes(limit: 1000) } }",
                {"id": str(mine["id"])},
            ),
            "BAD_USER_INPUT",
            "limit",
            owner,
        ),
        (
            "bad provider",
            (
                MODEL % 'provider: "acme", model: "m"',
                {},
            ),
            "BAD_USER_INPUT",
            "input.provider",
            admin,
        ),
        (
            "bad base url",
            (
                MODEL % 'provider: "openai", model: "m", baseUrl: "ftp://x"',
                {},
            ),
            "BAD_USER_INPUT",
            "input.baseUrl",
            admin,
        ),
        (
            "bad env name",
            (
                MODEL % 'provider: "openai", model: "m", apiKeyEnv: "A B"',
                {},
            ),
            "BAD_USER_INPUT",
            "input.apiKeyEnv",
            admin,
        ),
        (
            "bad zone",
            (
                'mutation { updatePlatformSettings(input: {timezone: "Mars/Base"}) { timezone } }',
                {},
            ),
            "BAD_USER_INPUT",
            "input.timezone",
            admin,
        ),
        (
            "negative cap",
            ("mutation { updatePlatformSettings(input: {weeklyTokenCap: -1}) { timezone } }", {}),
            "BAD_USER_INPUT",
            "input.weeklyTokenCap",
            admin,
        ),
        (
            "iteration cap 0",
            ("mutation { updatePlatformSettings(input: {iterationCap: 0}) { timezone } }", {}),
            "BAD_USER_INPUT",
            "input.iterationCap",
            admin,
        ),
        (
            "pause unknown",
            ('mutation { setAdminPaused(agentId: "999999", paused: true) { id } }', {}),
            "NOT_FOUND",
            None,
            admin,
        ),
        (
            "tools: others",
            (
                "mutation($a: ID!) { setAgentTools(agentId: $a, toolIds: []) { id } }",
                {"a": str(theirs["id"])},
            ),
            "NOT_FOUND",
            None,
            owner,
        ),
        (
            "tools: too many",
            (
                "mutation($a: ID!, $t: [ID!]!) { setAgentTools(agentId: $a, toolIds: $t) { id } }",
                {"a": str(mine["id"]), "t": [str(i) for i in range(1, 102)]},
            ),
            "BAD_USER_INPUT",
            "toolIds",
            owner,
        ),
        (
            "start others",
            ("mutation($a: ID!) { startRun(agentId: $a) { id } }", {"a": str(theirs["id"])}),
            "NOT_FOUND",
            None,
            owner,
        ),
    ]
    before = await snapshot(engine)
    failures = []
    for name, (document, variables), code, field, token in cases:
        body = await api.body(document, variables, token=token)
        errors = body.get("errors") or []
        got_codes = [e.get("extensions", {}).get("code") for e in errors]
        got_field = errors[0].get("extensions", {}).get("field") if errors else None
        ok = bool(errors) and (code == "*" or got_codes == [code])
        if field is not None and got_field != field:
            ok = False
        if not ok:
            failures.append((name, code, field, errors))
    assert not failures, failures
    assert await snapshot(engine) == before
