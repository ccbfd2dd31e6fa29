"""RSA (PKCS#1 v1.5 and PSS), EC and Ed25519 tokens verified with a configured public key, over
a real socket."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from agent_engine.settings import Settings
from tests.integration.api.support import Clock, running_server

VIEWER = "{ viewer { user { id email } isAdmin } }"


def _keys(algorithm: str) -> tuple[object, str]:
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    if algorithm.startswith(("RS", "PS")):
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        private = ec.generate_private_key(
            ec.SECP384R1() if algorithm == "ES384" else ec.SECP256R1()
        )
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public_pem


@pytest.mark.parametrize(
    ("algorithm", "from_file"),
    [
        ("RS256", False),
        ("RS256", True),
        ("ES256", False),
        ("ES256", True),
        ("PS256", False),
        ("ES384", False),
        ("EdDSA", True),
    ],
)
async def test_asymmetric_tokens_are_verified_with_the_public_key(
    settings: Settings, tmp_path: Path, algorithm: str, from_file: bool
) -> None:
    private, public_pem = _keys(algorithm)
    if from_file:
        key_file = tmp_path / "public.pem"
        key_file.write_text(public_pem)
        configured = settings.model_copy(update={"jwt_public_key_file": key_file})
    else:
        configured = settings.model_copy(update={"jwt_public_key": public_pem})
    claims = {"sub": "41", "email": "kim@example.com", "exp": int(time.time()) + 600}
    good = jwt.encode(claims, private, algorithm=algorithm)  # type: ignore[arg-type]
    other_private, _ = _keys(algorithm)
    forged = jwt.encode(claims, other_private, algorithm=algorithm)  # type: ignore[arg-type]
    # With a public key configured, HS256 tokens (even with the old secret) are refused.
    symmetric = jwt.encode(claims, settings.jwt_secret or "x" * 32, algorithm="HS256")

    with running_server(configured, Clock()) as url:
        async with httpx.AsyncClient(timeout=30) as client:

            async def ask(token: str) -> dict[str, object]:
                response = await client.post(
                    f"{url}/graphql",
                    json={"query": VIEWER},
                    headers={"Authorization": f"Bearer {token}"},
                )
                return response.json()  # type: ignore[no-any-return]

            ok = await ask(good)
            assert ok["data"] == {
                "viewer": {"user": {"id": "41", "email": "kim@example.com"}, "isAdmin": False}
            }
            for refused in (forged, symmetric):
                body = await ask(refused)
                assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED", body  # type: ignore[index]
