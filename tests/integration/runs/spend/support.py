"""The spend tests' steps on the shared GraphQL client: the admin's and owners' calls, and
waiting for runs."""

from __future__ import annotations

from typing import Any

from tests.integration.runs.support import FAKE_KEY_ENV
from tests.integration.runs.transcript.support import START, Gql

ADMIN_ID = 1

UPSERT_MODEL = """
mutation Upsert($input: AgentModelInput!) {
  upsertAgentModel(input: $input) { id name inputPricePerMillion outputPricePerMillion }
}"""
CREATE_AGENT = """
mutation Create($input: CreateAgentInput!) { createAgent(input: $input) { id } }"""
SETTINGS = """
mutation Settings($input: PlatformSettingsInput!) {
  updatePlatformSettings(input: $input) { weeklyTokenCap currency budgetAlertPercents }
}"""


def model_input(base_url: str, **fields: str | None) -> dict[str, Any]:
    """An AgentModelInput for a model on the fake OpenAI server (`id` to update one)."""
    return {
        "name": "Fake",
        "provider": "openai",
        "model": "fake-model",
        "baseUrl": base_url,
        "apiKeyEnv": FAKE_KEY_ENV,
        **fields,
    }


async def fake_model(gql: Gql, base_url: str, **fields: str | None) -> str:
    """A model on the fake OpenAI server, created by the admin; returns its id."""
    data = await gql.data(
        UPSERT_MODEL, {"input": model_input(base_url, **fields)}, as_user=ADMIN_ID, admin=True
    )
    model_id: str = data["upsertAgentModel"]["id"]
    return model_id


async def create_agent(gql: Gql, owner: int, model_id: str, name: str = "Digest") -> str:
    data = await gql.data(
        CREATE_AGENT,
        {"input": {"name": name, "prompt": "What changed?", "modelId": model_id}},
        as_user=owner,
    )
    agent_id: str = data["createAgent"]["id"]
    return agent_id


async def start_run(gql: Gql, owner: int, agent_id: str) -> str:
    data = await gql.data(START, {"id": agent_id}, as_user=owner)
    assert data["startRun"]["state"] == "QUEUED", data
    run_id: str = data["startRun"]["id"]
    return run_id


async def run_to_the_end(gql: Gql, owner: int, agent_id: str) -> dict[str, Any]:
    return await gql.finished_run(await start_run(gql, owner, agent_id), as_user=owner)
