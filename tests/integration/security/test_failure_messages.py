"""What owners read of a failed model call names the model and the kind of failure -- never the
endpoint an admin configured (URL, host, port) nor what the remote answered (its body)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import dramatiq
import pytest

from agent_engine.embedded import free_port
from agent_engine.testing.fake_openai import FakeOpenAIServer, error_reply
from tests.integration.runs.transcript.support import Gql
from tests.support.factories import Factories

LEAKED_BODY = "sk-live-THIS-IS-THE-UPSTREAM-SECRET internal-gw-7.corp:8443"


async def _run_on(gql: Gql, factories: Factories, base_url: str) -> tuple[dict[str, Any], int]:
    model = await factories.model(
        name="Team GPT", provider="openai", model="gpt-4o-mini", base_url=base_url
    )
    owner = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    run = await gql.finished_run(
        await gql.start(agent["id"], as_user=owner), as_user=owner, within=30
    )
    return run, owner


def _assert_nothing_of_the_endpoint(run: dict[str, Any], base_url: str) -> None:
    parts = urlsplit(base_url)
    for text in (run["error"], *(s["error"] for s in run["steps"] if s["error"])):
        for leak in (base_url, parts.hostname or "?", str(parts.port), "/v1", "http", "sk-live"):
            assert leak not in text, (leak, text)


async def test_an_unreachable_model_names_the_model_not_its_address(
    gql: Gql, factories: Factories, worker: dramatiq.Worker
) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    run, _ = await _run_on(gql, factories, base_url)
    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == "model 'Team GPT' failed: the provider is unreachable"
    assert run["steps"][-1]["error"] == run["error"]
    _assert_nothing_of_the_endpoint(run, base_url)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, "the provider failed (HTTP 500)"),
        (401, "the provider refused the credentials (HTTP 401)"),
        (403, "the provider refused the credentials (HTTP 403)"),
        (400, "the provider refused the request (HTTP 400)"),
    ],
)
async def test_an_error_answer_names_the_kind_not_the_body(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    status: int,
    kind: str,
) -> None:
    fake_openai.script(lambda body: error_reply(status, LEAKED_BODY))
    run, _ = await _run_on(gql, factories, fake_openai.base_url)
    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == f"model 'Team GPT' failed: {kind}"
    assert run["steps"][-1]["error"] == run["error"]
    assert fake_openai.request_count >= 1  # the provider did answer, with its body
    _assert_nothing_of_the_endpoint(run, fake_openai.base_url)
