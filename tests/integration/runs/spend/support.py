"""A GraphQL client for the spend tests: the admin's and owners' calls, and waiting for runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import Server, token
from tests.integration.runs.support import FAKE_KEY_ENV, eventually

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


@dataclass
class Client:
    http: httpx.AsyncClient
    server: Server
    settings: Settings

    def token(self, user_id: int, *, admin: bool = False) -> str:
        return token(self.settings, user_id, admin=admin)

    async def gql(
        self, query: str, variables: dict[str, Any] | None = None, *, user: int, admin: bool = False
    ) -> dict[str, Any]:
        response = await self.http.post(
            f"{self.server.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {self.token(user, admin=admin)}"},
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def data(
        self, query: str, variables: dict[str, Any] | None = None, *, user: int, admin: bool = False
    ) -> dict[str, Any]:
        body = await self.gql(query, variables, user=user, admin=admin)
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data

    async def admin(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.data(query, variables, user=ADMIN_ID, admin=True)

    async def fake_model(self, base_url: str, **fields: str | None) -> str:
        """A model on the fake OpenAI server, created by the admin; returns its id."""
        data = await self.admin(UPSERT_MODEL, {"input": model_input(base_url, **fields)})
        model_id: str = data["upsertAgentModel"]["id"]
        return model_id

    async def agent(self, owner: int, model_id: str, name: str = "Digest") -> str:
        data = await self.data(
            CREATE_AGENT,
            {"input": {"name": name, "prompt": "What changed?", "modelId": model_id}},
            user=owner,
        )
        agent_id: str = data["createAgent"]["id"]
        return agent_id

    async def start(self, owner: int, agent_id: str) -> str:
        data = await self.data(START_RUN, {"id": agent_id}, user=owner)
        assert data["startRun"]["state"] == "QUEUED", data
        run_id: str = data["startRun"]["id"]
        return run_id

    async def finished_run(self, owner: int, run_id: str) -> dict[str, Any]:
        async def finished() -> dict[str, Any] | None:
            run: dict[str, Any] = (await self.data(RUN, {"id": run_id}, user=owner))["run"]
            return run if run["state"] in ("SUCCEEDED", "FAILED", "SKIPPED") else None

        found: dict[str, Any] = await eventually(finished, what=f"run {run_id} to finish")
        return found

    async def run_to_the_end(self, owner: int, agent_id: str) -> dict[str, Any]:
        return await self.finished_run(owner, await self.start(owner, agent_id))
