"""A local identity provider: signs tokens with RSA, EC and Ed25519 keys and serves their JWKS
over HTTP.

For tests and local trials of `AGENT_ENGINE_JWT_JWKS_URL`: keys can be added and removed while it
serves (a key rotation), published with or without an `alg` label, and any JWK can be published
as it is (keys an api cannot use); it counts the fetches of its key set (a stampede shows there).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_engine.server_thread import ServerThread

# The signing algorithm of a key; an RSA key labelled with none may sign with any RS*/PS*.
KeyKind = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
JWKS_PATH = "/.well-known/jwks.json"
DEFAULT_TOKEN_SECONDS = 600

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def _generate(kind: KeyKind) -> PrivateKey:
    if kind.startswith(("RS", "PS")):
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "ES384":
        return ec.generate_private_key(ec.SECP384R1())
    return ed25519.Ed25519PrivateKey.generate()


class _Key:
    def __init__(self, kind: KeyKind, kid: str, *, labelled: bool) -> None:
        self.kind = kind
        self.kid = kid
        self.labelled = labelled
        self.private = _generate(kind)

    def public_jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.kind)
        jwk: dict[str, Any] = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        jwk = {**jwk, "kid": self.kid, "use": "sig"}
        return {**jwk, "alg": self.kind} if self.labelled else jwk


class IdentityProvider(ServerThread):
    thread_name = "identity-provider"
    description = "the local identity provider"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self._lock = threading.Lock()
        self._keys: dict[str, _Key] = {}
        self._retired: dict[str, _Key] = {}  # removed from the set, still able to sign
        self._published: list[dict[str, Any]] = []  # JWKs published as they are
        self._fetches = 0

    # -- keys -----------------------------------------------------------------------------------

    def add_key(
        self, kind: KeyKind = "RS256", kid: str | None = None, *, labelled: bool = True
    ) -> str:
        """A new signing key, published from now on (with `alg` unless not `labelled`, as many
        providers publish RSA keys); returns its `kid`."""
        key = _Key(kind, kid or f"{kind.lower()}-{uuid.uuid4().hex[:8]}", labelled=labelled)
        with self._lock:
            self._keys[key.kid] = key
        return key.kid

    def publish(self, jwk: dict[str, Any]) -> None:
        """Publish a JWK as it is (e.g. one the api cannot verify with), beside the keys."""
        with self._lock:
            self._published.append(jwk)

    def remove_key(self, kid: str) -> None:
        with self._lock:
            self._retired[kid] = self._keys.pop(kid)

    def public_pem(self, kid: str) -> bytes:
        return (
            self._key(kid)
            .private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def sign(
        self,
        kid: str,
        claims: dict[str, Any],
        *,
        lifetime_seconds: int = DEFAULT_TOKEN_SECONDS,
        algorithm: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> str:
        """A token signed with the key `kid` (which need not be published any more), with the
        key's algorithm unless another is named; `headers` add to (or replace) the header."""
        key = self._key(kid)
        payload = {"exp": int(time.time()) + lifetime_seconds, **claims}
        return jwt.encode(
            payload,
            key.private,
            algorithm=algorithm or key.kind,
            headers={"kid": kid, **(headers or {})},
        )

    def _key(self, kid: str) -> _Key:
        with self._lock:
            return self._keys[kid] if kid in self._keys else self._retired[kid]

    # -- serving --------------------------------------------------------------------------------

    @property
    def jwks_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the identity provider is not started")
        return f"http://127.0.0.1:{self.port}{JWKS_PATH}"

    @property
    def fetches(self) -> int:
        """How many times the key set was requested."""
        with self._lock:
            return self._fetches

    def app(self) -> Starlette:
        return Starlette(routes=[Route(JWKS_PATH, self._jwks)])

    async def _jwks(self, request: Request) -> Response:
        with self._lock:
            self._fetches += 1
            keys = [key.public_jwk() for key in self._keys.values()] + self._published
        return JSONResponse({"keys": keys})
