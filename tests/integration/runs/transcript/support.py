"""GraphQL over HTTP for the transcript, cancel and delivery tests."""

from __future__ import annotations

from typing import Any

import httpx

from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import Server, token
from tests.integration.runs.support import eventually

RUN = """
query Run($id: ID!) {
  run(id: $id) {
    id state reason error output tokensUsed promptTokens completionTokens
    steps { index kind name input output error promptTokens completionTokens startedAt finishedAt }
    deliveries { status webhookId attempts lastStatusCode lastError deliveredAt
                 target { id name url secretEnv enabled } }
  }
}
"""
START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"
CANCEL = "mutation($id: ID!) { cancelRun(runId: $id) { id state reason error tokensUsed } }"


class Gql:
    def __init__(self, server: Server, http: httpx.AsyncClient, settings: Settings) -> None:
        self.server = server
        self.http = http
        self.settings = settings

    def bearer(self, user_id: int, *, admin: bool = False) -> str:
        return token(self.settings, user_id, admin=admin)

    async def body(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_user: int,
        admin: bool = False,
    ) -> dict[str, Any]:
        response = await self.http.post(
            f"{self.server.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {self.bearer(as_user, admin=admin)}"},
        )
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def data(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_user: int,
        admin: bool = False,
    ) -> dict[str, Any]:
        body = await self.body(query, variables, as_user=as_user, admin=admin)
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data

    async def start(self, agent_id: object, *, as_user: int) -> str:
        """The id of the run `startRun` queued for the agent."""
        started = await self.data(START, {"id": str(agent_id)}, as_user=as_user)
        run_id: str = started["startRun"]["id"]
        return run_id

    async def run(self, run_id: str, *, as_user: int, admin: bool = False) -> dict[str, Any]:
        run: dict[str, Any] = (await self.data(RUN, {"id": run_id}, as_user=as_user, admin=admin))[
            "run"
        ]
        return run

    async def finished_run(
        self, run_id: str, *, as_user: int, within: float = 20
    ) -> dict[str, Any]:
        async def done() -> dict[str, Any] | None:
            run = await self.run(run_id, as_user=as_user)
            return run if run["state"] not in ("QUEUED", "RUNNING") else None

        found: dict[str, Any] = await eventually(done, within=within, what=f"run {run_id} to end")
        return found


def error_code(body: dict[str, Any]) -> str | None:
    errors = body.get("errors") or []
    assert len(errors) == 1, body
    code: str | None = errors[0].get("extensions", {}).get("code")
    return code
