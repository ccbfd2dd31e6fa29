"""GraphQL steps of the transcript, cancel and delivery tests, on the shared client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.integration.runs.support import eventually
from tests.support.graphql import GraphQL, error_code

__all__ = ["CANCEL", "RUN", "START", "Gql", "error_code"]

RUN = """
query Run($id: ID!) {
  run(id: $id) {
    id state reason error output tokensUsed promptTokens completionTokens cost
    steps { index kind name input output error promptTokens completionTokens startedAt finishedAt }
    deliveries { status webhookId attempts lastStatusCode lastError deliveredAt
                 target { id name url secretEnv enabled } }
  }
}
"""
START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"
CANCEL = "mutation($id: ID!) { cancelRun(runId: $id) { id state reason error tokensUsed } }"


@dataclass
class Gql(GraphQL):
    """The shared GraphQL client against the integration suite's `server`, with run steps."""

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
