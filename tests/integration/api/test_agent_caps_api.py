"""The owner's caps on an agent's tokens through the API: set, cleared, validated, and the agent's
spend this week served for a page of agents in one statement however many agents."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE
from tests.integration.api.support import Api
from tests.integration.api.test_api_statements import counting_statements
from tests.support.factories import Factories
from tests.support.graphql import error, error_code

OWNER = 71
FIELDS = "id weeklyTokenCap maxTokensPerRun usedTokensThisWeek"
CREATE = f"mutation($input: CreateAgentInput!) {{ createAgent(input: $input) {{ {FIELDS} }} }}"
UPDATE = (
    "mutation($id: ID!, $input: UpdateAgentInput!) {"
    f" updateAgent(id: $id, input: $input) {{ {FIELDS} }} }}"
)
PAGE = "{ viewer { agents { id usedTokensThisWeek weeklyTokenCap } } }"


async def test_caps_are_set_kept_when_absent_and_cleared_by_an_explicit_null(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    await factories.model(is_default=True)
    created = (
        await api.data(
            CREATE,
            {
                "input": {
                    "name": "Capped",
                    "prompt": "Summarise.",
                    "weeklyTokenCap": 50_000,
                    "maxTokensPerRun": 4_000,
                }
            },
            as_user=OWNER,
        )
    )["createAgent"]
    assert (created["weeklyTokenCap"], created["maxTokensPerRun"]) == (50_000, 4_000)
    assert created["usedTokensThisWeek"] == 0

    kept = (
        await api.data(UPDATE, {"id": created["id"], "input": {"name": "Renamed"}}, as_user=OWNER)
    )["updateAgent"]
    assert (kept["weeklyTokenCap"], kept["maxTokensPerRun"]) == (50_000, 4_000)

    cleared = (
        await api.data(
            UPDATE, {"id": created["id"], "input": {"weeklyTokenCap": None}}, as_user=OWNER
        )
    )["updateAgent"]
    assert (cleared["weeklyTokenCap"], cleared["maxTokensPerRun"]) == (None, 4_000)


async def test_a_cap_that_is_not_positive_is_bad_user_input_naming_the_field(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    await factories.model(is_default=True)
    agent = await factories.agent(user_id=OWNER)
    base = {"name": "Capped", "prompt": "Summarise."}
    cases = [
        (CREATE, {"input": {**base, "weeklyTokenCap": 0}}, "input.weeklyTokenCap"),
        (CREATE, {"input": {**base, "maxTokensPerRun": -5}}, "input.maxTokensPerRun"),
        (UPDATE, {"id": str(agent["id"]), "input": {"weeklyTokenCap": -1}}, "input.weeklyTokenCap"),
        (
            UPDATE,
            {"id": str(agent["id"]), "input": {"maxTokensPerRun": 0}},
            "input.maxTokensPerRun",
        ),
    ]
    for query, variables, field in cases:
        body = await api.body(query, variables, as_user=OWNER)
        assert error_code(body) == "BAD_USER_INPUT", body
        assert error(body)["extensions"]["field"] == field
        assert "positive" in error(body)["message"]


async def test_used_tokens_this_week_is_one_statement_per_page_in_the_organisations_week(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    api.clock.now = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)  # a Wednesday
    await factories.setting(TIMEZONE, "America/New_York")
    small, large = 72, 73
    for owner, count in ((small, 3), (large, 30)):
        await factories.user(id=owner)
        for i in range(count):
            agent = await factories.agent(user_id=owner, name=f"a{i}", weekly_token_cap=1_000)
            await factories.run(
                agent["id"],
                state="succeeded",
                tokens_used=10 + i,
                finished_at=datetime(2025, 3, 9, 6, 0, tzinfo=UTC),  # Sunday 01:00 New York
            )
            await factories.run(
                agent["id"],
                state="succeeded",
                tokens_used=500,
                finished_at=datetime(2025, 3, 9, 3, 30, tzinfo=UTC),  # last week there
            )
        await api.data("{ viewer { isAdmin } }", None, as_user=owner)  # provisioning warm-up

    database = engine.url.database
    assert database is not None
    counts = {}
    for owner, count in ((small, 3), (large, 30)):
        with counting_statements(database) as statements:
            agents = (await api.data(PAGE, None, as_user=owner))["viewer"]["agents"]
        counts[count] = len(statements)
        assert sorted(a["usedTokensThisWeek"] for a in agents) == [10 + i for i in range(count)]
        assert all(a["weeklyTokenCap"] == 1_000 for a in agents)
    assert counts[3] == counts[30]
