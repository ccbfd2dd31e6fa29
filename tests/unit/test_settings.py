"""Settings that contradict each other are refused with what is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_engine.settings import Settings


def test_defaults_are_consistent() -> None:
    settings = Settings()
    assert settings.runs_in_flight >= 200
    assert settings.stale_after_seconds > settings.heartbeat_interval_seconds


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"heartbeat_interval_seconds": 30, "stale_after_seconds": 30}, "STALE_AFTER_SECONDS"),
        ({"heartbeat_interval_seconds": 60, "stale_after_seconds": 45}, "STALE_AFTER_SECONDS"),
        (
            {"queued_resend_after_seconds": 600, "queued_fail_after_seconds": 300},
            "QUEUED_FAIL_AFTER_SECONDS",
        ),
    ],
)
def test_contradicting_settings_are_refused(values: dict[str, float], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Settings(**values)  # type: ignore[arg-type]


def test_the_in_flight_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ENGINE_RUNS_IN_FLIGHT", "500")
    assert Settings().runs_in_flight == 500
    monkeypatch.setenv("AGENT_ENGINE_RUNS_IN_FLIGHT", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_the_credential_allow_list_is_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES", raising=False)
    assert Settings().credential_prefixes == ()
    monkeypatch.setenv("AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES", "LLM_, OPENAI_,")
    assert Settings().credential_prefixes == ("LLM_", "OPENAI_")


def test_token_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS", "3600")
    monkeypatch.setenv("AGENT_ENGINE_JWT_ROLES_CLAIM", "realm_access.roles")
    settings = Settings()
    assert (settings.jwt_max_lifetime_seconds, settings.jwt_leeway_seconds) == (3600, 30)
    assert settings.jwt_roles_claim == "realm_access.roles"


def test_the_accepted_token_types_are_comma_separated_media_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENT_ENGINE_JWT_ACCEPTED_TYPES", raising=False)
    assert Settings().jwt_accepted_type_set == {"at+jwt", "jwt"}
    monkeypatch.setenv("AGENT_ENGINE_JWT_ACCEPTED_TYPES", " application/AT+JWT , ")
    assert Settings().jwt_accepted_type_set == {"at+jwt"}
    monkeypatch.setenv("AGENT_ENGINE_JWT_ACCEPTED_TYPES", "")
    assert Settings().jwt_accepted_type_set == frozenset()  # `typ` not checked
