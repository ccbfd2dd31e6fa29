"""MCP tool sources through the API, against a real MCP server: sync, re-sync, removal, failures,
bad input, who may do what, and the audit log."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.mcp_tickets import CREATE_SCHEMA, SEARCH_SCHEMA, TicketServer
from tests.integration.runs.support import fetch
from tests.integration.runs.transcript.support import Gql, error_code
from tests.integration.tool_sources.conftest import (
    REMOVE_SOURCE,
    SOURCES,
    TOKEN,
    TOKEN_ENV,
    UPSERT_SOURCE,
    Admin,
)
from tests.support.factories import Factories

OWNER_TOOLS = "{ tools { id name access sourceName source { id } } }"


async def test_a_registered_source_lists_its_tools_not_allowed_with_access_and_schema(
    admin: Admin, tickets: TicketServer, gql: Gql, factories: Factories
) -> None:
    source = await admin.register(tickets)

    assert source["lastError"] is None and source["lastSyncedAt"] is not None
    tools = {tool["name"]: tool for tool in source["tools"]}
    assert set(tools) == {"tickets__search_tickets", "tickets__create_ticket"}
    search, create = tools["tickets__search_tickets"], tools["tickets__create_ticket"]
    assert (search["access"], create["access"]) == ("READ", "WRITE")
    assert search["inputSchema"] == SEARCH_SCHEMA and create["inputSchema"] == CREATE_SCHEMA
    assert search["description"] == "Search the ticket system by words in the title."
    assert not search["agentsAllowed"] and not create["agentsAllowed"]
    assert search["sourceName"] == "tickets"
    # The sync spoke with the source's credential.
    assert tickets.state.lists >= 1

    # Owners: FORBIDDEN on sources; once allowed, they see the tool without its source.
    owner = (await factories.user())["id"]
    assert error_code(await gql.body(SOURCES, as_user=owner)) == "FORBIDDEN"
    assert await gql.data(OWNER_TOOLS, as_user=owner) == {"tools": []}
    await admin.allow(search["id"])
    seen = (await gql.data(OWNER_TOOLS, as_user=owner))["tools"]
    assert seen == [
        {
            "id": search["id"],
            "name": "tickets__search_tickets",
            "access": "READ",
            "sourceName": "tickets",
            "source": None,
        }
    ]
    listed = (await gql.data(SOURCES, as_user=admin.id, admin=True))["toolSources"]
    assert listed[0]["url"] == tickets.url and listed[0]["authEnv"] == TOKEN_ENV


async def test_a_resync_keeps_allowed_updates_changed_and_drops_vanished_tools(
    admin: Admin, tickets: TicketServer, engine: AsyncEngine
) -> None:
    source = await admin.register(tickets)
    tools = {tool["name"]: tool for tool in source["tools"]}
    await admin.allow(tools["tickets__search_tickets"]["id"])
    await admin.allow(tools["tickets__create_ticket"]["id"])

    tickets.state.hide_write_tool = True
    tickets.state.extra_specs = [
        {"name": "close ticket", "description": "Close one.", "inputSchema": {"type": "object"}}
    ]
    synced = await admin.sync(source["id"])

    assert synced["lastError"] is None
    after = {tool["name"]: tool for tool in synced["tools"]}
    assert set(after) == {"tickets__search_tickets", "tickets__close_ticket"}
    assert after["tickets__search_tickets"]["agentsAllowed"] is True
    assert after["tickets__search_tickets"]["id"] == tools["tickets__search_tickets"]["id"]
    assert after["tickets__close_ticket"]["agentsAllowed"] is False
    assert after["tickets__close_ticket"]["access"] == "WRITE"
    gone = await fetch(engine, "SELECT * FROM tools WHERE name = 'tickets__create_ticket'")
    assert gone == []


async def test_long_names_colliding_slugs_and_malformed_schemas_are_left_out_and_named(
    admin: Admin, tickets: TicketServer
) -> None:
    long_name = "x" * 60
    tickets.state.extra_specs = [
        {"name": long_name, "inputSchema": {"type": "object"}},
        {"name": "a.b", "inputSchema": {"type": "object"}},
        {"name": "a:b", "inputSchema": {"type": "object"}},
        {"name": "broken", "inputSchema": {"type": "object", "properties": {"q": {"type": 7}}}},
    ]
    source = await admin.register(tickets)

    names = {tool["name"] for tool in source["tools"]}
    assert names == {"tickets__search_tickets", "tickets__create_ticket"}
    error = source["lastError"]
    assert long_name in error and "64 characters" in error
    assert "'a.b' and 'a:b'" in error and "tickets__a_b" in error
    assert "'broken'" in error and "inputSchema" in error


async def test_an_unreachable_server_is_saved_with_last_error_and_keeps_its_tools(
    admin: Admin, tickets: TicketServer
) -> None:
    source = await admin.register(tickets)
    assert len(source["tools"]) == 2
    tickets.stop()

    synced = await admin.sync(source["id"])

    assert synced["lastError"].startswith("sync failed: could not reach the server")
    assert len(synced["tools"]) == 2
    fresh = await admin.upsert(name="elsewhere", url="http://127.0.0.1:9/mcp")
    assert fresh["id"] and fresh["tools"] == [] and "could not reach" in fresh["lastError"]


async def test_too_many_tools_fail_the_sync_and_keep_the_catalog(
    admin: Admin, tickets: TicketServer
) -> None:
    source = await admin.register(tickets)
    tickets.state.extra_tools = 10_000

    synced = await admin.sync(source["id"])

    assert "more than 500 tools" in synced["lastError"]
    assert len(synced["tools"]) == 2


async def test_many_pages_are_all_listed(admin: Admin, tickets: TicketServer) -> None:
    tickets.state.extra_tools = 120
    tickets.state.page_size = 25
    source = await admin.register(tickets)
    assert len(source["tools"]) == 122 and source["lastError"] is None


async def test_removing_a_source_takes_its_tools_and_is_audited(
    admin: Admin, tickets: TicketServer, gql: Gql, engine: AsyncEngine
) -> None:
    source = await admin.register(tickets)
    removed = await gql.data(REMOVE_SOURCE, {"id": source["id"]}, as_user=admin.id, admin=True)
    assert removed == {"removeToolSource": source["id"]}
    assert await fetch(engine, "SELECT * FROM tools WHERE source_id IS NOT NULL") == []
    actions = [
        row["action"] for row in await fetch(engine, "SELECT action FROM audit_log ORDER BY id")
    ]
    assert actions == ["tool_source.upserted", "tool_source.removed"]
    again = await gql.body(REMOVE_SOURCE, {"id": source["id"]}, as_user=admin.id, admin=True)
    assert error_code(again) == "NOT_FOUND"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Tickets"}, "input.name"),
        ({"name": "1tickets"}, "input.name"),
        ({"name": "t" * 33}, "input.name"),
        ({"url": "http://tickets.example.com/mcp"}, "input.url"),
        ({"url": "https://user:pw@tickets.example.com/mcp"}, "input.url"),
        ({"url": "ftp://tickets.example.com/"}, "input.url"),
        ({"authEnv": "AGENT_ENGINE_JWT_SECRET"}, "input.authEnv"),
        ({"authEnv": "DATABASE_URL"}, "input.authEnv"),
        ({"authEnv": "not a name"}, "input.authEnv"),
    ],
)
async def test_bad_source_input_names_the_field_and_writes_nothing(
    gql: Gql, admin: Admin, engine: AsyncEngine, change: dict[str, str], field: str
) -> None:
    good = {"name": "tickets", "url": "https://tickets.example.com/mcp", "authEnv": TOKEN_ENV}
    body = await gql.body(
        UPSERT_SOURCE, {"input": {**good, **change}}, as_user=admin.id, admin=True
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == field
    assert await fetch(engine, "SELECT * FROM tool_sources") == []


async def test_a_delivery_signing_variable_cannot_be_a_credential(gql: Gql, admin: Admin) -> None:
    target = {"name": "Ops", "url": "https://hooks.example.com/", "secretEnv": "OPS_HOOK_SECRET"}
    await gql.data(
        "mutation($input: DeliveryTargetInput!) { upsertDeliveryTarget(input: $input) { id } }",
        {"input": target},
        as_user=admin.id,
        admin=True,
    )
    source = {"name": "t", "url": "https://t.example.com/mcp", "authEnv": "OPS_HOOK_SECRET"}
    body = await gql.body(UPSERT_SOURCE, {"input": source}, as_user=admin.id, admin=True)
    assert body["errors"][0]["extensions"]["field"] == "input.authEnv"


async def test_source_names_are_unique(admin: Admin, tickets: TicketServer, gql: Gql) -> None:
    await admin.register(tickets)
    again = {"name": "tickets", "url": tickets.url}
    body = await gql.body(UPSERT_SOURCE, {"input": again}, as_user=admin.id, admin=True)
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.name"


async def test_owners_may_not_register_sync_or_remove(
    gql: Gql, factories: Factories, tickets: TicketServer
) -> None:
    owner = (await factories.user())["id"]
    body = await gql.body(
        UPSERT_SOURCE, {"input": {"name": "t", "url": tickets.url}}, as_user=owner
    )
    assert error_code(body) == "FORBIDDEN"
    assert error_code(await gql.body(REMOVE_SOURCE, {"id": "1"}, as_user=owner)) == "FORBIDDEN"
    assert tickets.state.lists == 0


async def test_the_sync_sends_the_bearer_credential(admin: Admin, tickets: TicketServer) -> None:
    await admin.register(tickets)
    assert tickets.state.list_authorizations
    assert set(tickets.state.list_authorizations) == {f"Bearer {TOKEN}"}


async def test_a_delivery_target_cannot_sign_with_a_sources_credential(
    gql: Gql, admin: Admin, tickets: TicketServer
) -> None:
    await admin.register(tickets)  # authEnv = TOKEN_ENV
    target = {"name": "Ops", "url": "https://hooks.example.com/", "secretEnv": TOKEN_ENV}
    body = await gql.body(
        "mutation($input: DeliveryTargetInput!) { upsertDeliveryTarget(input: $input) { id } }",
        {"input": target},
        as_user=admin.id,
        admin=True,
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.secretEnv"


async def test_a_source_written_in_sql_with_an_engine_setting_sends_nothing(
    gql: Gql, admin: Admin, engine: AsyncEngine, tickets: TicketServer
) -> None:
    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO tool_sources (name, url, auth_env, enabled)"
            f" VALUES ('leaky', '{tickets.url}', 'AGENT_ENGINE_JWT_SECRET', true)"
        )
    (source,) = await fetch(engine, "SELECT id FROM tool_sources")
    body = await gql.data(
        "mutation($id: ID!) { syncToolSource(id: $id) { lastError tools { name } } }",
        {"id": str(source["id"])},
        as_user=admin.id,
        admin=True,
    )
    synced = body["syncToolSource"]
    assert "authEnv" in synced["lastError"] and synced["tools"] == []
    assert tickets.state.list_authorizations == []  # the server heard nothing


async def test_syncing_or_removing_a_source_that_does_not_exist_is_not_found(
    gql: Gql, admin: Admin
) -> None:
    for mutation in ("syncToolSource(id: $id) { id }", "removeToolSource(id: $id)"):
        body = await gql.body(
            f"mutation($id: ID!) {{ {mutation} }}", {"id": "987654"}, as_user=admin.id, admin=True
        )
        assert error_code(body) == "NOT_FOUND", body
