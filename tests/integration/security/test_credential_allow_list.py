"""AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES: an operator allows only named variables as keys, at the
API and again in the worker."""

from __future__ import annotations

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import tool_sources as sources_db
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.testing.mcp_tickets import TicketServer
from tests.integration.runs.transcript.support import Gql, error_code
from tests.support.factories import Factories

SYNC_SOURCE = "mutation($id: ID!) { syncToolSource(id: $id) { id lastError tools { name } } }"
UPSERT_MODEL = """
mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) { id apiKeyEnv } }
"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"credential_env_prefixes": " LLM_ , MODEL_KEY_,"})


def _model(api_key_env: str) -> dict[str, str]:
    return {"name": "M", "provider": "openai", "model": "m", "apiKeyEnv": api_key_env}


async def test_only_allowed_prefixes_are_accepted(gql: Gql, factories: Factories) -> None:
    admin = (await factories.user())["id"]
    body = await gql.body(
        UPSERT_MODEL, {"input": _model("OPENAI_API_KEY")}, as_user=admin, admin=True
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.apiKeyEnv"
    assert "LLM_, MODEL_KEY_" in body["errors"][0]["message"]
    saved = await gql.data(UPSERT_MODEL, {"input": _model("LLM_OPENAI")}, as_user=admin, admin=True)
    assert saved["upsertAgentModel"]["apiKeyEnv"] == "LLM_OPENAI"


async def test_the_worker_holds_to_the_allow_list_too(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTHER_TEAMS_KEY", "sk-other")
    model = await factories.model(
        name="Old row",
        provider="openai",
        model="m",
        base_url=fake_openai.base_url,
        api_key_env="OTHER_TEAMS_KEY",
    )
    owner = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)
    assert run["state"] == "FAILED" and "model 'Old row' was not called" in run["error"]
    assert fake_openai.request_count == 0


async def test_a_tool_source_outside_the_allow_list_is_not_synced(
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A source row written before the allow-list (or in SQL): the sync sends its server
    nothing, as a tool call would not."""
    monkeypatch.setenv("TICKETS_TOKEN", "tickets-secret")
    admin = (await factories.user())["id"]
    with TicketServer() as tickets:
        async with engine.begin() as conn:
            source_id = await sources_db.insert_source(
                conn, name="tickets", url=tickets.url, auth_env="TICKETS_TOKEN", enabled=True
            )
        data = await gql.data(SYNC_SOURCE, {"id": str(source_id)}, as_user=admin, admin=True)
        assert tickets.state.list_authorizations == []
    source = data["syncToolSource"]
    assert source["tools"] == []
    assert "sync refused" in source["lastError"]
