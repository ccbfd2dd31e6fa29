"""The run's trace where an operator looks: `Run.traceId` in the API (null with tracing off), and
the dashboard's live feed showing it, linked to AGENT_ENGINE_TRACE_URL_TEMPLATE, in a real
browser."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import dramatiq
import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_engine.observability import tracing
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.api.support import Api, Clock, running_server
from tests.integration.api.test_dashboard import START, feed_state, sign_in
from tests.integration.runs.support import FAKE_KEY_ENV, eventually
from tests.support.browser import headless_chromium
from tests.support.factories import Factories

TEMPLATE = "https://tempo.example/explore?trace={trace_id}&from=dashboard"
RUN = "query($id: ID!) { run(id: $id) { state traceId } }"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"trace_url_template": TEMPLATE})


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure_tracing("agent-engine-test", exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


@pytest.fixture
async def traced_api(spans: InMemorySpanExporter, settings: Settings) -> AsyncIterator[Api]:
    """The api made with tracing on."""
    clock = Clock(now=datetime.now(UTC))
    with running_server(settings, clock) as url:
        async with httpx.AsyncClient(timeout=30.0) as client:
            yield Api(url=url, settings=settings, http=client, clock=clock)


async def _owner_and_agent(factories: Factories, fake_openai: FakeOpenAIServer) -> tuple[int, int]:
    await factories.setting("agent_weekly_token_cap", 1000)
    owner = await factories.user(display_name="Olive Owner", email="olive@example.com")
    model = await factories.model(
        name="Fake",
        provider="openai",
        model="fake-model",
        base_url=fake_openai.base_url,
        api_key_env=FAKE_KEY_ENV,
    )
    agent = await factories.agent(user_id=owner["id"], model_id=model["id"], name="Digest")
    return int(owner["id"]), int(agent["id"])


async def _finished(api: Api, token: str, run_id: str) -> dict[str, str | None]:
    async def probe() -> dict[str, str | None] | None:
        run: dict[str, str | None] = (await api.data(RUN, {"id": run_id}, token=token))["run"]
        return run if run["state"] == "SUCCEEDED" else None

    found: dict[str, str | None] = await eventually(probe, what="the run to succeed")
    return found


async def test_with_tracing_off_a_finished_run_has_no_trace_id(
    api: Api, factories: Factories, fake_openai: FakeOpenAIServer, worker: dramatiq.Worker
) -> None:
    owner, agent = await _owner_and_agent(factories, fake_openai)
    token = api.token(owner)
    fake_openai.enqueue(text_reply("Nothing changed."))
    run_id = (await api.data(START, {"a": str(agent)}, token=token))["startRun"]["id"]
    assert (await _finished(api, token, run_id))["traceId"] is None
    # The page carries the template either way (escaped); the feed links only runs with an id.
    page = await api.http.get(f"{api.url}/dashboard")
    assert (
        '<body data-trace-url-template="https://tempo.example/explore?trace={trace_id}'
        '&amp;from=dashboard">'
    ) in page.text


@pytest.mark.browser
async def test_the_dashboard_feed_links_a_finished_run_to_its_trace(
    traced_api: Api,
    spans: InMemorySpanExporter,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
) -> None:
    api = traced_api
    owner, agent = await _owner_and_agent(factories, fake_openai)
    token = api.token(owner, name="Olive Owner", email="olive@example.com")
    fake_openai.enqueue(text_reply("Three documents changed."))
    async with headless_chromium() as cdp:
        await sign_in(cdp, api, json.dumps({"Authorization": f"Bearer {token}"}))
        run_id = (await api.data(START, {"a": str(agent)}, token=token))["startRun"]["id"]
        trace_id = (await _finished(api, token, run_id))["traceId"]
        assert trace_id is not None and len(trace_id) == 32
        [invoke] = [s for s in spans.get_finished_spans() if s.name == "invoke_agent Digest"]
        assert format(invoke.context.trace_id, "032x") == trace_id
        assert await cdp.wait_for(feed_state(run_id) + " === 'SUCCEEDED'", within_seconds=60)
        link = await cdp.evaluate(
            f"(() => {{ const a = document.querySelector("
            f"'#feed li[data-run-id=\"{run_id}\"] a.trace');"
            " return a ? [a.textContent, a.getAttribute('href'), a.rel] : null })()"
        )
    assert link == [
        f"trace {trace_id}",
        TEMPLATE.replace("{trace_id}", trace_id),
        "noopener noreferrer",
    ]
