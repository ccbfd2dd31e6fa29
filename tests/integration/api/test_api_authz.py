"""The authorisation matrix, over a real Uvicorn socket: anonymous, owner, other owner and admin
against every query and mutation of the contract.

Documented choices: someone else's agent/run is NOT_FOUND to an owner; an admin sees every agent
and oversees it -- pauses and deletes -- but does not act as the owner: editing, starting,
choosing tools and the owner's switch are FORBIDDEN to an admin on another's agent.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.api.support import Api, codes
from tests.support.factories import Factories

OWNER_ID = 101
OTHER_ID = 202
ADMIN_ID = 303

OK = "ok"


@dataclass
class World:
    agent: dict[str, Any]
    run: dict[str, Any]
    model: dict[str, Any]
    tool: dict[str, Any]
    victim: dict[str, Any]  # a user for deactivateOwner


async def make_world(factories: Factories) -> World:
    model = await factories.model(name=f"m{id(object())}")
    agent = await factories.agent(user_id=OWNER_ID, model_id=model["id"])
    run = await factories.run(
        agent_id=agent["id"], state="succeeded", tokens_used=5, finished_at=None
    )
    tool = await factories.tool(f"tool_{agent['id']}")
    victim = await factories.user()
    return World(agent=agent, run=run, model=model, tool=tool, victim=victim)


# name → (document, variables(world)); `viewer` etc. need no object.
OPERATIONS: dict[str, tuple[str, Any]] = {
    "viewer": ("{ viewer { user { id } isAdmin agents { id } budget { usedTokens } } }", None),
    "agent": ("query($id: ID!) { agent(id: $id) { id name } }", lambda w: {"id": w.agent["id"]}),
    "run": ("query($id: ID!) { run(id: $id) { id state } }", lambda w: {"id": w.run["id"]}),
    "agentModels": ("{ agentModels { id name } }", None),
    "tools": ("{ tools { id name } }", None),
    "adminAgents": ("{ adminAgents { edges { node { id } } } }", None),
    "adminRuns": ("{ adminRuns { edges { node { id } } } }", None),
    "adminTools": ("{ adminTools { id } }", None),
    "platformSettings": ("{ platformSettings { timezone } }", None),
    "adminAuditLog": ("{ adminAuditLog { edges { node { id action } } } }", None),
    "createAgent": (
        'mutation { createAgent(input: {name: "n", prompt: "p"}) { id } }',
        None,
    ),
    "updateAgent": (
        'mutation($id: ID!) { updateAgent(id: $id, input: {name: "renamed"}) { id name } }',
        lambda w: {"id": w.agent["id"]},
    ),
    "deleteAgent": (
        "mutation($id: ID!) { deleteAgent(id: $id) }",
        lambda w: {"id": w.agent["id"]},
    ),
    "setAgentEnabled": (
        "mutation($id: ID!) { setAgentEnabled(id: $id, enabled: false) { enabled } }",
        lambda w: {"id": w.agent["id"]},
    ),
    "setAgentTools": (
        "mutation($a: ID!, $t: ID!) { setAgentTools(agentId: $a, toolIds: [$t]) { id } }",
        lambda w: {"a": w.agent["id"], "t": w.tool["id"]},
    ),
    "attachTool": (
        "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }",
        lambda w: {"a": w.agent["id"], "t": w.tool["id"]},
    ),
    "detachTool": (
        "mutation($a: ID!, $t: ID!) { detachTool(agentId: $a, toolId: $t) { id } }",
        lambda w: {"a": w.agent["id"], "t": w.tool["id"]},
    ),
    "startRun": (
        "mutation($a: ID!) { startRun(agentId: $a) { id state } }",
        lambda w: {"a": w.agent["id"]},
    ),
    "setAdminPaused": (
        "mutation($a: ID!) { setAdminPaused(agentId: $a, paused: true) { adminPaused } }",
        lambda w: {"a": w.agent["id"]},
    ),
    "deactivateOwner": (
        "mutation($u: ID!) { deactivateOwner(userId: $u) }",
        lambda w: {"u": w.victim["id"]},
    ),
    "reactivateOwner": (
        "mutation($u: ID!) { reactivateOwner(userId: $u) { id active } }",
        lambda w: {"u": w.victim["id"]},
    ),
    "upsertAgentModel": (
        'mutation { upsertAgentModel(input: {name: "x", provider: "builtin", model: "b"}) { id } }',
        None,
    ),
    "removeAgentModel": (
        "mutation($id: ID!) { removeAgentModel(id: $id) }",
        lambda w: {"id": w.model["id"]},
    ),
    "setToolAllowed": (
        "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: false) { id } }",
        lambda w: {"t": w.tool["id"]},
    ),
    "updatePlatformSettings": (
        'mutation { updatePlatformSettings(input: {platformPrompt: "be brief"}) { timezone } }',
        None,
    ),
}

ADMIN_ONLY = {
    "adminAgents",
    "adminRuns",
    "adminTools",
    "platformSettings",
    "adminAuditLog",
    "setAdminPaused",
    "deactivateOwner",
    "reactivateOwner",
    "upsertAgentModel",
    "removeAgentModel",
    "setToolAllowed",
    "updatePlatformSettings",
}
OWNER_ONLY_ON_AGENT = {
    "updateAgent",
    "deleteAgent",
    "setAgentEnabled",
    "setAgentTools",
    "attachTool",
    "detachTool",
    "startRun",
}
READS_OF_OWNED = {"agent", "run"}
# What an admin may not do on another's agent: act as its owner.
OWNER_ACTS = {
    "updateAgent",
    "setAgentEnabled",
    "setAgentTools",
    "attachTool",
    "detachTool",
    "startRun",
}


def expected(role: str, operation: str) -> str:
    if role == "anonymous":
        return "UNAUTHENTICATED"
    if operation in ADMIN_ONLY:
        return OK if role == "admin" else "FORBIDDEN"
    if role == "owner":
        return OK
    if role == "other":
        return "NOT_FOUND" if operation in READS_OF_OWNED | OWNER_ONLY_ON_AGENT else OK
    # admin on the owner's agent: oversight (reads, pause, delete), never the owner's acts
    return "FORBIDDEN" if operation in OWNER_ACTS else OK


ROLE_USERS = {"owner": OWNER_ID, "other": OTHER_ID, "admin": ADMIN_ID}


@pytest.mark.parametrize("role", ["anonymous", "owner", "other", "admin"])
async def test_authorisation_matrix(api: Api, factories: Factories, role: str) -> None:
    await factories.user(id=OWNER_ID)
    await factories.user(id=OTHER_ID)
    await factories.user(id=ADMIN_ID)
    token = None
    if role != "anonymous":
        token = api.token(ROLE_USERS[role], admin=role == "admin")
    mismatches = []
    for operation, (document, variables) in OPERATIONS.items():
        world = await make_world(factories)
        values = {k: str(v) for k, v in variables(world).items()} if variables else None
        body = await api.body(document, values, token=token)
        got = OK if not body.get("errors") else ",".join(str(c) for c in codes(body))
        want = expected(role, operation)
        if got != want:
            mismatches.append((operation, want, got, body.get("errors")))
        if want == OK:
            assert body["data"] is not None
    assert not mismatches, mismatches


async def test_anonymous_error_says_how_to_authenticate(api: Api) -> None:
    body = await api.body("{ viewer { isAdmin } }")
    assert codes(body) == ["UNAUTHENTICATED"]
    assert "Bearer" in body["errors"][0]["message"]


async def test_a_burst_of_first_requests_of_a_new_user_is_all_served(api: Api) -> None:
    # More first sights at once than the api's pool has connections: each reads, gives its
    # connection back, then writes -- none waits for a writer while holding its reader.
    token = api.token(515_151, name="Burst")
    requests = 3 * 2 * api.settings.db_pool_size
    bodies = await asyncio.gather(
        *(api.body("{ viewer { user { id displayName } } }", token=token) for _ in range(requests))
    )
    assert [b.get("errors") for b in bodies] == [None] * requests
    assert {b["data"]["viewer"]["user"]["displayName"] for b in bodies} == {"Burst"}
