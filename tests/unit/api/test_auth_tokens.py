"""What a token must be to get in, whatever signed it: dates that are numbers (RFC 7519
NumericDate), an access token (its `typ`, no ID-token claim) and, when one is set, for this api's
audience. HS256 tokens here; the same verifier checks JWKS and PEM tokens."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from agent_engine.api.auth import TokenVerifier
from agent_engine.api.errors import Unauthenticated
from agent_engine.settings import Settings

SECRET = "a-secret-long-enough-for-hs256-tokens-0123456789"
AUDIENCE = "api://agent-engine"


@pytest.fixture(autouse=True)
def _no_jwt_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("AGENT_ENGINE_JWT_"):
            monkeypatch.delenv(name)


def _verifier(**values: object) -> TokenVerifier:
    settings = Settings(database_url=None, jwt_secret=SECRET, **values)  # type: ignore[arg-type]
    return TokenVerifier(settings)


def _token(headers: dict[str, Any] | None = None, **claims: Any) -> str:
    payload = {"sub": "7", "exp": int(time.time()) + 600, **claims}
    return jwt.encode(payload, SECRET, algorithm="HS256", headers=headers)


async def _refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(Unauthenticated) as refused:
        await verifier.verify(token)
    return str(refused.value)


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
async def test_a_date_written_as_a_string_is_refused_naming_the_claim(claim: str) -> None:
    """PyJWT reads `"exp": "1767225600"` as a date: the lifetime limit (and a WebSocket's closing
    time) would then miss it. A year-long `exp` string got in before."""
    now = int(time.time())
    values = {"exp": now + 365 * 86400, "iat": now - 5, "nbf": now - 5}
    message = await _refusal(_verifier(), _token(**{claim: str(values[claim])}))
    assert f"`{claim}` must be a number of seconds since the epoch" in message
    assert "not a string" in message


@pytest.mark.parametrize("value", [True, [1767225600], {"at": 1767225600}, None])
async def test_an_exp_of_another_json_kind_is_refused(value: object) -> None:
    message = await _refusal(_verifier(), _token(exp=value))
    assert "exp" in message


async def test_dates_as_json_numbers_are_accepted_fractions_included() -> None:
    now = time.time()
    claims = await _verifier().verify(_token(exp=now + 600.5, iat=now - 1.25, nbf=int(now) - 1))
    assert claims.user_id == 7
    assert claims.expires_at is not None and claims.expires_at.timestamp() == pytest.approx(
        now + 600.5, abs=1e-3
    )


@pytest.mark.parametrize(
    ("typ", "accepted"),
    [
        ("at+jwt", True),  # RFC 9068 (oidc-provider, Auth0's RFC 9068 profile)
        ("application/at+jwt", True),  # the same media type, spelled in full
        ("AT+JWT", True),  # media types compare without case
        ("JWT", True),  # Entra, Keycloak
        (None, True),  # no `typ` (Okta): a plain JWT
        ("dpop+jwt", False),
        ("logout+jwt", False),
        ("id_token+jwt", False),
        (["at+jwt"], False),
    ],
)
async def test_the_header_type_decides_with_the_default_setting(
    typ: object, accepted: bool
) -> None:
    token = _token(headers={"typ": typ})
    if accepted:
        assert (await _verifier().verify(token)).user_id == 7
    else:
        message = await _refusal(_verifier(), token)
        assert "its type (`typ`" in message and "AGENT_ENGINE_JWT_ACCEPTED_TYPES" in message


async def test_a_provider_of_rfc_9068_tokens_may_accept_only_those() -> None:
    strict = _verifier(jwt_accepted_types="at+jwt")
    assert (await strict.verify(_token(headers={"typ": "at+jwt"}))).user_id == 7
    for typ in ("JWT", None):  # an ID token of oidc-provider carries no `typ`
        assert "`typ`" in await _refusal(strict, _token(headers={"typ": typ}))


async def test_an_empty_type_setting_checks_no_type() -> None:
    assert (await _verifier(jwt_accepted_types="").verify(_token(headers={"typ": "x"}))).user_id


@pytest.mark.parametrize(
    ("claims", "mark"),
    [
        ({"nonce": "n-0S6_WzA2Mj"}, "`nonce`"),
        ({"at_hash": "77QmUPtjPfzWtF2AnpK9RQ"}, "`at_hash`"),
        ({"c_hash": "LDktKdoQak3Pk0cnXxCltA"}, "`c_hash`"),
        ({"s_hash": "LDktKdoQak3Pk0cnXxCltA"}, "`s_hash`"),
        ({"typ": "ID", "azp": "agent-engine"}, "`typ: ID`"),  # Keycloak's ID token
    ],
)
async def test_an_id_token_is_refused_even_for_the_right_audience(
    claims: dict[str, Any], mark: str
) -> None:
    """An ID token whose `aud` happens to be the api's (a client and an api that share one
    registration) still says what it is by a claim only ID tokens carry."""
    verifier = _verifier(jwt_audience=AUDIENCE)
    message = await _refusal(verifier, _token(aud=AUDIENCE, **claims))
    assert f"it is an ID token (it carries {mark})" in message
    # Keycloak's access tokens say `typ: Bearer` in the payload: those get in.
    assert (await verifier.verify(_token(aud=AUDIENCE, typ="Bearer"))).user_id == 7


@pytest.mark.parametrize(
    ("aud", "says"),
    [
        (None, "it has no audience (`aud`)"),
        ("client-app-id", "wrong audience"),
        (["account", "client-app-id"], "wrong audience"),
        ([AUDIENCE, 7], "`aud` must be a string or a list of strings"),
    ],
)
async def test_the_audience_must_name_this_api(aud: object, says: str) -> None:
    verifier = _verifier(jwt_audience=AUDIENCE)
    claims = {} if aud is None else {"aud": aud}
    assert says in await _refusal(verifier, _token(**claims))
    assert (await verifier.verify(_token(aud=["account", AUDIENCE]))).user_id == 7


async def test_without_an_audience_set_a_token_for_some_audience_is_refused() -> None:
    message = await _refusal(_verifier(), _token(aud="another-api"))
    assert "this api has no AGENT_ENGINE_JWT_AUDIENCE set" in message
