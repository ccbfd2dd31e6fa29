"""The spend tests' steps on the shared GraphQL client: the admin's and owners' calls, and
waiting for runs."""

from __future__ import annotations

from typing import Any

from tests.integration.runs.support import FAKE_KEY_ENV, eventually
from tests.integration.runs.transcript.support import Gql

ADMIN_ID = 1

UPSERT_MODEL = """
mutation Upsert($input: AgentModelInput!) {
  upsertAgentModel(input: $input) { id name inputPricePerMillion outputPricePerMillion }
}"""
CREATE_AGENT = """
mutation Create($input: CreateAgentInput!) { createAgent(input: $input) { id } }"""
START_RUN = "mutation Start($id: ID!) { startRun(agentId: $id) { id state } }"
RUN = """
query Run($id: ID!) {
  run(id: $id) { id state tokensUsed promptTokens completionTokens cost }
}"""
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
    data = await gql.data(START_RUN, {"id": agent_id}, as_user=owner)
    assert data["startRun"]["state"] == "QUEUED", data
    run_id: str = data["startRun"]["id"]
    return run_id


async def finished_run(gql: Gql, owner: int, run_id: str) -> dict[str, Any]:
    async def finished() -> dict[str, Any] | None:
        run: dict[str, Any] = (await gql.data(RUN, {"id": run_id}, as_user=owner))["run"]
        return run if run["state"] in ("SUCCEEDED", "FAILED", "SKIPPED") else None

    found: dict[str, Any] = await eventually(finished, what=f"run {run_id} to finish")
    return found


async def run_to_the_end(gql: Gql, owner: int, agent_id: str) -> dict[str, Any]:
    return await finished_run(gql, owner, await start_run(gql, owner, agent_id))
