"""Lists that survive their rows: a row whose relation was deleted, removed or hidden never takes
its list down (no `data: null`, no INTERNAL, no HTTP 500).

What a vanished target means, per relation (README, "API"):

- an agent deleted while its runs still count is *hidden*; every list of agents leaves it out, and
  so do the lists of what hangs from it (`adminRuns`, `toolApprovals`);
- a row read just before its agent was hidden shows the agent as it was (`Run.agent`,
  `ToolApproval.agent` are non-null in the contract);
- a tool that left the catalog shows under its recorded name (`ToolApproval.tool`); a model removed
  from the list leaves `Agent.model` null; a removed tool leaves `Agent.tools`; a removed delivery
  target's deliveries go with it; an actor or owner is a user, and users are never deleted.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.loaders import Loaders
from tests.integration.api.support import FIXED_NOW, Api, codes
from tests.support.factories import Factories

ADMIN = 9071
DELETE = "mutation($id: ID!) { deleteAgent(id: $id) }"
APPROVALS = "{ toolApprovals { edges { node { id agent { id } tool { id } } } } }"


async def _parked(factories: Factories, owner_id: int, name: str) -> tuple[dict[str, Any], ...]:
    """An agent whose running run is parked on a pending approval."""
    agent = await factories.agent(user_id=owner_id, name=name)
    run = await factories.run(agent["id"], state="running", tokens_used=40)
    approval = await factories.approval(run)
    return agent, run, approval


def _answered(body: dict[str, Any], field: str) -> Any:
    """The list answered: data present, no INTERNAL (a masked bug), no NOT_FOUND from a row."""
    assert body.get("data") is not None, body
    assert body["data"][field] is not None, body
    assert "INTERNAL" not in codes(body), body
    assert "NOT_FOUND" not in codes(body), body
    return body["data"][field]


async def _hide(engine: AsyncEngine, agent_id: int) -> None:
    """Hide the agent as deleteAgent does, without ending its runs: the state a list sees when
    the deletion commits between its page read and its relations' reads."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET deleted_at = now(), enabled = false WHERE id = :id"),
            {"id": agent_id},
        )


# --- the reported case ---------------------------------------------------------------------------

SELECTIONS = [
    APPROVALS,
    "{ toolApprovals { edges { node { id status run { id state } agent { id name } } } } }",
    "{ toolApprovals { edges { node { agent { id owner { id } } tool { name } run { id } } } } }",
    "{ toolApprovals { edges { node { id run { agent { id } } agent { runs { edges { node {"
    " id } } } } } } } }",
]


@pytest.mark.parametrize("query", SELECTIONS)
async def test_approvals_answer_after_the_owner_deletes_an_agent_that_waits_for_one(
    api: Api, factories: Factories, query: str
) -> None:
    owner = await factories.user()
    _, _, kept = await _parked(factories, owner["id"], "Kept")
    doomed, _, _ = await _parked(factories, owner["id"], "Doomed")
    await api.data(DELETE, {"id": str(doomed["id"])}, as_user=owner["id"])

    response = await api.post(query, as_user=owner["id"])

    assert response.status_code == 200, response.text
    edges = _answered(response.json(), "toolApprovals")["edges"]
    # The deleted agent's approval is left out, the other one is there.
    assert [edge["node"].get("id", str(kept["id"])) for edge in edges] == [str(kept["id"])]


async def test_approvals_read_just_before_their_agent_was_hidden_show_it_as_it_was(
    api: Api, engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agent, run, approval = await _parked(factories, owner["id"], "Briefly")
    loaders = Loaders(engine, now=FIXED_NOW)
    # The page was read while the agent was live; then the agent was hidden.
    await _hide(engine, agent["id"])
    seen = await loaders.agent_as_it_was.load(agent["id"])
    assert seen is not None and seen.name == "Briefly" and seen.deleted_at is not None
    assert await loaders.agent.load(agent["id"]) is None  # every read of agents leaves it out
    await loaders.release()
    assert approval["run_id"] == run["id"]
