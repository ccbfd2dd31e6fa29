"""OWNER_OAUTH sources against a real authorization server and MCP resource server (the `mcp`
SDK's server-side auth, as processes): the whole connect flow as a browser does it, every refusal
of the callback, tokens at rest, refresh once under concurrency, key rotation, disconnect and
deactivation revoking at the server."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.demo.seed import DEMO_OWNER_ID, seed_demo
from agent_engine.embedded import embedded_pg_binary
from agent_engine.oauth.access import NotConnected, owner_access_token
from agent_engine.oauth.keys import ENV as KEYS_ENV
from agent_engine.oauth.keys import TokenKeys, Undecryptable, new_key
from agent_engine.oauth.rotate import rotate_token_keys
from agent_engine.oauth.store import refresh_purpose
from agent_engine.runs.claim import utc_now
from agent_engine.settings import Settings, to_libpq_url
from agent_engine.testing.oauth_servers import AuthorizationServer, ResourceServer
from tests.integration.api.subscriptions.support import Server
from tests.integration.runs.support import fetch
from tests.integration.runs.transcript.support import Gql, error_code
from tests.integration.tool_sources.conftest import Admin
from tests.integration.tool_sources.oauth_support import (
    OAUTH_SOURCE,
    OAuthServers,
    connect_start,
    connected,
    connections,
    oauth_servers,
    sign_in,
)
from tests.support.factories import Factories

DEMO_AGENT = "{ viewer { agents { id name tools { name } } } }"
KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.b64encode(b"B" * 32).decode()


@pytest.fixture
def oauth() -> Iterator[OAuthServers]:
    with oauth_servers() as servers:
        yield servers


@pytest.fixture
def engine_url(settings: Settings, server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """The api knows its address and has token keys (the workers' environment too)."""
    settings.public_url = server.url
    settings.token_keys = KEY_A
    monkeypatch.setenv(KEYS_ENV, KEY_A)
    return server.url


@pytest.fixture
async def source(admin: Admin, oauth: OAuthServers, engine_url: str) -> dict[str, Any]:
    data = await admin.gql.data(
        OAUTH_SOURCE,
        {"input": {"name": "tickets", "url": oauth.resource, "auth": "OWNER_OAUTH"}},
        as_user=admin.id,
        admin=True,
    )
    found: dict[str, Any] = data["upsertToolSource"]
    return found


async def _audit(engine: AsyncEngine, action: str) -> list[dict[str, Any]]:
    return await fetch(engine, "SELECT * FROM audit_log WHERE action = :a ORDER BY id", a=action)


async def _connection_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await fetch(engine, "SELECT * FROM tool_connections ORDER BY id")


async def _call_as(token: str, url: str, title: str) -> None:
    """A tools/call with `token` straight through the `mcp` SDK's client."""
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=10)
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("create_ticket", {"title": title})
        assert not result.isError


# --- the flow -----------------------------------------------------------------------------------


async def test_an_owner_connects_as_a_browser_would_and_calls_carry_their_own_account(
    source: dict[str, Any],
    oauth: OAuthServers,
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    admin: Admin,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    assert source["auth"] == "OWNER_OAUTH" and source["authEnv"] is None
    alice = (await factories.user())["id"]
    bob = (await factories.user())["id"]
    before = await connections(gql, alice)
    assert [(c["sourceName"], c["status"], c["account"]) for c in before] == [
        ("tickets", "NOT_CONNECTED", None)
    ]

    page = await connected(gql, source["id"], alice, "alice@corp.example")
    assert page.status_code == 200
    assert "Connected — you can close this tab" in page.text
    assert "alice@corp.example" in page.text
    await connected(gql, source["id"], bob, "bob@corp.example")

    mine = (await connections(gql, alice))[0]
    assert mine["status"] == "CONNECTED" and mine["account"] == "alice@corp.example"
    assert set(mine["scopes"]) == {"tickets:read", "tickets:write"}
    assert mine["connectedAt"] is not None
    assert (await connections(gql, bob))[0]["account"] == "bob@corp.example"

    # Each owner's token is their own account at the server.
    token_a = await owner_access_token(engine, owner_id=alice, source_id=int(source["id"]))
    token_b = await owner_access_token(engine, owner_id=bob, source_id=int(source["id"]))
    assert token_a.account == "alice@corp.example"
    await _call_as(token_a.access_token, oauth.resource, "from alice")
    await _call_as(token_b.access_token, oauth.resource, "from bob")
    calls = oauth.resource_state()["calls"]
    assert [(c["arguments"]["title"], c["subject"]) for c in calls] == [
        ("from alice", "alice@corp.example"),
        ("from bob", "bob@corp.example"),
    ]
    assert (await connections(gql, alice))[0]["lastUsedAt"] is not None

    # The server refuses a call without a token, or with a token for another audience.
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises its transport's error
        await _call_as("", oauth.resource, "anonymous")
    other = oauth.resource.replace("/mcp", "/other")
    async with httpx.AsyncClient() as http:
        response = await http.post(
            oauth.resource,
            headers={"Authorization": "Bearer not-a-token", "Accept": "application/json"},
            json={},
        )
    assert response.status_code == 401 and other
    assert len(oauth.resource_state()["calls"]) == 2

    # The admin sees how many are connected, never whose account or token.
    listed = await admin.gql.data(
        "{ toolSources { name auth connectedOwners } }", as_user=admin.id, admin=True
    )
    assert listed["toolSources"] == [
        {"name": "tickets", "auth": "OWNER_OAUTH", "connectedOwners": 2}
    ]
    assert [c["status"] for c in await connections(gql, admin.id)] == ["NOT_CONNECTED"]

    created = await _audit(engine, "connection.created")
    assert [(e["user_id"], e["details"]["account"]) for e in created] == [
        (alice, "alice@corp.example"),
        (bob, "bob@corp.example"),
    ]
    assert token_a.access_token not in str(created)
    # No token in any log line of the api, the flow or the servers' clients.
    rows = await _connection_rows(engine)
    keys = TokenKeys.parse(KEY_A)
    refresh_a = keys.decrypt(
        rows[0]["refresh_token_enc"], refresh_purpose(alice, int(source["id"]))
    )
    logged = caplog.text
    assert caplog.records  # the flow did log
    for secret in (token_a.access_token, token_b.access_token, refresh_a):
        assert secret not in logged


# --- the callback's refusals --------------------------------------------------------------------


def _with_query(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


async def _callback_url(gql: Gql, source_id: str, user: int, account: str) -> str:
    redirect = await sign_in(
        await connect_start(gql, source_id, user), account, stop_at_callback=True
    )
    location: str = redirect.headers["location"]
    return location


async def _open(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as browser:
        return await browser.get(url)


async def test_every_bad_callback_is_a_clear_page_and_connects_nobody(
    source: dict[str, Any],
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    engine_url: str,
    oauth: OAuthServers,
) -> None:
    alice = (await factories.user())["id"]
    bob = (await factories.user())["id"]
    sid = source["id"]

    # No state at all.
    callback = await _callback_url(gql, sid, alice, "alice")
    page = await _open(_with_query(callback, state=None))
    assert page.status_code == 400 and "has no state" in page.text
    # A state the engine never issued.
    page = await _open(_with_query(callback, state="forged"))
    assert page.status_code == 400 and "does not belong to any connection" in page.text

    # The owner declines at the authorization server.
    page = await sign_in(await connect_start(gql, sid, alice), "alice", deny=True)
    assert page.status_code == 400 and "You declined" in page.text

    # Another authorization server's answer (iss, RFC 9207).
    callback = await _callback_url(gql, sid, alice, "alice")
    page = await _open(_with_query(callback, iss="https://evil.example"))
    assert page.status_code == 400 and "another authorization server" in page.text

    # An answer without iss from a server whose metadata says it always sends it.
    oauth.configure(omit_iss=True)
    page = await sign_in(await connect_start(gql, sid, alice), "alice")
    assert page.status_code == 400 and "does not name its authorization server" in page.text
    oauth.configure(omit_iss=False)

    # Another owner's state with one's own code: PKCE binds the code to its own request.
    alice_callback = await _callback_url(gql, sid, alice, "alice")
    bob_callback = await _callback_url(gql, sid, bob, "bob")
    bob_code = parse_qs(urlsplit(bob_callback).query)["code"][0]
    page = await _open(_with_query(alice_callback, code=bob_code))
    assert page.status_code == 400 and "refused the code" in page.text

    # An expired state.
    callback = await _callback_url(gql, sid, alice, "alice")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE oauth_states SET expires_at = now() - interval '1 s'"))
    page = await _open(callback)
    assert page.status_code == 400 and "expired" in page.text

    assert await _connection_rows(engine) == []
    assert [c["status"] for c in await connections(gql, alice)] == ["NOT_CONNECTED"]
    assert [c["status"] for c in await connections(gql, bob)] == ["NOT_CONNECTED"]

    # A used link, and a code replayed under a fresh state.
    callback = await _callback_url(gql, sid, alice, "alice")
    assert (await _open(callback)).status_code == 200
    page = await _open(callback)
    assert page.status_code == 400 and "already used" in page.text
    used_code = parse_qs(urlsplit(callback).query)["code"][0]
    fresh = await _callback_url(gql, sid, alice, "alice")
    page = await _open(_with_query(fresh, code=used_code))
    assert page.status_code == 400 and "refused the code" in page.text
    # Nothing but the one good connection; no page carried a code or a state.
    rows = await _connection_rows(engine)
    assert [(r["owner_id"], r["account"]) for r in rows] == [(alice, "alice")]
    assert used_code not in page.text


async def test_bad_input_on_sources_and_connections(
    source: dict[str, Any],
    admin: Admin,
    gql: Gql,
    factories: Factories,
    settings: Settings,
    oauth: OAuthServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = (await factories.user())["id"]
    body = await admin.gql.body(
        OAUTH_SOURCE,
        {
            "input": {
                "name": "both",
                "url": oauth.resource,
                "auth": "OWNER_OAUTH",
                "authEnv": "TICKETS_TOKEN",
            }
        },
        as_user=admin.id,
        admin=True,
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.authEnv"
    body = await admin.gql.body(
        OAUTH_SOURCE,
        {
            "input": {
                "name": "secret",
                "url": oauth.resource,
                "auth": "OWNER_OAUTH",
                "oauthClientIdEnv": "AGENT_ENGINE_JWT_SECRET",
            }
        },
        as_user=admin.id,
        admin=True,
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.oauthClientIdEnv"

    monkeypatch.setenv("SHARED_TOKEN", "x")
    shared = await admin.gql.data(
        OAUTH_SOURCE,
        {"input": {"name": "shared", "url": oauth.resource, "authEnv": "SHARED_TOKEN"}},
        as_user=admin.id,
        admin=True,
    )
    assert shared["upsertToolSource"]["auth"] == "SHARED"
    body = await gql.body(
        "mutation($id: ID!) { connectToolSource(sourceId: $id) { authorizationUrl } }",
        {"id": shared["upsertToolSource"]["id"]},
        as_user=owner,
    )
    assert error_code(body) == "BAD_USER_INPUT" and "SHARED" in body["errors"][0]["message"]

    await admin.gql.data(
        OAUTH_SOURCE,
        {
            "input": {
                "id": source["id"],
                "name": "tickets",
                "url": oauth.resource,
                "auth": "OWNER_OAUTH",
                "enabled": False,
            }
        },
        as_user=admin.id,
        admin=True,
    )
    body = await gql.body(
        "mutation($id: ID!) { connectToolSource(sourceId: $id) { authorizationUrl } }",
        {"id": source["id"]},
        as_user=owner,
    )
    assert error_code(body) == "BAD_USER_INPUT" and "disabled" in body["errors"][0]["message"]
    assert await connections(gql, owner) == []  # a disabled source is not listed

    await admin.gql.data(
        OAUTH_SOURCE,
        {
            "input": {
                "id": source["id"],
                "name": "tickets",
                "url": oauth.resource,
                "auth": "OWNER_OAUTH",
            }
        },
        as_user=admin.id,
        admin=True,
    )
    settings.token_keys = None
    body = await gql.body(
        "mutation($id: ID!) { connectToolSource(sourceId: $id) { authorizationUrl } }",
        {"id": source["id"]},
        as_user=owner,
    )
    assert "AGENT_ENGINE_TOKEN_KEYS" in body["errors"][0]["message"]
    async with httpx.AsyncClient() as http:
        ready = (await http.get(f"{settings.public_url}/readyz")).json()
    assert "AGENT_ENGINE_TOKEN_KEYS" in ready["tokenKeys"]


# --- tokens -------------------------------------------------------------------------------------


async def test_twenty_callers_at_expiry_refresh_once(
    source: dict[str, Any], oauth: OAuthServers, gql: Gql, factories: Factories, engine: AsyncEngine
) -> None:
    owner = (await factories.user())["id"]
    await connected(gql, source["id"], owner, "alice")
    first = await owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE tool_connections SET expires_at = now()"))
    oauth.configure(slow_seconds=0.3)

    tokens = await asyncio.gather(
        *(
            owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))
            for _ in range(20)
        )
    )

    assert oauth.state()["refreshes"] == 1
    assert len({t.access_token for t in tokens}) == 1
    assert tokens[0].access_token != first.access_token
    await _call_as(tokens[0].access_token, oauth.resource, "after refresh")
    assert oauth.resource_state()["calls"][-1]["subject"] == "alice"


async def test_a_refused_refresh_expires_the_connection(
    source: dict[str, Any], oauth: OAuthServers, gql: Gql, factories: Factories, engine: AsyncEngine
) -> None:
    owner = (await factories.user())["id"]
    await connected(gql, source["id"], owner, "alice")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE tool_connections SET expires_at = now()"))
    oauth.configure(refuse_refresh=True)

    with pytest.raises(NotConnected) as refused:
        await owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))
    assert refused.value.source_name == "tickets"
    assert [c["status"] for c in await connections(gql, owner)] == ["EXPIRED"]
    expired = await _audit(engine, "connection.expired")
    assert [e["user_id"] for e in expired] == [owner]
    with pytest.raises(NotConnected):
        await owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))


async def test_rotating_the_keys_keeps_connections_working(
    source: dict[str, Any],
    oauth: OAuthServers,
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    settings: Settings,
) -> None:
    owner = (await factories.user())["id"]
    await connected(gql, source["id"], owner, "alice")
    before = await owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))

    # The command an operator runs, with the new key first.
    assert settings.database_url is not None
    env = {
        **os.environ,
        "DATABASE_URL": to_libpq_url(settings.database_url),
        KEYS_ENV: f"{KEY_B},{KEY_A}",
    }
    command = [sys.executable, "-m", "agent_engine.cli", "rotate-token-keys"]
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, check=True
    )
    assert "1 connection(s), 1 client secret(s)" in done.stdout
    # Again: idempotent. With a key list that cannot decrypt: nothing changes, exit 1.
    again = await rotate_token_keys(engine, TokenKeys.parse(f"{KEY_B},{KEY_A}"))
    assert again.connections == 1
    with pytest.raises(Undecryptable):
        await rotate_token_keys(engine, TokenKeys.parse(new_key()))
    only_new = TokenKeys.parse(KEY_B)
    after = await owner_access_token(
        engine, owner_id=owner, source_id=int(source["id"]), keys=only_new
    )
    assert after.access_token == before.access_token
    with pytest.raises(NotConnected):
        await owner_access_token(
            engine, owner_id=owner, source_id=int(source["id"]), keys=TokenKeys.parse(KEY_A)
        )
    # A refresh with the new key alone works too (the client secret was re-encrypted).
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE tool_connections SET expires_at = now()"))
    refreshed = await owner_access_token(
        engine, owner_id=owner, source_id=int(source["id"]), keys=only_new
    )
    assert refreshed.access_token != before.access_token
    assert oauth.state()["refreshes"] == 1


async def test_a_database_dump_holds_no_token(
    source: dict[str, Any],
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    settings: Settings,
) -> None:
    owner = (await factories.user())["id"]
    await connected(gql, source["id"], owner, "alice")
    token = await owner_access_token(engine, owner_id=owner, source_id=int(source["id"]))
    row = (await _connection_rows(engine))[0]
    refresh = TokenKeys.parse(KEY_A).decrypt(
        row["refresh_token_enc"], refresh_purpose(owner, int(source["id"]))
    )
    pg_dump = _pg_dump()
    assert settings.database_url is not None
    completed = await asyncio.to_thread(
        subprocess.run,
        [pg_dump, "--no-owner", "--dbname", to_libpq_url(settings.database_url)],
        capture_output=True,
        check=True,
    )
    dump = completed.stdout
    assert b"tool_connections" in dump and b"alice" in dump
    for secret in (token.access_token, refresh, token.access_token.split(".")[1]):
        assert secret.encode() not in dump


def _pg_dump() -> str:
    embedded = embedded_pg_binary("pg_dump")
    found = str(embedded) if embedded is not None else shutil.which("pg_dump")
    if found is None:
        pytest.fail("no pg_dump binary (embedded PostgreSQL or the system's)")
    return found


# --- disconnecting ------------------------------------------------------------------------------


async def test_disconnect_and_deactivation_revoke_at_the_server_and_forget(
    source: dict[str, Any],
    oauth: OAuthServers,
    admin: Admin,
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
) -> None:
    alice = (await factories.user())["id"]
    bob = (await factories.user())["id"]
    await connected(gql, source["id"], alice, "alice")
    await connected(gql, source["id"], bob, "bob")
    assert oauth.state()["liveRefreshTokens"] == 2

    left = await gql.data(
        "mutation($id: ID!) { disconnectToolSource(sourceId: $id) { status account } }",
        {"id": source["id"]},
        as_user=alice,
    )
    assert left["disconnectToolSource"] == {"status": "NOT_CONNECTED", "account": None}
    assert oauth.state()["revocations"] == 2  # the refresh token and the access token
    assert oauth.state()["liveRefreshTokens"] == 1
    assert [c["status"] for c in await connections(gql, alice)] == ["NOT_CONNECTED"]
    with pytest.raises(NotConnected):
        await owner_access_token(engine, owner_id=alice, source_id=int(source["id"]))

    await admin.gql.data(
        "mutation($id: ID!) { deactivateOwner(userId: $id) }",
        {"id": str(bob)},
        as_user=admin.id,
        admin=True,
    )
    assert oauth.state()["liveRefreshTokens"] == 0
    assert await _connection_rows(engine) == []
    revoked = await _audit(engine, "connection.revoked")
    assert [(e["user_id"], e["actor_id"]) for e in revoked] == [(alice, alice), (bob, admin.id)]


async def test_removing_a_source_forgets_its_connections(
    source: dict[str, Any], admin: Admin, gql: Gql, factories: Factories, engine: AsyncEngine
) -> None:
    owner = (await factories.user())["id"]
    await connected(gql, source["id"], owner, "alice")
    await admin.gql.data(
        "mutation($id: ID!) { removeToolSource(id: $id) }",
        {"id": source["id"]},
        as_user=admin.id,
        admin=True,
    )
    assert await _connection_rows(engine) == []
    assert await connections(gql, owner) == []


async def test_the_sync_lists_with_the_admins_own_connection_else_says_why_not(
    source: dict[str, Any], admin: Admin, gql: Gql, oauth: OAuthServers
) -> None:
    # The server lists to no anonymous caller: the sync says so and what to do.
    assert source["tools"] == []
    assert "HTTP 401" in source["lastError"] or "401" in source["lastError"]
    assert "connect yours with connectToolSource" in source["lastError"]

    await connected(gql, source["id"], admin.id, "admin@corp.example")
    synced = await admin.sync(source["id"])

    assert synced["lastError"] is None
    assert sorted(t["name"] for t in synced["tools"]) == [
        "tickets__create_ticket",
        "tickets__search_tickets",
    ]
    assert oauth.resource_state()["lists"] >= 1


async def test_the_demo_registers_its_ticket_server_as_owner_oauth_and_the_owner_connects(
    engine: AsyncEngine, gql: Gql, engine_url: str
) -> None:
    with (
        AuthorizationServer(secret="demo-secret-of-at-least-32-bytes!") as authorization,
        ResourceServer(
            issuer=authorization.issuer, secret="demo-secret-of-at-least-32-bytes!"
        ) as tickets,
    ):
        await seed_demo(engine, now=utc_now(), tickets_url=tickets.url, tickets_auth="owner_oauth")
        await seed_demo(engine, now=utc_now(), tickets_url=tickets.url, tickets_auth="owner_oauth")

        [sample] = (await gql.data(DEMO_AGENT, as_user=DEMO_OWNER_ID))["viewer"]["agents"]
        assert {t["name"] for t in sample["tools"] if t["name"].startswith("tickets__")} == {
            "tickets__search_tickets",
            "tickets__create_ticket",
        }
        [before] = await connections(gql, DEMO_OWNER_ID)
        assert before["status"] == "NOT_CONNECTED"
        # What the GraphiQL tour says: connect, open the link in a browser (no cookie: the demo
        # authorization server signs in its demo account).
        url = await connect_start(gql, before["sourceId"], DEMO_OWNER_ID)
        async with httpx.AsyncClient(follow_redirects=True, timeout=30) as browser:
            page = await browser.get(url)
        assert "Connected — you can close this tab" in page.text
        [after] = await connections(gql, DEMO_OWNER_ID)
        assert (after["status"], after["account"]) == ("CONNECTED", "demo@example.com")
        token = await owner_access_token(
            engine, owner_id=DEMO_OWNER_ID, source_id=int(before["sourceId"])
        )
        await _call_as(token.access_token, tickets.url, "demo ticket")
        assert [c.subject for c in tickets.calls_of("create_ticket")] == ["demo@example.com"]


async def test_odd_callbacks_are_pages_never_a_500(
    engine_url: str, settings: Settings, engine: AsyncEngine
) -> None:
    odd = [
        "",
        "?state=" + "s" * 20_000 + "&code=x",
        "?state=a&state=b&code=c",
        "?error=%00%ff&state=x",
        "?code=only",
    ]
    async with httpx.AsyncClient(timeout=30) as browser:
        for query in odd:
            page = await browser.get(f"{engine_url}/oauth/callback{query}")
            assert page.status_code == 400, query
            assert page.headers["content-type"].startswith("text/html")
            assert page.headers["cache-control"] == "no-store"
        settings.token_keys = None
        page = await browser.get(f"{engine_url}/oauth/callback?state=x&code=y")
        assert page.status_code == 400 and "AGENT_ENGINE_TOKEN_KEYS" in page.text
        settings.token_keys = KEY_A
        settings.connect_return_url = "https://app.example.com/connected?from=engine"
        page = await browser.get(f"{engine_url}/oauth/callback?code=y")
        assert page.status_code == 303
        assert page.headers["location"] == (
            "https://app.example.com/connected?from=engine&outcome=bad_state"
        )
    assert await _connection_rows(engine) == []
