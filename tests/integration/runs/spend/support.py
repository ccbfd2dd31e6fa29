"""A GraphQL client for the spend tests: the admin's and owners' calls, and waiting for runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

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


@dataclass
class Client:
    """The integration suite's `Gql`, spoken the spend tests' way (`user=`), with their steps."""

    api: Gql

    @property
    def http(self) -> httpx.AsyncClient:
        return self.api.http

    def token(self, user_id: int, *, admin: bool = False) -> str:
        return self.api.bearer(user_id, admin=admin)

    async def gql(
        self, query: str, variables: dict[str, Any] | None = None, *, user: int, admin: bool = False
    ) -> dict[str, Any]:
        return await self.api.body(query, variables, as_user=user, admin=admin)

    async def data(
        self, query: str, variables: dict[str, Any] | None = None, *, user: int, admin: bool = False
    ) -> dict[str, Any]:
        return await self.api.data(query, variables, as_user=user, admin=admin)

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
