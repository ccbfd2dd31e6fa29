"""The dashboard shows a run waiting for its owner's connection, with the link: in a real browser,
against the real OAuth test servers (processes) and the real worker. The owner clicks the link,
the page asks for connectToolSource and opens the authorization URL; signing in there (the test
authorization server signs in without a form) lands on the engine's callback, the run resumes
and the page takes it to SUCCEEDED."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest

from agent_engine.oauth.keys import ENV as KEYS_ENV
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from tests.integration.api.support import Api
from tests.integration.api.test_dashboard import feed_state, sign_in, start_run
from tests.integration.runs.support import FAKE_KEY_ENV
from tests.integration.tool_sources.oauth_support import (
    OAUTH_SOURCE,
    OAuthServers,
    connected,
    oauth_servers,
)
from tests.integration.tool_sources.oauth_support import sign_in as browser_sign_in
from tests.support.browser import headless_chromium, keep_artifact
from tests.support.factories import Factories

KEY = base64.b64encode(b"D" * 32).decode()
SEARCH = "tickets__search_tickets"
SYNC = "mutation($id: ID!) { syncToolSource(id: $id) { lastError tools { id name } } }"
ALLOW = "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: true) { id } }"
ATTACH = "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }"


@pytest.fixture
def oauth() -> Iterator[OAuthServers]:
    with oauth_servers() as servers:
        yield servers


@pytest.mark.browser
async def test_the_owner_connects_from_the_waiting_run_and_it_goes_on(
    api: Api,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    oauth: OAuthServers,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    api.settings.public_url = api.url
    api.settings.token_keys = KEY
    monkeypatch.setenv(KEYS_ENV, KEY)
    api.clock.now = datetime.now(UTC)
    owner = await factories.user(display_name="Olive Owner", email="olive@example.com")
    admin_user = await factories.user(display_name="Ada Admin")
    model = await factories.model(
        name="Fake",
        provider="openai",
        model="fake-model",
        base_url=fake_openai.base_url,
        api_key_env=FAKE_KEY_ENV,
    )
    agent = await factories.agent(user_id=owner["id"], model_id=model["id"], name="Ticket bot")
    owner_token = api.token(owner["id"], name="Olive Owner", email="olive@example.com")
    admin_token = api.token(admin_user["id"], admin=True, name="Ada Admin")
    source = (
        await api.data(
            OAUTH_SOURCE,
            {"input": {"name": "tickets", "url": oauth.resource, "auth": "OWNER_OAUTH"}},
            token=admin_token,
        )
    )["upsertToolSource"]
    # The admin lists the tools with their own account, then allows the search tool.
    await connected(api, source["id"], admin_user["id"], "ada@corp.example")  # type: ignore[arg-type]
    tools = (await api.data(SYNC, {"id": source["id"]}, token=admin_token))["syncToolSource"]
    search_id = next(t["id"] for t in tools["tools"] if t["name"] == SEARCH)
    await api.data(ALLOW, {"t": search_id}, token=admin_token)
    await api.data(ATTACH, {"a": str(agent["id"]), "t": search_id}, token=owner_token)
    fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "certificate"})))

    async with headless_chromium() as cdp:
        await sign_in(cdp, api, owner_token)
        run_id = await start_run(api, owner_token, agent["id"])
        link = f'#feed li[data-run-id="{run_id}"] a.connect'
        await cdp.wait_for(f"!!document.querySelector('{link}')", within_seconds=60)
        shown = await cdp.evaluate(
            f"document.querySelector('#feed li[data-run-id=\"{run_id}\"]').innerText"
        )
        assert "WAITING" in shown
        assert "waiting for your connection" in shown and "connect your account at tickets" in shown
        keep_artifact(await cdp.screenshot(tmp_path / "dashboard-connection.png"))

        await cdp.evaluate(f"document.querySelector('{link}').click()")
        url = await cdp.wait_for(
            f"document.querySelector('{link}').dataset.authorizationUrl", within_seconds=30
        )
        assert isinstance(url, str) and url.startswith(f"{oauth.issuer}/authorize?")
        # The tab the page opened: the authorization server signs Olive in and sends her back.
        fake_openai.enqueue(text_reply("nothing about certificates"))
        page = await browser_sign_in(url, "olive@corp.example")
        assert page.status_code == 200

        assert await cdp.wait_for(feed_state(run_id) + " === 'SUCCEEDED'", within_seconds=60)
    [call] = oauth.resource_state()["calls"]
    assert call["subject"] == "olive@corp.example"
