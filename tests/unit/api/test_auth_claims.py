"""Reading verified claims: the user id and roles by dotted path; what stops the api at start."""

from __future__ import annotations

import pytest

from agent_engine.api.auth import claims_of, verification_problem
from agent_engine.api.errors import Unauthenticated
from agent_engine.settings import Settings


@pytest.fixture(autouse=True)
def _no_jwt_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("AGENT_ENGINE_JWT_"):
            monkeypatch.delenv(name)


def _settings(**values: object) -> Settings:
    return Settings(database_url=None, **values)  # type: ignore[arg-type]


def test_roles_come_from_a_dotted_path() -> None:
    keycloak = _settings(jwt_roles_claim="realm_access.roles", jwt_admin_role="ops")
    payload = {"sub": "7", "realm_access": {"roles": ["ops", "offline_access"]}}
    assert claims_of(payload, keycloak).admin
    assert not claims_of({"sub": "7", "roles": ["ops"]}, keycloak).admin
    okta = _settings(jwt_roles_claim="groups")
    assert claims_of({"sub": "7", "groups": ["agent_admin"]}, okta).admin
    assert not claims_of({"sub": "7", "groups": "everyone"}, okta).admin
    # A claim whose name has dots in it (namespaced custom claims) is found as it is.
    namespaced = _settings(jwt_roles_claim="https://acme.example/roles")
    assert claims_of({"sub": "7", "https://acme.example/roles": ["agent_admin"]}, namespaced).admin


def test_the_user_id_may_come_from_another_claim() -> None:
    configured = _settings(jwt_user_id_claim="ext.employee_id")
    payload = {"sub": "f3b1c2d4-uuid", "ext": {"employee_id": "1042"}}
    assert claims_of(payload, configured).user_id == 1042
    with pytest.raises(Unauthenticated, match="`sub` must be a numeric user id"):
        claims_of(payload, _settings())


@pytest.mark.parametrize(
    ("sub", "says"),
    [
        ("\u0661", "must be a numeric user id"),  # an Arabic-Indic one: not our digits
        ("0", "out of range"),
        (str(2**63), "out of range"),
        ("9" * 5_000, "out of range"),  # too long to convert: refused, not an internal error
    ],
)
def test_a_user_id_outside_the_database_ids_is_refused(sub: str, says: str) -> None:
    with pytest.raises(Unauthenticated, match=says):
        claims_of({"sub": sub}, _settings())


def test_a_jwks_without_an_audience_stops_the_api_at_start() -> None:
    """Every access token a provider issues names its audience; without one set here, any token
    it signs -- an ID token issued to another client -- would be as good as any other."""
    problem = verification_problem(_settings(jwt_jwks_url="https://idp/jwks"))
    assert problem is not None and problem.startswith("AGENT_ENGINE_JWT_AUDIENCE is not set")
    assert (
        verification_problem(_settings(jwt_jwks_url="https://idp/jwks", jwt_audience="x")) is None
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "no token verification key"),
        ({"jwt_secret": "change-me"}, "is 9 bytes long: it must be at least 32 bytes"),
        ({"jwt_secret": "é" * 15}, "is 30 bytes long"),
        ({"jwt_secret": "x" * 32}, None),
        (
            {"jwt_secret": "short", "jwt_jwks_url": "https://idp/jwks", "jwt_audience": "api://ae"},
            None,
        ),
        ({"jwt_public_key": "-----BEGIN PUBLIC KEY-----"}, None),
    ],
)
def test_what_stops_the_api_at_start(values: dict[str, object], expected: str | None) -> None:
    problem = verification_problem(_settings(**values))
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem
        assert "AGENT_ENGINE_JWT_SECRET" in problem


async def test_a_token_verified_lately_is_answered_from_memory_until_it_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import time
    from datetime import timedelta

    import jwt

    from agent_engine.api.auth import TokenVerifier, mint_token

    secret = "a-secret-long-enough-for-hs256-tokens-0123456789"
    verifier = TokenVerifier(_settings(jwt_secret=secret, jwt_leeway_seconds=0))
    decoded: list[str] = []
    decode = jwt.decode_complete

    def counting(token: str, *args: object, **kwargs: object) -> object:
        decoded.append(token)
        return decode(token, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jwt, "decode_complete", counting)
    token = mint_token(secret, user_id=7, ttl=timedelta(seconds=2))
    first = await verifier.verify(token)
    assert (await verifier.verify(token)) == first
    assert first.user_id == 7 and len(decoded) == 1  # the second answered from memory
    other = mint_token(secret, user_id=8)
    assert (await verifier.verify(other)).user_id == 8 and len(decoded) == 2
    # A token one byte off is a different token: checked, and refused.
    with pytest.raises(Unauthenticated, match="invalid token"):
        await verifier.verify(token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1])
    assert first.expires_at is not None
    await asyncio.sleep(max(0.0, first.expires_at.timestamp() - time.time()) + 0.05)
    with pytest.raises(Unauthenticated, match="the token has expired"):
        await verifier.verify(token)
