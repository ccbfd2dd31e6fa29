"""Against a real OpenID provider: npm `oidc-provider` (OpenID-certified), run by
tests/e2e/oidc/provider.mjs, issuing RFC 9068 JWT access tokens (`typ: at+jwt`) for the api's
audience and ID tokens to a web client, signed with PS256 (an RSA key published without `alg`),
ES384 and EdDSA. The tokens come from its real endpoints -- the client-credentials grant and the
authorization-code flow with PKCE and a resource indicator -- and go to a running api over HTTP
and the WebSocket: every access token signs in, no ID token does."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest

from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import Server, running_api, ws_client

OIDC_DIR = Path(__file__).parent / "oidc"
PROVIDER_SCRIPT = OIDC_DIR / "provider.mjs"
AUDIENCE = "api://agent-engine"  # the resource indicator: the api's own identifier
WEB_APP = "web-app"
REDIRECT_URI = "http://127.0.0.1/callback"  # never fetched: the code is read off the redirect
# The service clients of provider.mjs: the algorithm each one's tokens are signed with, and the
# employee id they carry.
SERVICES = {
    "ps256-service": ("PS256", "42"),
    "es384-service": ("ES384", "43"),
    "eddsa-service": ("EdDSA", "44"),
}
USER = "41"
VIEWER = "{ viewer { user { id email } } }"
START_SECONDS = 20.0


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the OpenID provider (oidc-provider) needs Node.js")
    if not (OIDC_DIR / "node_modules" / "oidc-provider").is_dir():
        # `make test` runs `npm ci` there; without it the test would not say what is missing.
        pytest.fail(f"oidc-provider is not installed: run `npm ci` in {OIDC_DIR}")
    return node


@dataclass(frozen=True)
class Provider:
    issuer: str
    discovery: dict[str, Any]

    def endpoint(self, name: str) -> str:
        url: str = self.discovery[name]
        return url


@pytest.fixture
def provider() -> Iterator[Provider]:
    process = subprocess.Popen(
        [_node(), str(PROVIDER_SCRIPT), AUDIENCE],
        cwd=OIDC_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once it listens
        if not line:
            process.wait(timeout=START_SECONDS)
            pytest.fail(f"provider.mjs did not start: {process.stderr.read()}")  # type: ignore[union-attr]
        issuer = json.loads(line)["issuer"]
        discovery = httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=10).json()
        yield Provider(issuer=issuer, discovery=discovery)
    finally:
        process.terminate()
        process.wait(timeout=START_SECONDS)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _service_token(provider: Provider, client_id: str) -> str:
    response = httpx.post(
        provider.endpoint("token_endpoint"),
        data={"grant_type": "client_credentials", "scope": "api:read", "resource": AUDIENCE},
        auth=(client_id, f"{client_id}-secret"),
        timeout=10,
    )
    assert response.status_code == 200, response.text
    token: str = response.json()["access_token"]
    return token


def _sign_in(provider: Provider, *, nonce: str | None) -> tuple[str, str]:
    """The web client's authorization-code flow (PKCE, a resource indicator) for employee 41:
    its access token and its ID token, from the token endpoint."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    params = {
        "client_id": WEB_APP,
        "response_type": "code",
        "scope": "openid email employee api:read",
        "resource": AUDIENCE,
        "redirect_uri": REDIRECT_URI,
        "state": secrets.token_urlsafe(8),
        "code_challenge": challenge.rstrip(b"=").decode(),
        "code_challenge_method": "S256",
        **({"nonce": nonce} if nonce else {}),
    }
    with httpx.Client(timeout=10) as browser:  # keeps the provider's cookies
        response = browser.get(provider.endpoint("authorization_endpoint"), params=params)
        for _ in range(10):  # auth -> interaction (signed in at once) -> auth -> callback
            assert response.is_redirect, response.text
            location = str(response.url.join(response.headers["location"]))
            if location.startswith(REDIRECT_URI):
                break
            response = browser.get(location)
        else:
            pytest.fail("the authorization flow did not come back to the client")
        query = parse_qs(urlsplit(location).query)
        assert query["state"] == [params["state"]], query
        tokens = browser.post(
            provider.endpoint("token_endpoint"),
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": REDIRECT_URI,
                "code_verifier": verifier,
                "resource": AUDIENCE,
            },
            auth=(WEB_APP, f"{WEB_APP}-secret"),
        )
    assert tokens.status_code == 200, tokens.text
    body = tokens.json()
    return body["access_token"], body["id_token"]


def _api_settings(settings: Settings, provider: Provider, **changes: Any) -> Settings:
    return settings.model_copy(
        update={
            "jwt_jwks_url": provider.endpoint("jwks_uri"),
            "jwt_issuer": provider.issuer,
            "jwt_audience": AUDIENCE,
            "jwt_user_id_claim": "employee_id",  # a service's `sub` is its client id
            **changes,
        }
    )


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


async def _viewer_id(server: Server, token: str) -> str:
    body = await _ask(server, token)
    assert "errors" not in body, body
    user_id: str = body["data"]["viewer"]["user"]["id"]
    return user_id


async def _refusal(server: Server, token: str) -> str:
    body = await _ask(server, token)
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "UNAUTHENTICATED", body
    message: str = error["message"]
    return message


async def test_a_real_providers_access_tokens_sign_in_and_its_id_tokens_do_not(
    settings: Settings, provider: Provider
) -> None:
    service_tokens = {client: _service_token(provider, client) for client in SERVICES}
    access, id_token = _sign_in(provider, nonce=secrets.token_urlsafe(12))
    # A client need not send a nonce in the code flow: then its ID token carries no ID-only claim.
    _, bare_id_token = _sign_in(provider, nonce=None)

    # What the provider issued: RFC 9068 access tokens under each algorithm; ID tokens for the
    # client, without `typ`.
    for client, (algorithm, _) in SERVICES.items():
        header = jwt.get_unverified_header(service_tokens[client])
        assert (header["alg"], header["typ"]) == (algorithm, "at+jwt"), header
    assert jwt.get_unverified_header(access)["typ"] == "at+jwt"
    for token in (id_token, bare_id_token):
        assert "typ" not in jwt.get_unverified_header(token)
        assert jwt.decode(token, options={"verify_signature": False})["aud"] == WEB_APP

    with running_api(_api_settings(settings, provider)) as server:
        async with httpx.AsyncClient(timeout=30) as client:
            ready = await client.get(f"{server.url}/readyz")
        assert ready.status_code == 200 and ready.json()["jwks"] == "ok", ready.text

        for client, (_, employee) in SERVICES.items():
            assert await _viewer_id(server, service_tokens[client]) == employee, client
        assert await _viewer_id(server, access) == USER
        async with ws_client(server) as socket:
            ack = await socket.init({"Authorization": f"Bearer {access}"})
            assert ack["type"] == "connection_ack", ack
            await socket.subscribe("1", VIEWER)
            assert (await socket.next_data("1"))["viewer"]["user"]["id"] == USER

        assert "it is an ID token (it carries `nonce`)" in await _refusal(server, id_token)
        # Its `aud` is the client's id, not the api's.
        assert "wrong audience" in await _refusal(server, bare_id_token)

    # An api set up with the client's id as its audience (the mistake to avoid) and, as this
    # provider allows, only RFC 9068 access tokens: the ID token is still no way in.
    strict = _api_settings(settings, provider, jwt_audience=WEB_APP, jwt_accepted_types="at+jwt")
    with running_api(strict) as server:
        for token in (id_token, bare_id_token):
            message = await _refusal(server, token)
            assert "its type (no `typ`: a plain JWT) is not one this api accepts" in message
