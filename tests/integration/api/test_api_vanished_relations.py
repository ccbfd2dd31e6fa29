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


# --- every list of the schema, with a row whose relations were deleted, removed or hidden -------

OWNER = 9072
DEACTIVATED = 9073


async def _world(api: Api, engine: AsyncEngine, factories: Factories) -> dict[str, int]:
    """Rows whose relations vanished every way the engine lets them vanish."""
    await factories.user(OWNER)
    await factories.user(ADMIN)
    gone_owner = await factories.user(DEACTIVATED)
    model = await factories.model(name="Removed model")
    kept = await factories.agent(user_id=OWNER, name="Kept", model_id=model["id"])
    removed_tool = await factories.tool("removed_tool")
    disallowed_tool = await factories.tool("disallowed_tool")
    target = await factories._insert(
        "delivery_targets", {"name": "hook", "url": "https://hooks.example/x", "secret_env": "S"}
    )
    run = await factories.run(kept["id"], state="succeeded", tokens_used=5, output="done")
    async with engine.begin() as conn:
        for tool in (removed_tool, disallowed_tool):
            await conn.execute(
                text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
                {"a": kept["id"], "t": tool["id"]},
            )
        await conn.execute(
            text("INSERT INTO agent_delivery_targets (agent_id, target_id) VALUES (:a, :t)"),
            {"a": kept["id"], "t": target["id"]},
        )
        await conn.execute(
            text(
                "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at)"
                " VALUES (:r, 0, 'model_call', 'builtin', now()),"
                " (:r, 1, 'tool_call', 'removed_tool', now())"
            ),
            {"r": run["id"]},
        )
        await conn.execute(
            text(
                "INSERT INTO run_deliveries (run_id, target_id, webhook_id, event_type, payload)"
                " VALUES (:r, :t, 'msg_1', 'run.finished', '{}')"
            ),
            {"r": run["id"], "t": target["id"]},
        )
    await factories.approval(run, tool_id=removed_tool["id"], tool_name="removed_tool")
    hidden, _, _ = await _parked(factories, OWNER, "Hidden")
    await api.data(DELETE, {"id": str(hidden["id"])}, as_user=OWNER)
    purged = await factories.agent(user_id=OWNER, name="Purged")
    async with engine.begin() as conn:
        # The model leaves the allowed list, a tool the catalog, a target is switched off,
        # an owner deactivated; the audit log and an alert name what is gone.
        await conn.execute(text("DELETE FROM agent_models WHERE id = :id"), {"id": model["id"]})
        await conn.execute(text("DELETE FROM tools WHERE id = :id"), {"id": removed_tool["id"]})
        await conn.execute(
            text("UPDATE tools SET agents_allowed = false WHERE id = :id"),
            {"id": disallowed_tool["id"]},
        )
        await conn.execute(
            text("UPDATE delivery_targets SET enabled = false WHERE id = :id"),
            {"id": target["id"]},
        )
        await conn.execute(
            text("UPDATE users SET is_active = false WHERE id = :id"), {"id": gone_owner["id"]}
        )
        await conn.execute(
            text(
                "INSERT INTO audit_log (actor_id, action, agent_id, user_id)"
                " VALUES (:admin, 'agent.deleted', :purged, :owner),"
                " (:admin, 'agent.deleted', :hidden, :owner),"
                " (:admin, 'user.deactivated', NULL, :gone)"
            ),
            {
                "admin": ADMIN,
                "purged": purged["id"],
                "hidden": hidden["id"],
                "owner": OWNER,
                "gone": gone_owner["id"],
            },
        )
        await conn.execute(text("DELETE FROM agents WHERE id = :id"), {"id": purged["id"]})
        await conn.execute(
            text(
                "INSERT INTO budget_alerts (owner_id, window_start, percent, used_tokens,"
                " cap_tokens, crossed_at)"
                " VALUES (:o, :w, 80, 80, 100, :w), (:g, :w, 100, 100, 100, :w)"
            ),
            {"o": OWNER, "g": gone_owner["id"], "w": FIXED_NOW},
        )
        # Owners' accounts at OWNER_OAUTH sources: one source switched off since, the other's
        # connection expired, and one of the deactivated owner's.
        for name, enabled in (("kept_src", True), ("off_src", False)):
            source = (
                await conn.execute(
                    text(
                        "INSERT INTO tool_sources (name, url, auth, enabled)"
                        " VALUES (:n, 'http://127.0.0.1:9/mcp', 'owner_oauth', :e) RETURNING id"
                    ),
                    {"n": name, "e": enabled},
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO tool_connections (owner_id, source_id, status, account,"
                    " access_token_enc) VALUES (:o, :s, :st, 'a@example.com', '\\x00'),"
                    " (:g, :s, 'connected', 'g@example.com', '\\x00')"
                ),
                {"o": OWNER, "g": gone_owner["id"], "s": source, "st": "expired"},
            )
    return {"kept": kept["id"], "hidden": hidden["id"], "run": run["id"], "purged": purged["id"]}


# (list, who asks, document); `$run` and `$agent` are the kept agent's run and the agent.
LISTS = [
    (
        "agents",
        OWNER,
        "{ viewer { agents { id model { id } tools { id name agentsAllowed } lastRun { id } } } }",
    ),
    (
        "agents",
        ADMIN,
        "{ adminAgents { edges { node { id owner { id active } model { id }"
        " tools { id } activeRun { id } } } } }",
    ),
    (
        "runs",
        ADMIN,
        "{ adminRuns { edges { node { id agent { id name model { id } }"
        " deliveries { target { id } } pendingApproval { id } } } } }",
    ),
    (
        "runs",
        OWNER,
        "query($agent: ID!) { agent(id: $agent) { runs { edges { node { id"
        " agent { id } steps { index } } } } } }",
    ),
    (
        "steps",
        OWNER,
        "query($run: ID!) { run(id: $run) { steps { index kind approval { id"
        " tool { id name } agent { id } run { id } } } } }",
    ),
    (
        "approvals",
        OWNER,
        "{ toolApprovals { edges { node { id agent { id } tool { id name }"
        " run { id agent { id } } } } } }",
    ),
    (
        "approvals",
        ADMIN,
        "{ toolApprovals { edges { node { id agent { id owner { id } }"
        " tool { name source { id } } } } } }",
    ),
    (
        "deliveries",
        OWNER,
        "query($run: ID!) { run(id: $run) { deliveries { status target { id name enabled } } } }",
    ),
    ("alerts", ADMIN, "{ adminBudgetAlerts { id percent owner { id active } } }"),
    ("alerts", OWNER, "{ viewer { budgetAlerts { id owner { id } } } }"),
    (
        "audit entries",
        ADMIN,
        "{ adminAuditLog { edges { node { id action agentId userId actor { id } } } } }",
    ),
    (
        "connections",
        OWNER,
        "{ toolConnections { sourceId sourceName status account scopes connectedAt } }",
    ),
    ("connections", ADMIN, "{ toolSources { id name auth enabled connectedOwners } }"),
]


@pytest.mark.parametrize(("name", "who", "query"), LISTS, ids=[f"{n}-{w}" for n, w, _ in LISTS])
async def test_every_list_answers_with_a_row_whose_relations_vanished(
    api: Api, engine: AsyncEngine, factories: Factories, name: str, who: int, query: str
) -> None:
    world = await _world(api, engine, factories)
    variables = {"run": str(world["run"]), "agent": str(world["kept"])}
    response = await api.post(
        query, variables if "$" in query else None, as_user=who, admin=who == ADMIN
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body.get("data") is not None and not body.get("errors"), body
    # The hidden agent is in no list of agents, and neither are the rows that hang from it.
    shown = repr(body["data"])
    assert "'name': 'Hidden'" not in shown, body
    if name == "agents" and who == OWNER:
        (kept,) = body["data"]["viewer"]["agents"]
        assert kept["model"] is None  # the model left the list
        assert [t["name"] for t in kept["tools"]] == ["disallowed_tool"]
    if name == "steps":
        step = body["data"]["run"]["steps"][1]
        assert step["approval"]["tool"] == {"id": "0", "name": "removed_tool"}
    if name == "connections" and who == OWNER:
        # One per enabled OWNER_OAUTH source: the switched-off source's account is not listed.
        assert [(c["sourceName"], c["status"]) for c in body["data"]["toolConnections"]] == [
            ("kept_src", "EXPIRED")
        ]
    if name == "audit entries":
        agent_ids = [e["node"]["agentId"] for e in body["data"]["adminAuditLog"]["edges"]]
        assert str(world["purged"]) in agent_ids and str(world["hidden"]) in agent_ids
