"""Which algorithms a key of the identity provider's set verifies: its type's (RS* and PS* for
RSA, the curve's ES* for EC, EdDSA for Ed25519) or the one its `alg` labels it with -- and, for a
key that verifies nothing, a reason an operator can act on."""

from __future__ import annotations

from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from agent_engine.api.jwks import (
    ASYMMETRIC_ALGORITHMS,
    UnusableKey,
    key_algorithms,
    signing_key,
)

RSA = jwt.get_algorithm_by_name("RS256").to_jwk(
    rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(), as_dict=True
)
P384 = jwt.get_algorithm_by_name("ES384").to_jwk(
    ec.generate_private_key(ec.SECP384R1()).public_key(), as_dict=True
)
ED25519 = jwt.get_algorithm_by_name("EdDSA").to_jwk(
    ed25519.Ed25519PrivateKey.generate().public_key(), as_dict=True
)


def test_no_symmetric_algorithm_is_ever_accepted() -> None:
    assert not [alg for alg in ASYMMETRIC_ALGORITHMS if alg.startswith("HS") or alg == "none"]


@pytest.mark.parametrize(
    ("jwk", "algorithms"),
    [
        (RSA, ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")),
        ({**RSA, "alg": "PS256"}, ("PS256",)),
        (P384, ("ES384",)),
        ({**P384, "alg": "ES384", "use": "sig"}, ("ES384",)),
        (ED25519, ("EdDSA",)),
    ],
)
def test_a_key_verifies_its_types_algorithms_or_its_label(
    jwk: dict[str, Any], algorithms: tuple[str, ...]
) -> None:
    assert key_algorithms(jwk) == algorithms
    key = signing_key({**jwk, "kid": "k"})
    assert key.algorithms == algorithms and key.kid == "k"
    assert key.for_algorithm(algorithms[0]) is not None
    assert key.for_algorithm("HS256") is None and key.for_algorithm(None) is None


@pytest.mark.parametrize(
    ("jwk", "reason"),
    [
        ({**RSA, "alg": "HS256"}, "is labelled 'HS256' (this api verifies RS256, "),
        ({**RSA, "alg": "ES256"}, "is labelled 'ES256' but is an RSA key"),
        ({**P384, "alg": "ES256"}, "is labelled 'ES256' but is an EC key on P-384"),
        ({**ED25519, "alg": "Ed25519"}, "is labelled 'Ed25519' (this api verifies "),
        ({"kty": "oct", "k": "c2VjcmV0"}, "is a symmetric (oct) key"),
        ({**P384, "crv": "secp256k1"}, "is an EC key on the curve 'secp256k1'"),
        ({**RSA, "use": "enc"}, "is for 'enc', not for signatures"),
        ({"kty": "AKP", "alg": "ML-DSA-44"}, "is of the type 'AKP'"),
        ({"kty": "RSA", "n": "!!", "e": "AQAB"}, "cannot be read"),
    ],
)
def test_a_key_that_verifies_nothing_says_why(jwk: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnusableKey) as unusable:
        signing_key(jwk)
    assert reason in str(unusable.value)
