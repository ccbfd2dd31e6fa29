"""The /dashboard page: served offline by the api, and live in a real browser.

The browser test signs in by pasting a token, starts a run through the API (not the page), and
watches the page's live feed take the run to SUCCEEDED without a reload; then the admin view.
Screenshots are kept in the test's tmp dir and in $AGENT_ENGINE_TEST_ARTIFACTS (CI), and with
AGENT_ENGINE_DOCS_SCREENSHOT=<path> the admin view is written there (docs/dashboard.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from agent_engine.testing.mcp_tickets import TicketServer
from tests.integration.api.support import Api
from tests.integration.runs.support import FAKE_KEY_ENV
from tests.support.browser import Cdp, headless_chromium, keep_artifact
from tests.support.factories import Factories

ASSETS = ("dashboard.js", "dashboard.css")
DOCS_SCREENSHOT_ENV = "AGENT_ENGINE_DOCS_SCREENSHOT"
START = "mutation($a: ID!) { startRun(agentId: $a) { id state } }"


async def test_the_page_and_its_assets_are_served_with_nothing_from_elsewhere(api: Api) -> None:
    page = await api.http.get(f"{api.url}/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    texts = [page.text]
    for asset in ASSETS:
        assert f'"/static/{asset}"' in page.text
        response = await api.http.get(f"{api.url}/static/{asset}")
        assert response.status_code == 200, asset
        texts.append(response.text)
    for text in texts:
        # No CDN, no web fonts, no analytics: every URL is relative to this origin.
        assert not re.search(r"https?://", text), re.search(r".{40}https?://.{40}", text)
    # A forged Host header cannot widen the policy.
    forged = await api.http.get(
        f"{api.url}/dashboard", headers={"Host": "evil.example; script-src *"}
    )
    assert "evil" not in forged.headers["content-security-policy"]
    assert "script-src 'self';" in forged.headers["content-security-policy"]
    script = texts[1]
    assert "innerHTML" not in script  # API data is rendered as text only
    assert "graphql-transport-ws" in script
    assert "sessionStorage" in script and "localStorage" not in script


async def sign_in(cdp: Cdp, api: Api, token: str) -> None:
    await cdp.call("Page.navigate", url=f"{api.url}/dashboard")
    await cdp.wait_for(
        "(() => { const s = document.querySelector('#signin'); return s && !s.hidden })()"
    )
    await cdp.evaluate(
        f"document.querySelector('#token').value = {json.dumps(token)};"
        "document.querySelector('#signin-form').requestSubmit()"
    )
    await cdp.wait_for("document.querySelector('#app') && !document.querySelector('#app').hidden")
    await cdp.wait_for("document.querySelector('#live').dataset.state === 'live'")


def feed_state(run_id: str) -> str:
    return (
        f"(() => {{ const li = document.querySelector('#feed li[data-run-id=\"{run_id}\"]');"
        " return li ? li.dataset.state : null })()"
    )


async def start_run(api: Api, token: str, agent_id: int) -> str:
    data = await api.data(START, {"a": str(agent_id)}, token=token)
    run_id: str = data["startRun"]["id"]
    return run_id


@pytest.mark.browser
async def test_owner_sees_a_run_reach_succeeded_live_and_the_admin_sees_the_fleet(
    api: Api,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    tmp_path: Path,
) -> None:
    api.clock.now = datetime.now(UTC)
    await factories.setting("agent_weekly_token_cap", 1000)
    owner = await factories.user(display_name="Olive Owner", email="olive@example.com")
    admin_user = await factories.user(display_name="Ada Admin", email="ada@example.com")
    model = await factories.model(
        name="Fake",
        provider="openai",
        model="fake-model",
        base_url=fake_openai.base_url,
        api_key_env=FAKE_KEY_ENV,
    )
    digest = await factories.agent(user_id=owner["id"], model_id=model["id"], name="Release digest")
    locked = await factories.agent(user_id=owner["id"], model_id=model["id"], name="Vendor watch")
    owner_token = api.token(owner["id"], name="Olive Owner", email="olive@example.com")
    admin_token = api.token(admin_user["id"], admin=True, name="Ada Admin", email="ada@example.com")
    await api.data(
        "mutation($a: ID!, $n: String) { setAdminPaused(agentId: $a, paused: true, note: $n) {"
        " id } }",
        {"a": str(locked["id"]), "n": "policy review, see ticket 42"},
        token=admin_token,
    )

    async with headless_chromium() as cdp:
        # The owner pastes the header line `make run` prints; the page keeps the token itself.
        await sign_in(cdp, api, json.dumps({"Authorization": f"Bearer {owner_token}"}))
        assert owner_token not in await cdp.evaluate("location.href")
        assert await cdp.evaluate(
            "Object.values(sessionStorage).includes(" + json.dumps(owner_token) + ")"
        )
        await cdp.wait_for(
            f"!!document.querySelector('#agents tr[data-agent-id=\"{digest['id']}\"]')"
        )
        note = await cdp.evaluate(
            f"document.querySelector('#agents tr[data-agent-id=\"{locked['id']}\"]').innerText"
        )
        assert "paused by an admin: policy review, see ticket 42" in note
        assert await cdp.evaluate("document.querySelector('#admin').hidden") is True
        # Every state the feed shows for any run, recorded by the page itself; and a marker
        # that a reload would wipe.
        await cdp.evaluate(
            "window.__seen = {}; window.__notReloaded = true;"
            "new MutationObserver(() => document.querySelectorAll('#feed li').forEach(li => {"
            " (window.__seen[li.dataset.runId] ||= []).includes(li.dataset.state)"
            " || window.__seen[li.dataset.runId].push(li.dataset.state) }))"
            ".observe(document.querySelector('#feed'), {childList: true, subtree: true})"
        )

        fake_openai.enqueue(text_reply("Two releases shipped.", delay_seconds=1.0))
        run_id = await start_run(api, owner_token, digest["id"])
        assert await cdp.wait_for(feed_state(run_id) + " === 'SUCCEEDED'", within_seconds=60)
        assert await cdp.evaluate("window.__notReloaded") is True
        seen = await cdp.evaluate(f"window.__seen[{json.dumps(run_id)}]")
        assert seen[-1] == "SUCCEEDED" and len(seen) >= 2, seen  # it was live before it ended
        # The budget bar follows the finished run (15 tokens of 1,000).
        await cdp.wait_for("document.querySelector('#budget-text').innerText.startsWith('15 of')")
        assert await cdp.evaluate("document.querySelector('#budget-used').style.width") == "1.5%"
        owner_shot = await cdp.screenshot(tmp_path / "dashboard-owner.png")
        keep_artifact(owner_shot)

        # A failing run for the fleet's failure count, then the admin's view.
        fake_openai.enqueue(error_reply(400, "the model refused the request"))
        failed_id = await start_run(api, owner_token, digest["id"])
        assert await cdp.wait_for(feed_state(failed_id) + " === 'FAILED'", within_seconds=60)

        await cdp.evaluate("document.querySelector('#signout').click()")
        await cdp.wait_for("!document.querySelector('#signin').hidden")
        assert await cdp.evaluate("sessionStorage.length") == 0
        await sign_in(cdp, api, admin_token)
        await cdp.wait_for("!document.querySelector('#admin').hidden")
        await cdp.wait_for("document.querySelector('#stat-failed').innerText === '1'")
        audit: list[dict[str, Any]] = await cdp.wait_for(
            "(() => { const rows = [...document.querySelectorAll('#audit tbody tr')];"
            " return rows.length ? rows.map(r => ({action: r.dataset.action,"
            " text: r.innerText})) : null })()"
        )
        assert audit[0]["action"] == "agent.admin_paused"
        assert "Ada Admin" in audit[0]["text"] and "ticket 42" in audit[0]["text"]

        # The admin's feed shows every owner's runs, live.
        fake_openai.enqueue(text_reply("One more release.", delay_seconds=0.5))
        third = await start_run(api, owner_token, digest["id"])
        assert await cdp.wait_for(feed_state(third) + " === 'SUCCEEDED'", within_seconds=60)
        agent_name = await cdp.evaluate(
            f"document.querySelector('#feed li[data-run-id=\"{third}\"] .agent').innerText"
        )
        assert agent_name == "Release digest"
        # Runs from before the admin signed in are there too (the feed starts from the journal).
        for earlier in (run_id, failed_id):
            assert await cdp.evaluate(feed_state(earlier)) in ("SUCCEEDED", "FAILED")
        # The in-flight table follows the events: the finished run has left it.
        await cdp.wait_for("document.querySelector('#stat-in-flight').innerText === '0'")
        admin_shot = await cdp.screenshot(tmp_path / "dashboard-admin.png")
        keep_artifact(admin_shot)
        if docs := os.environ.get(DOCS_SCREENSHOT_ENV):
            shutil.copyfile(admin_shot, docs)


@pytest.mark.browser
async def test_a_refused_token_keeps_the_sign_in_form(api: Api) -> None:
    async with headless_chromium() as cdp:
        await cdp.call("Page.navigate", url=f"{api.url}/dashboard")
        await cdp.wait_for("!document.querySelector('#signin').hidden")
        bad = api.token(5, name="x")[:-4] + "AAAA"  # a signature that does not verify
        await cdp.evaluate(
            f"document.querySelector('#token').value = {json.dumps(bad)};"
            "document.querySelector('#signin-form').requestSubmit()"
        )
        message = await cdp.wait_for("document.querySelector('#signin-error').innerText")
        assert "refused" in message.lower()
        assert await cdp.evaluate("document.querySelector('#app').hidden") is True
        assert await cdp.evaluate("sessionStorage.length") == 0


@pytest.mark.browser
async def test_the_owner_approves_a_waiting_tool_call_on_the_dashboard(
    api: Api,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    tmp_path: Path,
) -> None:
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
    with TicketServer() as tickets:
        source = await api.data(
            "mutation($i: ToolSourceInput!) { upsertToolSource(input: $i) { tools { id name } } }",
            {"i": {"name": "tickets", "url": tickets.url}},
            token=admin_token,
        )
        for tool in source["upsertToolSource"]["tools"]:
            await api.data(
                "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: true) { id } }",
                {"t": tool["id"]},
                token=admin_token,
            )
            await api.data(
                "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }",
                {"a": str(agent["id"]), "t": tool["id"]},
                token=owner_token,
            )
        fake_openai.enqueue(
            tool_reply(FakeToolCall("tickets__create_ticket", {"title": "Renew the certificate"})),
            text_reply("Opened it."),
        )

        async with headless_chromium() as cdp:
            await sign_in(cdp, api, owner_token)
            run_id = await start_run(api, owner_token, agent["id"])
            row = f'#approvals tr[data-run-id="{run_id}"]'
            await cdp.wait_for(f"!!document.querySelector('{row}')", within_seconds=60)
            shown = await cdp.evaluate(f"document.querySelector('{row}').innerText")
            assert "tickets__create_ticket" in shown and "Renew the certificate" in shown
            assert await cdp.wait_for(feed_state(run_id) + " === 'RUNNING'")
            assert tickets.calls_of("create_ticket") == []
            keep_artifact(await cdp.screenshot(tmp_path / "dashboard-approval.png"))

            await cdp.evaluate(f"document.querySelector('{row} [data-action=approve]').click()")

            assert await cdp.wait_for(feed_state(run_id) + " === 'SUCCEEDED'", within_seconds=60)
            await cdp.wait_for("document.querySelector('#approvals-panel').hidden")
        assert len(tickets.calls_of("create_ticket")) == 1
