"""Delivery targets through the API: the admin's list, the owner's choice, who sees what, and bad
input refused with the field named and nothing written."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.runs.support import fetch
from tests.integration.runs.transcript.support import Gql, error_code
from tests.support.factories import Factories

UPSERT = """
mutation($input: DeliveryTargetInput!) {
  upsertDeliveryTarget(input: $input) { id name url secretEnv enabled }
}
"""
REMOVE = "mutation($id: ID!) { removeDeliveryTarget(id: $id) }"
LIST = "{ deliveryTargets { id name url secretEnv enabled } }"
ATTACH = """
mutation($agent: ID!, $targets: [ID!]!) {
  setAgentDeliveryTargets(agentId: $agent, targetIds: $targets) {
    deliveryTargets { id name url secretEnv }
  }
}
"""
GOOD = {"name": "Ops", "url": "https://hooks.example.com/ae", "secretEnv": "OPS_HOOK_SECRET"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"url": "http://hooks.example.com/ae"}, "input.url"),
        ({"url": "https://user:secret@hooks.example.com/"}, "input.url"),
        ({"url": "ftp://hooks.example.com/"}, "input.url"),
        ({"url": "not a url"}, "input.url"),
        ({"secretEnv": "whsec_AAAA"}, "input.secretEnv"),
        ({"secretEnv": "OPS-SECRET"}, "input.secretEnv"),
        ({"name": " "}, "input.name"),
    ],
)
async def test_bad_target_input_names_the_field_and_writes_nothing(
    gql: Gql,
    engine: AsyncEngine,
    factories: Factories,
    change: dict[str, str],
    field: str,
) -> None:
    admin = (await factories.user())["id"]
    body = await gql.body(UPSERT, {"input": {**GOOD, **change}}, as_user=admin, admin=True)
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == field
    assert await fetch(engine, "SELECT * FROM delivery_targets") == []


async def test_admins_manage_targets_and_owners_see_only_enabled_ones_without_secrets(
    gql: Gql,
    factories: Factories,
) -> None:
    admin = (await factories.user())["id"]
    owner = (await factories.user())["id"]
    ops = (await gql.data(UPSERT, {"input": GOOD}, as_user=admin, admin=True))[
        "upsertDeliveryTarget"
    ]
    assert ops["url"] == GOOD["url"] and ops["secretEnv"] == GOOD["secretEnv"]
    local = {"name": "Local", "url": "http://127.0.0.1:9000/", "secretEnv": "LOCAL_SECRET"}
    off = (
        await gql.data(UPSERT, {"input": {**local, "enabled": False}}, as_user=admin, admin=True)
    )["upsertDeliveryTarget"]

    assert (await gql.body(UPSERT, {"input": GOOD}, as_user=owner))["errors"][0]["extensions"][
        "code"
    ] == "FORBIDDEN"
    seen = (await gql.data(LIST, as_user=owner))["deliveryTargets"]
    assert seen == [
        {"id": ops["id"], "name": "Ops", "url": None, "secretEnv": None, "enabled": True}
    ]
    assert len((await gql.data(LIST, as_user=admin, admin=True))["deliveryTargets"]) == 2

    renamed = await gql.data(
        UPSERT, {"input": {**GOOD, "id": ops["id"], "name": "Ops v2"}}, as_user=admin, admin=True
    )
    assert renamed["upsertDeliveryTarget"]["name"] == "Ops v2"
    missing = await gql.body(UPSERT, {"input": {**GOOD, "id": "999999"}}, as_user=admin, admin=True)
    assert error_code(missing) == "NOT_FOUND"

    assert (await gql.data(REMOVE, {"id": off["id"]}, as_user=admin, admin=True)) == {
        "removeDeliveryTarget": off["id"]
    }
    assert error_code(await gql.body(REMOVE, {"id": off["id"]}, as_user=admin, admin=True)) == (
        "NOT_FOUND"
    )


async def test_only_the_owner_attaches_enabled_targets_to_an_agent(
    gql: Gql,
    engine: AsyncEngine,
    factories: Factories,
) -> None:
    admin = (await factories.user())["id"]
    agent = await factories.agent()
    owner = int(agent["user_id"])
    stranger = (await factories.user())["id"]
    ops = (await gql.data(UPSERT, {"input": GOOD}, as_user=admin, admin=True))[
        "upsertDeliveryTarget"
    ]
    off = (
        await gql.data(
            UPSERT, {"input": {**GOOD, "name": "Off", "enabled": False}}, as_user=admin, admin=True
        )
    )["upsertDeliveryTarget"]
    args = {"agent": str(agent["id"]), "targets": [ops["id"]]}

    attached = await gql.data(ATTACH, args, as_user=owner)
    assert attached["setAgentDeliveryTargets"]["deliveryTargets"] == [
        {"id": ops["id"], "name": "Ops", "url": None, "secretEnv": None}
    ]
    assert error_code(await gql.body(ATTACH, args, as_user=admin, admin=True)) == "FORBIDDEN"
    assert error_code(await gql.body(ATTACH, args, as_user=stranger)) == "NOT_FOUND"
    refused = await gql.body(
        ATTACH, {"agent": str(agent["id"]), "targets": [off["id"]]}, as_user=owner
    )
    assert error_code(refused) == "BAD_USER_INPUT"
    assert refused["errors"][0]["extensions"]["field"] == "targetIds"
    # The refused replacement left the selection as it was.
    links = await fetch(engine, "SELECT target_id FROM agent_delivery_targets")
    assert [int(r["target_id"]) for r in links] == [int(ops["id"])]

    # Removing the target takes it out of the agent's selection.
    await gql.data(REMOVE, {"id": ops["id"]}, as_user=admin, admin=True)
    assert await fetch(engine, "SELECT * FROM agent_delivery_targets") == []
