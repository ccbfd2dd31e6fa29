"""Bearer-token authentication and just-in-time user provisioning.

Tokens are JWTs, verified by one `TokenVerifier` per api process (HTTP and WebSocket alike):
against the identity provider's JWKS (`AGENT_ENGINE_JWT_JWKS_URL`, `api/jwks.py`), a PEM public key
(RS*, PS*, ES*, EdDSA), or an HS256 secret of at least 32 bytes -- in that order; the first
configured one is the only one used. `exp` is required, a number (RFC 7519's NumericDate, as are
`iat` and `nbf` when present: a string would slip past the lifetime limit) and at most
`AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS` away (a leaked long-lived token is refused); `alg: none` is
never accepted, nor HS256 with a public key.

Only access tokens get in: the header's `typ` must be one of `AGENT_ENGINE_JWT_ACCEPTED_TYPES`
(RFC 9068's `at+jwt`, and `JWT`, which Entra and Keycloak access tokens carry; no `typ` counts as
`JWT`), a token carrying a claim only ID tokens carry (`nonce`, `at_hash`, `c_hash`, `s_hash`, or
Keycloak's `typ: ID`) is refused, and with a JWKS the audience is required (`serve` refuses to
start without it): an ID token's `aud` is the client's id, an access token's the api's.

Claims and the users row they provision: `api/claims.py`.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from jwt import PyJWK
from jwt.warnings import InsecureKeyLengthWarning

from agent_engine.api.claims import MAX_CLAIM_CHARS as MAX_CLAIM_CHARS
from agent_engine.api.claims import Caller as Caller
from agent_engine.api.claims import Claims as Claims
from agent_engine.api.claims import claims_of as claims_of
from agent_engine.api.claims import needs_provisioning as needs_provisioning
from agent_engine.api.claims import provision_user as provision_user
from agent_engine.api.claims import viewer_of as viewer_of
from agent_engine.api.errors import Unauthenticated
from agent_engine.api.jwks import (
    ASYMMETRIC_ALGORITHMS,
    JwksKeys,
    JwksUnavailable,
    UnknownKey,
)
from agent_engine.settings import Settings, media_type

ADMIN_ROLE = "agent_admin"
SYMMETRIC_ALGORITHMS = ["HS256"]
BEARER = "bearer"
MIN_HS256_SECRET_BYTES = 32
# RFC 7519 NumericDate claims: seconds since the epoch, as a JSON number.
NUMERIC_DATE_CLAIMS = ("exp", "iat", "nbf")
# Claims OpenID Connect Core defines for ID tokens only: a token carrying one is not an access
# token, whatever its audience says.
ID_TOKEN_CLAIMS = ("nonce", "at_hash", "c_hash", "s_hash")

_TTL_RE = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(value: str) -> timedelta:
    """`3600`, `30m`, `12h`, `7d` → a positive timedelta."""
    match = _TTL_RE.match(value)
    if not match:
        raise ValueError(f"expected seconds or a number with s/m/h/d, got {value!r}")
    seconds = int(match.group(1)) * _TTL_UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError("the lifetime must be positive")
    return timedelta(seconds=seconds)


def mint_token(
    secret: str,
    *,
    user_id: int,
    email: str | None = None,
    name: str | None = None,
    timezone: str | None = None,
    admin: bool = False,
    ttl: timedelta = timedelta(hours=12),
    now: datetime | None = None,
) -> str:
    """An HS256 development token with the claims the API reads."""
    issued = now or datetime.now(UTC)
    claims: dict[str, Any] = {
        "sub": str(user_id),
        "iat": int(issued.timestamp()),
        "exp": int((issued + ttl).timestamp()),
        "roles": [ADMIN_ROLE] if admin else [],
    }
    if email is not None:
        claims["email"] = email
    if name is not None:
        claims["name"] = name
    if timezone is not None:
        claims["zoneinfo"] = timezone
    with _short_secret_allowed():
        return jwt.encode(claims, secret, algorithm="HS256")


def verification_problem(settings: Settings) -> str | None:
    """Why the api cannot verify tokens safely with these settings (it must not start), or None.
    A short HS256 secret can be brute-forced offline from any token it signed."""
    if settings.jwt_jwks_url and not settings.jwt_audience:
        # Without it any token the provider signs gets in -- an ID token issued to some other
        # client included -- and providers put `aud` in every access token, which PyJWT
        # refuses when no audience is expected.
        return (
            "AGENT_ENGINE_JWT_AUDIENCE is not set: with AGENT_ENGINE_JWT_JWKS_URL it must name "
            "this api as the identity provider knows it (the `aud` of its access tokens: the "
            "resource indicator or application ID URI, e.g. api://agent-engine -- not a "
            "client's id)"
        )
    if settings.jwt_jwks_url or settings.jwt_verification_key():
        return None
    if not settings.jwt_secret:
        return (
            "no token verification key: set AGENT_ENGINE_JWT_SECRET (HS256, at least "
            f"{MIN_HS256_SECRET_BYTES} random bytes, e.g. `openssl rand -base64 32`), "
            "AGENT_ENGINE_JWT_PUBLIC_KEY / AGENT_ENGINE_JWT_PUBLIC_KEY_FILE (RSA, EC or "
            "Ed25519) or AGENT_ENGINE_JWT_JWKS_URL with AGENT_ENGINE_JWT_AUDIENCE (the "
            "identity provider's keys)"
        )
    length = len(settings.jwt_secret.encode())
    if length < MIN_HS256_SECRET_BYTES:
        return (
            f"AGENT_ENGINE_JWT_SECRET is {length} bytes long: it must be at least "
            f"{MIN_HS256_SECRET_BYTES} bytes of random data (e.g. `openssl rand -base64 32`)"
        )
    return None


@contextmanager
def _short_secret_allowed() -> Iterator[None]:
    # PyJWT warns on every call with a short HS256 secret; the operator is warned once at startup.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        yield


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` value; None when there is no header."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != BEARER or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <JWT>'")
    return token.strip()


# Tokens verified lately, by their exact text: a client sends the same token with every request,
# and checking its signature and claims again costs ~0.1 ms of the api's CPU each time. A token is
# answered from here until its `exp` (with the leeway) or for VERIFIED_TOKEN_SECONDS, whichever
# comes first, and only while the identity provider's key set it was checked against is the one
# held: a newly fetched set (a withdrawn key) has every token checked again.
VERIFIED_TOKENS_KEPT = 1024
VERIFIED_TOKEN_SECONDS = 60.0


class TokenVerifier:
    """Verifies bearer tokens for one api process; holds the JWKS cache when one is configured."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        # token -> (answered until, key set generation, its claims); oldest first. Only tokens
        # that passed.
        self._verified: OrderedDict[str, tuple[float, int, Claims]] = OrderedDict()
        self.jwks = (
            JwksKeys(
                settings.jwt_jwks_url,
                cache_seconds=settings.jwt_jwks_cache_seconds,
                refetch_seconds=settings.jwt_jwks_refetch_seconds,
            )
            if settings.jwt_jwks_url
            else None
        )
        self._public_key = None if self.jwks else settings.jwt_verification_key()

    async def verify(self, token: str) -> Claims:
        """Check the signature, `exp` (required, not too far away), that it is an access token,
        and the optional `aud`/`iss`; read the claims. A token that passed lately is answered
        from memory."""
        now = self._clock()
        verified = self._verified.get(token)
        if verified is not None and now < verified[0] and verified[1] == self._key_generation():
            return verified[2]
        claims, exp = await self._verify(token)
        until = now + VERIFIED_TOKEN_SECONDS
        if isinstance(exp, int | float):
            until = min(until, exp + self._settings.jwt_leeway_seconds)
        self._verified[token] = (until, self._key_generation(), claims)
        self._verified.move_to_end(token)
        while len(self._verified) > VERIFIED_TOKENS_KEPT:
            self._verified.popitem(last=False)
        return claims

    def _key_generation(self) -> int:
        return 0 if self.jwks is None else self.jwks.generation

    async def _verify(self, token: str) -> tuple[Claims, Any]:
        """The claims of a token checked in full, and its `exp`."""
        settings = self._settings
        key: str | PyJWK
        if self.jwks is not None:
            key, algorithms = await self._jwks_key(token)
        elif self._public_key:
            key, algorithms = self._public_key, ASYMMETRIC_ALGORITHMS
        elif settings.jwt_secret:
            key, algorithms = settings.jwt_secret, SYMMETRIC_ALGORITHMS
        else:
            raise Unauthenticated("this server has no token verification key configured")
        # The audience is checked below, after the token's kind: an ID token is told it is one.
        options: jwt.types.Options = {"require": ["exp"], "verify_aud": False}
        try:
            with _short_secret_allowed():
                decoded = jwt.decode_complete(
                    token,
                    key,
                    algorithms=algorithms,
                    issuer=settings.jwt_issuer,
                    leeway=settings.jwt_leeway_seconds,
                    options=options,
                )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("the token has expired") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        payload: dict[str, Any] = decoded["payload"]
        _check_numeric_dates(payload)
        _check_access_token(decoded["header"], payload, settings)
        _check_audience(payload, settings.jwt_audience)
        self._check_lifetime(payload)
        return claims_of(payload, settings), payload.get("exp")

    def _check_lifetime(self, payload: dict[str, Any]) -> None:
        exp = payload.get("exp")
        limit = self._settings.jwt_max_lifetime_seconds
        if isinstance(exp, int | float) and exp - self._clock() > (
            limit + self._settings.jwt_leeway_seconds
        ):
            raise Unauthenticated(
                f"the token lives too long: its `exp` is more than {_duration(limit)} away "
                "(AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS); ask for a shorter-lived token"
            )

    async def _jwks_key(self, token: str) -> tuple[PyJWK, list[str]]:
        """The set's key the token names, bound to the token's algorithm when the key may
        verify it (an RSA key without an `alg` label verifies RS* and PS*)."""
        assert self.jwks is not None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthenticated("invalid token: `kid` must be a string")
        try:
            signing = await self.jwks.key_for(kid)
        except JwksUnavailable as exc:
            raise Unauthenticated(
                "cannot verify tokens now: the identity provider's signing keys "
                "(AGENT_ENGINE_JWT_JWKS_URL) could not be fetched; try again later"
            ) from exc
        except UnknownKey as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        # The key decides the algorithms: a token claiming another (e.g. HS256 "signed" with
        # the public key) is refused here, and the decode checks the header against the key's.
        key = signing.for_algorithm(header.get("alg"))
        if key is None:
            raise Unauthenticated(
                f"invalid token: its algorithm (`alg` {_shown(header.get('alg'))}) is not one its "
                f"signing key verifies ({', '.join(signing.algorithms)})"
            )
        return key, [key.algorithm_name]


def _check_numeric_dates(payload: dict[str, Any]) -> None:
    """`exp`, `iat` and `nbf` are JSON numbers (PyJWT reads `"exp": "9999999999"` as a date, and
    a string would then skip the lifetime limit and the WebSocket's closing time)."""
    for claim in NUMERIC_DATE_CLAIMS:
        if claim in payload and not is_numeric_date(payload[claim]):
            raise Unauthenticated(
                f"invalid token: `{claim}` must be a number of seconds since the epoch (an RFC "
                f"7519 NumericDate), not {_json_kind(payload[claim])}"
            )


def is_numeric_date(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _check_access_token(
    header: dict[str, Any], payload: dict[str, Any], settings: Settings
) -> None:
    """An access token for an api, not an ID token: the header's `typ` is an accepted one (no
    `typ` is a plain `JWT`, RFC 7519 §5.1), and no claim only ID tokens carry is present."""
    accepted = settings.jwt_accepted_type_set
    typ = header.get("typ", "JWT")
    if accepted and not (isinstance(typ, str) and media_type(typ) in accepted):
        kind = f"`typ` {_shown(typ)}" if "typ" in header else "no `typ`: a plain JWT"
        raise Unauthenticated(
            f"invalid token: its type ({kind}) is not one this api accepts "
            f"(AGENT_ENGINE_JWT_ACCEPTED_TYPES: {settings.jwt_accepted_types}); send an access "
            "token"
        )
    marks = [f"`{claim}`" for claim in ID_TOKEN_CLAIMS if claim in payload]
    if payload.get("typ") == "ID":  # Keycloak labels its ID tokens so in the payload
        marks.append("`typ: ID`")
    if marks:
        raise Unauthenticated(
            f"invalid token: it is an ID token (it carries {marks[0]}), not an access token; "
            "send an access token issued for this api"
        )


def _check_audience(payload: dict[str, Any], audience: str | None) -> None:
    """`aud` names this api when an audience is set; with none set, a token naming one is
    refused (it was meant for some other service)."""
    aud = payload.get("aud")
    if aud is None:
        if audience is not None:
            raise Unauthenticated(
                "invalid token: it has no audience (`aud`); this api accepts tokens issued for "
                "AGENT_ENGINE_JWT_AUDIENCE only"
            )
        return
    named = [aud] if isinstance(aud, str) else aud
    if not isinstance(named, list) or not all(isinstance(item, str) for item in named):
        raise Unauthenticated("invalid token: `aud` must be a string or a list of strings")
    if audience is None:
        raise Unauthenticated(
            "invalid token: it is issued for an audience (`aud`) but this api has no "
            "AGENT_ENGINE_JWT_AUDIENCE set"
        )
    if audience not in named:
        raise Unauthenticated(
            "invalid token: wrong audience: its `aud` does not name this api "
            "(AGENT_ENGINE_JWT_AUDIENCE)"
        )


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a non-finite number"
    return {str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _shown(value: object) -> str:
    """A header value, quoted and cut short (it is the caller's text)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"
