"""Which variables may hold a credential sent to a server an admin chose."""

from __future__ import annotations

import pytest

from agent_engine.domain.credentials import (
    credential_env_problem,
    is_engine_setting,
    parse_prefixes,
    signing_env_problem,
)


@pytest.mark.parametrize(
    "name",
    [
        "AGENT_ENGINE_JWT_SECRET",
        "agent_engine_jwt_secret",
        "Agent_Engine_Database_Url",
        "AGENT_ENGINE_WEBHOOK_SECRET",
        "DATABASE_URL",
        "redis_url",
        "BROKER_URL",
        "PGPASSWORD",
    ],
)
def test_the_engines_own_settings_are_never_a_credential(name: str) -> None:
    assert is_engine_setting(name)
    problem = credential_env_problem(name)
    assert problem is not None and "engine's own settings" in problem


def test_ordinary_variables_are_credentials() -> None:
    assert credential_env_problem(None) is None
    assert credential_env_problem("OPENAI_API_KEY") is None
    assert credential_env_problem("AGENT_ENGINEX") is None  # not the engine's prefix
    assert credential_env_problem("1KEY") == "must be an environment variable name"


def test_a_signing_variable_is_not_a_credential_and_the_reverse() -> None:
    problem = credential_env_problem("OPS_HOOK", signing_envs={"OPS_HOOK"})
    assert problem == "must not name a variable a delivery target signs with"
    assert signing_env_problem("OPENAI_API_KEY", credential_envs={"OPENAI_API_KEY"}) is not None
    # An HMAC key never leaves the worker: an engine-named one is fine for signing.
    assert signing_env_problem("AGENT_ENGINE_WEBHOOK_SECRET") is None


def test_the_allow_list() -> None:
    prefixes = parse_prefixes(" LLM_, ,MODEL_KEY_ ,")
    assert prefixes == ("LLM_", "MODEL_KEY_")
    assert credential_env_problem("LLM_OPENAI", allowed_prefixes=prefixes) is None
    problem = credential_env_problem("OPENAI_API_KEY", allowed_prefixes=prefixes)
    assert problem == "must start with one of the allowed prefixes (LLM_, MODEL_KEY_)"
    # The allow-list never lets an engine setting through.
    assert credential_env_problem("AGENT_ENGINE_X", allowed_prefixes=("AGENT_",)) is not None
    assert parse_prefixes("") == ()
