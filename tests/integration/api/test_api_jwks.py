"""Sign-in from the identity provider's JWKS, over real HTTP and WebSocket: a local identity
provider (`agent_engine.testing.identity_provider`) serves RSA, EC and Ed25519 keys (labelled or
not), rotates them while the api runs, goes down, publishes keys the api cannot use; an attacker
forges HS256 tokens with the published key; dates written as strings and ID tokens are refused."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from agent_engine.embedded import free_port
from agent_engine.settings import Settings
from agent_engine.testing.identity_provider import IdentityProvider, KeyKind
from tests.integration.api.subscriptions.support import Server, running_api, ws_client

VIEWER = "{ viewer { user { id email } isAdmin } }"
ISSUER = "https://idp.example.com/realms/acme"
AUDIENCE = "agent-engine"


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    with IdentityProvider() as provider:
        yield provider


def _sso(settings: Settings, jwks_url: str, **changes: Any) -> Settings:
    """Keycloak-style settings: roles under realm_access, issuer and audience checked."""
    return settings.model_copy(
        update={
            "jwt_jwks_url": jwks_url,
            "jwt_roles_claim": "realm_access.roles",
            "jwt_admin_role": "engine-admins",
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            "jwt_jwks_refetch_seconds": 0.0,
            **changes,
        }
    )


def _claims(user_id: int = 41, **extra: Any) -> dict[str, Any]:
    claims = {"sub": str(user_id), "iss": ISSUER, "aud": AUDIENCE, "email": "kim@example.com"}
    return {**claims, **extra}


async def _ask(server: Server, token: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={"query": VIEWER},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _refused(body: dict[str, Any]) -> str:
    assert body.get("data") in (None, {}) or body["data"].get("viewer") is None, body
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "UNAUTHENTICATED", body
    message: str = error["message"]
    return message


async def test_rsa_and_ec_keys_sign_in_with_roles_from_a_dotted_claim(
    settings: Settings, idp: IdentityProvider
) -> None:
    rsa_kid, ec_kid = idp.add_key("RS256"), idp.add_key("ES256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        admin = await _ask(
            server, idp.sign(rsa_kid, _claims(realm_access={"roles": ["engine-admins"]}))
        )
        assert admin["data"]["viewer"] == {
            "user": {"id": "41", "email": "kim@example.com"},
            "isAdmin": True,
        }
        owner = await _ask(
            server, idp.sign(ec_kid, _claims(42, realm_access={"roles": ["agent_admin"]}))
        )
        # The default role name means nothing here: the configured one decides.
        assert owner["data"]["viewer"]["isAdmin"] is False
        # A top-level `roles` claim is not where this deployment reads roles from.
        top = await _ask(server, idp.sign(ec_kid, _claims(43, roles=["engine-admins"])))
        assert top["data"]["viewer"]["isAdmin"] is False


async def test_issuer_and_audience_are_checked(settings: Settings, idp: IdentityProvider) -> None:
    kid = idp.add_key("RS256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        wrong_iss = await _ask(server, idp.sign(kid, _claims(iss="https://evil.example.com")))
        assert "issuer" in _refused(wrong_iss).lower()
        wrong_aud = await _ask(server, idp.sign(kid, _claims(aud="another-app")))
        assert "audience" in _refused(wrong_aud).lower()
        no_aud = {k: v for k, v in _claims().items() if k != "aud"}
        assert "aud" in _refused(await _ask(server, idp.sign(kid, no_aud)))
        # The old HS256 secret is not a way in once the identity provider signs.
        from agent_engine.api.auth import mint_token

        hs = mint_token(settings.jwt_secret or "", user_id=41)
        _refused(await _ask(server, hs))


async def test_a_key_rotation_needs_no_restart(settings: Settings, idp: IdentityProvider) -> None:
    old = idp.add_key("RS256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        assert (await _ask(server, idp.sign(old, _claims())))["data"]["viewer"] is not None
        # The provider rotates: a new key is published, the old one withdrawn.
        new = idp.add_key("ES256")
        idp.remove_key(old)
        fresh = await _ask(server, idp.sign(new, _claims()))
        assert fresh["data"]["viewer"]["user"]["id"] == "41"
        # That token's unknown kid made the api fetch the set again: the old key is gone.
        message = _refused(await _ask(server, idp.sign(old, _claims())))
        assert f"no signing key with kid '{old}'" in message


async def test_a_token_answered_from_memory_is_checked_again_once_its_key_is_withdrawn(
    settings: Settings, idp: IdentityProvider
) -> None:
    """The api keeps tokens it verified lately; the same token, signed with a key the provider
    has since withdrawn, is refused once the api holds the new key set."""
    old = idp.add_key("RS256")
    token = idp.sign(old, _claims())
    with running_api(_sso(settings, idp.jwks_url)) as server:
        for _ in range(2):  # the second from memory
            assert (await _ask(server, token))["data"]["viewer"] is not None
        new = idp.add_key("ES256")
        idp.remove_key(old)
        # A token with the new kid makes the api fetch the set: the old key is gone from it.
        assert (await _ask(server, idp.sign(new, _claims())))["data"]["viewer"] is not None
        message = _refused(await _ask(server, token))
        assert f"no signing key with kid '{old}'" in message


async def test_many_requests_with_a_new_key_fetch_the_set_once(
    settings: Settings, idp: IdentityProvider
) -> None:
    first = idp.add_key("RS256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        assert (await _ask(server, idp.sign(first, _claims())))["data"]["viewer"] is not None
        before = idp.fetches
        new = idp.add_key("RS256")
        token = idp.sign(new, _claims())
        answers = await asyncio.gather(*(_ask(server, token) for _ in range(20)))
        assert all(a["data"]["viewer"]["user"]["id"] == "41" for a in answers)
        assert idp.fetches == before + 1


async def test_unknown_kids_do_not_make_the_api_hammer_the_provider(
    settings: Settings, idp: IdentityProvider
) -> None:
    known = idp.add_key("RS256")
    configured = _sso(settings, idp.jwks_url, jwt_jwks_refetch_seconds=3600.0)
    with running_api(configured) as server:
        assert (await _ask(server, idp.sign(known, _claims())))["data"]["viewer"] is not None
        fetched = idp.fetches
        other = IdentityProvider()  # an attacker's own keys, with made-up kids
        for _ in range(10):
            kid = other.add_key("RS256")
            assert "no signing key" in _refused(await _ask(server, other.sign(kid, _claims())))
        assert idp.fetches == fetched


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256(secret: bytes, header: dict[str, Any], claims: dict[str, Any]) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


async def test_an_hs256_token_signed_with_the_public_key_is_refused(
    settings: Settings, idp: IdentityProvider
) -> None:
    """The classic algorithm confusion: the public key is public, so an attacker HMACs a token
    with its bytes and hopes the server uses it as an HS256 secret."""
    kid = idp.add_key("RS256")
    claims = _claims(7, exp=int(time.time()) + 300, realm_access={"roles": ["engine-admins"]})
    async with httpx.AsyncClient() as client:
        published = (await client.get(idp.jwks_url)).json()["keys"][0]
    forgeries = [
        _hs256(idp.public_pem(kid), {"alg": "HS256", "typ": "JWT", "kid": kid}, claims),
        _hs256(json.dumps(published).encode(), {"alg": "HS256", "typ": "JWT", "kid": kid}, claims),
        _hs256(idp.public_pem(kid), {"alg": "HS256", "typ": "JWT"}, claims),
        # alg none, with the kid of a real key.
        f"{_b64(json.dumps({'alg': 'none', 'kid': kid}).encode())}"
        f".{_b64(json.dumps(claims).encode())}.",
    ]
    with running_api(_sso(settings, idp.jwks_url)) as server:
        for forged in forgeries:
            _refused(await _ask(server, forged))


async def test_the_websocket_signs_in_with_the_same_verifier(
    settings: Settings, idp: IdentityProvider
) -> None:
    kid = idp.add_key("ES256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        async with ws_client(server) as client:
            token = idp.sign(kid, _claims(realm_access={"roles": ["engine-admins"]}))
            ack = await client.init({"Authorization": f"Bearer {token}"})
            assert ack["type"] == "connection_ack", ack
            await client.subscribe("1", "query { viewer { isAdmin } }")
            assert (await client.next_data("1"))["viewer"] == {"isAdmin": True}
        other = IdentityProvider()
        forged = other.sign(other.add_key("RS256"), _claims())
        async with ws_client(server) as client:
            with pytest.raises(ConnectionClosed) as closed:
                await client.init({"Authorization": f"Bearer {forged}"})
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def test_an_unreachable_provider_is_unauthenticated_and_not_ready(
    settings: Settings, idp: IdentityProvider
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/.well-known/jwks.json"
    kid = idp.add_key("RS256")
    with running_api(_sso(settings, nowhere)) as server:
        message = _refused(await _ask(server, idp.sign(kid, _claims())))
        assert "identity provider's signing keys" in message and "could not be fetched" in message
        assert "127.0.0.1" not in message
        async with httpx.AsyncClient(timeout=30) as client:
            ready = await client.get(f"{server.url}/readyz")
        assert ready.status_code == 503
        body = ready.json()
        assert "jwks" in body["down"]
        assert body["jwks"].startswith("unreachable")


async def test_a_provider_outage_keeps_the_last_good_key_set_serving(
    settings: Settings,
) -> None:
    idp = IdentityProvider().start()
    try:
        kid = idp.add_key("ES256")
        token = idp.sign(kid, _claims())
        with running_api(_sso(settings, idp.jwks_url)) as server:
            assert (await _ask(server, token))["data"]["viewer"]["user"]["id"] == "41"
            idp.stop()
            # A new kid makes the api try the provider again: down, so that token is refused...
            unpublished = IdentityProvider()
            message = _refused(
                await _ask(server, unpublished.sign(unpublished.add_key("RS256"), _claims()))
            )
            assert "no signing key" in message
            # ...while the keys already fetched keep signing people in.
            assert (await _ask(server, token))["data"]["viewer"]["user"]["id"] == "41"
            async with httpx.AsyncClient(timeout=30) as client:
                ready = await client.get(f"{server.url}/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["jwks"].startswith("ok (serving the last good key set")
    finally:
        idp.stop()


@pytest.mark.parametrize(
    ("kind", "labelled"),
    [("PS256", True), ("PS512", True), ("ES384", True), ("EdDSA", True), ("ES384", False)],
)
async def test_the_algorithms_a_provider_may_sign_with_sign_in(
    settings: Settings, idp: IdentityProvider, kind: KeyKind, labelled: bool
) -> None:
    kid = idp.add_key(kind, labelled=labelled)
    with running_api(_sso(settings, idp.jwks_url)) as server:
        body = await _ask(server, idp.sign(kid, _claims()))
        assert body["data"]["viewer"]["user"]["id"] == "41", body


async def test_an_rsa_key_without_an_alg_label_verifies_rs_and_ps_tokens_only(
    settings: Settings, idp: IdentityProvider
) -> None:
    """Many providers publish RSA keys without `alg` (Entra, oidc-provider): such a key verifies
    PKCS#1 v1.5 and RSA-PSS tokens; a token claiming an EC algorithm, or HS256, is refused."""
    kid = idp.add_key("RS256", labelled=False)
    with running_api(_sso(settings, idp.jwks_url)) as server:
        for algorithm in ("RS256", "RS384", "PS256", "PS384"):
            token = idp.sign(kid, _claims(), algorithm=algorithm)
            assert (await _ask(server, token))["data"]["viewer"]["user"]["id"] == "41"
        labelled = idp.add_key("RS256")  # labelled RS256: that one only
        message = _refused(await _ask(server, idp.sign(labelled, _claims(), algorithm="PS256")))
        assert (
            "its algorithm (`alg` 'PS256') is not one its signing key verifies (RS256)" in message
        )


@pytest.mark.parametrize(
    ("published", "reason"),
    [
        (
            {"kty": "RSA", "kid": "hs", "alg": "HS256", "n": "sXch", "e": "AQAB"},
            "key 'hs' is labelled 'HS256'",
        ),
        ({"kty": "oct", "kid": "sym", "k": "c2VjcmV0"}, "key 'sym' is a symmetric (oct) key"),
        (
            {"kty": "EC", "kid": "k1", "crv": "secp256k1", "x": "AA", "y": "AA"},
            "key 'k1' is an EC key on the curve 'secp256k1'",
        ),
        (
            {"kty": "OKP", "kid": "ed448", "crv": "Ed448", "x": "AA"},
            "key 'ed448' is an OKP key on the curve 'Ed448'",
        ),
        (
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "sXch", "e": "AQAB"},
            "key 'enc' is for 'enc', not for signatures",
        ),
    ],
)
async def test_a_set_without_a_usable_key_is_named_in_readyz(
    settings: Settings, idp: IdentityProvider, published: dict[str, Any], reason: str
) -> None:
    """/readyz says the provider answered and why none of its keys will do -- not that it is
    unreachable, nor that there is "no RSA or EC key" when there is one."""
    idp.publish(published)
    with running_api(_sso(settings, idp.jwks_url)) as server:
        async with httpx.AsyncClient(timeout=30) as client:
            ready = await client.get(f"{server.url}/readyz")
    assert ready.status_code == 503
    body = ready.json()
    assert body["down"] == ["jwks"]
    assert body["jwks"].startswith("unusable: the JWKS has no key this api can verify with: ")
    assert reason in body["jwks"]


async def test_a_token_naming_an_unusable_key_is_told_why(
    settings: Settings, idp: IdentityProvider
) -> None:
    idp.add_key("ES256")
    idp.publish({"kty": "oct", "kid": "shared", "k": "c2VjcmV0"})
    with running_api(_sso(settings, idp.jwks_url)) as server:
        claims = {**_claims(), "exp": int(time.time()) + 300}
        forged = _hs256(b"secret", {"alg": "HS256", "kid": "shared"}, claims)
        message = _refused(await _ask(server, forged))
        assert "the signing key 'shared' is a symmetric (oct) key" in message


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
async def test_a_date_written_as_a_string_is_refused_over_http_and_the_websocket(
    settings: Settings, idp: IdentityProvider, claim: str
) -> None:
    """A string `exp` skipped the lifetime limit and the socket's closing time: a year-long
    token kept a WebSocket open past its expiry. Now every date must be a JSON number."""
    kid = idp.add_key("RS256")
    now = int(time.time())
    dates: dict[str, Any] = {"exp": now + 365 * 86400, "iat": now - 5, "nbf": now - 5}
    dates[claim] = str(dates[claim])
    token = idp.sign(kid, _claims(**dates))
    with running_api(_sso(settings, idp.jwks_url)) as server:
        message = _refused(await _ask(server, token))
        assert f"`{claim}` must be a number of seconds since the epoch" in message
        async with ws_client(server) as client:
            with pytest.raises(ConnectionClosed) as closed:
                await client.init({"Authorization": f"Bearer {token}"})
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def test_an_id_token_does_not_pass_as_an_access_token(
    settings: Settings, idp: IdentityProvider
) -> None:
    """Keycloak-style: an ID token issued to the client that is also the audience (one client
    registration for both) carries `typ: ID` and `at_hash`; the access token gets in."""
    kid = idp.add_key("RS256")
    with running_api(_sso(settings, idp.jwks_url)) as server:
        id_token = idp.sign(kid, _claims(typ="ID", azp=AUDIENCE, at_hash="x4Qe3l5-Aw"))
        assert "it is an ID token" in _refused(await _ask(server, id_token))
        access = idp.sign(kid, _claims(typ="Bearer", azp=AUDIENCE), headers={"typ": "at+jwt"})
        assert (await _ask(server, access))["data"]["viewer"]["user"]["id"] == "41"
        other = idp.sign(kid, _claims(), headers={"typ": "logout+jwt"})
        assert "its type (`typ` 'logout+jwt')" in _refused(await _ask(server, other))
