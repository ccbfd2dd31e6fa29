"""An admin tries to read the workers' secrets by naming them as a model's key: refused when the
model is saved (the field named, nothing written) and again before every send (a row written in
SQL before the rule makes the model's server receive nothing)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.runs.support import fetch
from tests.integration.runs.transcript.support import Gql, error_code
from tests.support.factories import Factories

UPSERT_MODEL = """
mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) { id name apiKeyEnv } }
"""
UPSERT_TARGET = """
mutation($input: DeliveryTargetInput!) { upsertDeliveryTarget(input: $input) { id secretEnv } }
"""
MODELS = "SELECT name, api_key_env FROM agent_models ORDER BY id"


def _model(api_key_env: str, url: str = "http://127.0.0.1:9012/v1") -> dict[str, Any]:
    return {
        "name": "Exfil",
        "provider": "openai",
        "model": "gpt-4o-mini",
        "baseUrl": url,
        "apiKeyEnv": api_key_env,
    }


def _target(secret_env: str) -> dict[str, Any]:
    return {"name": "Hooks", "url": "https://hooks.example.com/ae", "secretEnv": secret_env}


@pytest.mark.parametrize(
    "variable",
    [
        "AGENT_ENGINE_JWT_SECRET",
        "agent_engine_jwt_secret",  # settings are read case-insensitively
        "AGENT_ENGINE_DATABASE_URL",
        "DATABASE_URL",
        "REDIS_URL",
        "BROKER_URL",
    ],
)
async def test_a_model_may_not_send_an_engine_setting_as_its_key(
    gql: Gql, engine: AsyncEngine, factories: Factories, variable: str
) -> None:
    admin = (await factories.user())["id"]
    before = await fetch(engine, MODELS)
    body = await gql.body(UPSERT_MODEL, {"input": _model(variable)}, as_user=admin, admin=True)
    assert error_code(body) == "BAD_USER_INPUT"
    error = body["errors"][0]
    assert error["extensions"]["field"] == "input.apiKeyEnv"
    assert "engine's own settings" in error["message"]
    assert await fetch(engine, MODELS) == before


async def test_a_model_may_not_send_a_variable_a_delivery_target_signs_with(
    gql: Gql, engine: AsyncEngine, factories: Factories
) -> None:
    admin = (await factories.user())["id"]
    await gql.data(UPSERT_TARGET, {"input": _target("OPS_HOOK_SECRET")}, as_user=admin, admin=True)
    body = await gql.body(
        UPSERT_MODEL, {"input": _model("OPS_HOOK_SECRET")}, as_user=admin, admin=True
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.apiKeyEnv"
    assert "delivery target signs with" in body["errors"][0]["message"]
    assert [m["name"] for m in await fetch(engine, MODELS)] == []
    # An ordinary variable is fine.
    saved = await gql.data(
        UPSERT_MODEL, {"input": _model("OPENAI_API_KEY")}, as_user=admin, admin=True
    )
    assert saved["upsertAgentModel"]["apiKeyEnv"] == "OPENAI_API_KEY"


async def test_a_target_may_not_sign_with_a_models_key(
    gql: Gql, engine: AsyncEngine, factories: Factories
) -> None:
    admin = (await factories.user())["id"]
    await gql.data(UPSERT_MODEL, {"input": _model("OPENAI_API_KEY")}, as_user=admin, admin=True)
    body = await gql.body(
        UPSERT_TARGET, {"input": _target("OPENAI_API_KEY")}, as_user=admin, admin=True
    )
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "input.secretEnv"
    assert "model or tool source sends as its key" in body["errors"][0]["message"]
    assert await fetch(engine, "SELECT * FROM delivery_targets") == []


async def test_a_model_and_a_target_saved_at_once_never_share_a_variable(
    gql: Gql, engine: AsyncEngine, factories: Factories
) -> None:
    """Two admins at the same moment: the lock makes the second see the first's row."""
    admin = (await factories.user())["id"]
    for round_ in range(8):
        variable = f"SHARED_SECRET_{round_}"
        model, target = await asyncio.gather(
            gql.body(UPSERT_MODEL, {"input": _model(variable)}, as_user=admin, admin=True),
            gql.body(UPSERT_TARGET, {"input": _target(variable)}, as_user=admin, admin=True),
        )
        refused = [b for b in (model, target) if b.get("errors")]
        assert len(refused) == 1, (model, target)
        assert error_code(refused[0]) == "BAD_USER_INPUT"
    shared = await fetch(
        engine,
        "SELECT m.api_key_env FROM agent_models m"
        " JOIN delivery_targets t ON t.secret_env = m.api_key_env",
    )
    assert shared == []


async def test_a_row_written_before_the_rule_sends_nothing(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The model row is written in SQL (as by an older version): the worker still refuses, and
    the model's server -- the admin's listener -- receives no request at all."""
    model = await factories.model(
        name="Exfil",
        provider="openai",
        model="gpt-4o-mini",
        base_url=fake_openai.base_url,
        api_key_env="AGENT_ENGINE_JWT_SECRET",
    )
    owner = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    fake_openai.enqueue(text_reply("should never be asked"))
    with caplog.at_level(logging.ERROR, logger="agent_engine.runtime.credentials"):
        run_id = await gql.start(agent["id"], as_user=owner)
        run = await gql.finished_run(run_id, as_user=owner)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == (
        "model 'Exfil' was not called: the variable holding its credential is not allowed on"
        " this platform (an admin must change it; details in the worker log)"
    )
    (step,) = run["steps"]
    assert (step["kind"], step["error"]) == ("MODEL_CALL", run["error"])
    assert run["tokensUsed"] == 0
    # The run ended (the worker made its decision): the listener never heard from it.
    assert fake_openai.request_count == 0
    assert fake_openai.pending_replies == 1
    logged = [r.getMessage() for r in caplog.records]
    assert any("AGENT_ENGINE_JWT_SECRET" in line and "'Exfil'" in line for line in logged)


async def test_a_model_sharing_a_signing_variable_in_sql_sends_nothing(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_HOOK_SECRET", "whsec_c2VjcmV0")
    admin = (await factories.user())["id"]
    await gql.data(UPSERT_TARGET, {"input": _target("OPS_HOOK_SECRET")}, as_user=admin, admin=True)
    model = await factories.model(
        name="Exfil",
        provider="openai",
        model="gpt-4o-mini",
        base_url=fake_openai.base_url,
        api_key_env="OPS_HOOK_SECRET",
    )
    owner = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)
    assert run["state"] == "FAILED" and "model 'Exfil' was not called" in run["error"]
    assert fake_openai.request_count == 0
