"""The dashboard shows which model answered: a last run a fallback model answered is marked."""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.api.support import Api
from tests.integration.api.test_dashboard import sign_in, start_run
from tests.integration.runs.support import FAKE_KEY_ENV, eventually, run_row
from tests.support.browser import headless_chromium, keep_artifact
from tests.support.factories import Factories

# The owner query's part the dashboard adds for fallback steps (dashboard.js, ownerQuery).
OWNER_STEPS = """{ viewer { agents { id lastRun { id state steps { kind name fallback } } } } }"""


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def agent_with_a_down_model(factories: Factories, fake: FakeOpenAIServer) -> tuple[int, int]:
    owner = await factories.user(display_name="Olive Owner", email="olive@example.com")
    backup = await factories.model(
        name="Backup",
        provider="openai",
        model="backup-model",
        base_url=fake.base_url,
        api_key_env=FAKE_KEY_ENV,
    )
    primary = await factories.model(
        name="Primary",
        provider="openai",
        model="primary-model",
        base_url=closed_port_url(),
        api_key_env=FAKE_KEY_ENV,
        fallback_model_id=backup["id"],
    )
    agent = await factories.agent(user_id=owner["id"], model_id=primary["id"], name="Digest")
    return int(owner["id"]), int(agent["id"])


def test_the_script_asks_for_the_steps_only_where_the_server_has_fallback() -> None:
    script = (Path(__file__).parents[3] / "src/agent_engine/api/static/dashboard.js").read_text()
    assert 'hasField(features.runStep, "fallback")' in script
    assert re.search(r"steps \{ kind name fallback \}", script)


async def test_the_owner_query_with_steps_is_served_and_names_the_fallback(
    api: Api,
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
) -> None:
    api.clock.now = datetime.now(UTC)
    await factories.setting("agent_weekly_token_cap", 100_000)
    owner, agent = await agent_with_a_down_model(factories, fake_openai)
    fake_openai.enqueue(text_reply("Answered by the backup."))
    token = api.token(owner)
    run_id = await start_run(api, token, agent)

    async def finished() -> bool:
        return (await run_row(engine, int(run_id)))["state"] == "succeeded"

    await eventually(finished, within=60, what="the run to succeed on the backup")
    data = await api.data(OWNER_STEPS, None, token=token)
    (shown,) = data["viewer"]["agents"]
    assert shown["lastRun"]["steps"] == [
        {"kind": "MODEL_CALL", "name": "backup-model", "fallback": True}
    ]


@pytest.mark.browser
async def test_the_dashboard_marks_a_run_a_fallback_answered(
    api: Api,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    tmp_path: Path,
) -> None:
    api.clock.now = datetime.now(UTC)
    await factories.setting("agent_weekly_token_cap", 100_000)
    owner, agent = await agent_with_a_down_model(factories, fake_openai)
    fake_openai.enqueue(text_reply("Answered by the backup."))
    token = api.token(owner, name="Olive Owner", email="olive@example.com")
    async with headless_chromium() as cdp:
        await sign_in(cdp, api, token)
        await start_run(api, token, agent)
        note = await cdp.wait_for(
            "(() => { const n = document.querySelector('#agents [data-fallback]');"
            " return n ? n.innerText : null })()",
            within_seconds=60,
        )
        assert note == "1 model call answered by the fallback backup-model (its model was down)"
        keep_artifact(await cdp.screenshot(tmp_path / "dashboard-fallback.png"))
