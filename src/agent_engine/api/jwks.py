"""The identity provider's signing keys (`AGENT_ENGINE_JWT_JWKS_URL`), picked by `kid`.

PyJWT's `PyJWKClient` fetches with urllib (it would block the event loop) and fetches again for
every unknown `kid` (anyone could make the api hammer the identity provider by sending tokens with
made-up ids). So the set is fetched here with httpx, asynchronously, and parsed with PyJWT's
`PyJWKSet`:

- a known `kid` is served from the cache for `cache_seconds`, then the set is fetched again;
- an unknown `kid` fetches again -- a key rotation needs no restart -- but at most once every
  `refetch_seconds`; between two, unknown ids are refused at once;
- one fetch at a time: requests arriving during a fetch wait for it instead of sending their own
  (no stampede on the identity provider when a new key appears under load);
- only asymmetric keys are kept (RSA, EC, Ed25519): a symmetric (`oct`) key in the set is
  ignored, so no token is ever checked with HS256 against published key material. A key verifies
  the algorithms its type allows (an RSA key: RS* and PS*; an EC key: the ES* of its curve; an
  Ed25519 key: EdDSA), or only the one its `alg` labels it with.

When a fetch fails the last good set keeps serving (an identity provider's hiccup does not lock
everyone out); with no good set at all, tokens are refused with `JwksUnavailable` and `/readyz`
says why: the provider is unreachable, or its set holds no key this api can verify with (each
key named with the reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from jwt import PyJWK

log = logging.getLogger(__name__)

# What a key of each type verifies (the key decides, the token's header must name one of its
# algorithms): RSA keys sign with PKCS#1 v1.5 or RSA-PSS, EC keys with the curve's own hash. A PEM
# public key (api/auth.py) accepts the same.
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS_BY_CURVE = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
OKP_ALGORITHMS_BY_CURVE = {"Ed25519": "EdDSA"}
ASYMMETRIC_ALGORITHMS = [
    *RSA_ALGORITHMS,
    *EC_ALGORITHMS_BY_CURVE.values(),
    *OKP_ALGORITHMS_BY_CURVE.values(),
]
FETCH_TIMEOUT_SECONDS = 5.0
MAX_JWKS_BYTES = 1_000_000
# Unusable keys named in /readyz and the logs; a set of thousands is summed up after these.
REASONS_SHOWN = 5


class JwksUnavailable(Exception):
    """No key set could be fetched yet (the identity provider is unreachable or answers badly)."""


class UnknownKey(Exception):
    """The token's `kid` is not in the (freshly fetched, or recently fetched) key set."""


class UnusableKey(ValueError):
    """A key of the set that verifies nothing here (its type, curve, use or `alg` label)."""


class UnusableKeySet(ValueError):
    """The provider answered with a set, but not one key in it verifies anything here."""


class SigningKey:
    """One key of the set and the algorithms it may verify. PyJWT binds a key to one algorithm:
    the key is read for the first when the set is (a malformed key is reported with the set),
    for another when a token first uses it (a set of thousands of unlabelled RSA keys is not
    read six times over)."""

    def __init__(self, kid: str, entry: Mapping[str, Any], algorithms: tuple[str, ...]) -> None:
        self.kid = kid
        self.algorithms = algorithms
        self._entry = dict(entry)
        self._bound = {algorithms[0]: PyJWK(self._entry, algorithm=algorithms[0])}

    def for_algorithm(self, algorithm: object) -> PyJWK | None:
        """The key to verify a token whose header names `algorithm`; None when it may not."""
        if not isinstance(algorithm, str) or algorithm not in self.algorithms:
            return None
        if algorithm not in self._bound:
            self._bound[algorithm] = PyJWK(self._entry, algorithm=algorithm)
        return self._bound[algorithm]


def key_algorithms(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """The algorithms a JWK may verify: the one its `alg` names, else every one its type (and
    curve) allows. Raises UnusableKey saying why it verifies none."""
    kty, curve = entry.get("kty"), entry.get("crv")
    if entry.get("use", "sig") != "sig":
        raise UnusableKey(f"is for {_shown(entry.get('use'))}, not for signatures")
    if kty == "RSA":
        allowed: tuple[str, ...] = RSA_ALGORITHMS
    elif kty in ("EC", "OKP"):
        by_curve = EC_ALGORITHMS_BY_CURVE if kty == "EC" else OKP_ALGORITHMS_BY_CURVE
        if curve not in by_curve:
            raise UnusableKey(
                f"is an {kty} key on the curve {_shown(curve)} "
                f"(this api verifies {', '.join(by_curve)})"
            )
        allowed = (by_curve[curve],)
    elif kty == "oct":
        raise UnusableKey("is a symmetric (oct) key: never trusted from a published set")
    else:
        raise UnusableKey(f"is of the type {_shown(kty)} (this api verifies RSA, EC and OKP keys)")
    label = entry.get("alg")
    if label is None:
        return allowed
    if label in allowed:
        return (label,)
    if label in ASYMMETRIC_ALGORITHMS:
        raise UnusableKey(f"is labelled {label!r} but is an {kty} key{_on(curve)}")
    raise UnusableKey(
        f"is labelled {_shown(label)} (this api verifies {', '.join(ASYMMETRIC_ALGORITHMS)})"
    )


def signing_key(entry: Mapping[str, Any]) -> SigningKey:
    """The key a JWK describes, with the algorithms it may verify; UnusableKey when none."""
    algorithms = key_algorithms(entry)
    try:
        return SigningKey(str(entry.get("kid", "")), entry, algorithms)
    except jwt.PyJWTError as exc:
        raise UnusableKey(f"cannot be read ({str(exc)[:120]})") from exc


def _on(curve: object) -> str:
    return f" on {curve}" if isinstance(curve, str) else ""


def _shown(value: object) -> str:
    """A value from the set, quoted and cut short (it is the remote's text)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class JwksStatus:
    ready: bool
    detail: str  # "ok", or why not / what went wrong last


class JwksKeys:
    """One per api process (shared by HTTP requests and WebSocket sessions)."""

    def __init__(
        self,
        url: str,
        *,
        cache_seconds: float = 300.0,
        refetch_seconds: float = 10.0,
        timeout_seconds: float = FETCH_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._cache_seconds = cache_seconds
        self._refetch_seconds = refetch_seconds
        self._timeout_seconds = timeout_seconds
        self._clock = clock
        self._keys: dict[str, SigningKey] = {}
        # kid -> why that key of the last good set verifies nothing (said to its tokens).
        self._unusable: dict[str, str] = {}
        self._fetched = False  # a good set has been read at least once
        self._good_at = -float("inf")  # when the current set was read
        self._tried_at = -float("inf")  # when the last fetch (good or not) finished
        self._fetches = 0  # fetches started (tests and logs)
        self.generation = 0  # key sets read: what was verified with an older one is checked again
        self._last_error: str | None = None
        # The last fetch read a set but none of its keys verifies anything (not "unreachable").
        self._last_set_unusable = False
        self._lock = asyncio.Lock()

    @property
    def fetches(self) -> int:
        return self._fetches

    async def key_for(self, kid: str | None) -> SigningKey:
        """The key the token names; refetches (rate-limited) when it is unknown."""
        if not self._fetched:
            # Never fetched, or every fetch failed: try again, at most once per interval.
            if self._clock() - self._tried_at < self._refetch_seconds:
                raise JwksUnavailable(self._last_error or "the key set could not be fetched")
            await self._refresh(since=self._tried_at)
        elif (
            self._clock() - self._good_at >= self._cache_seconds
            and self._clock() - self._tried_at >= self._refetch_seconds
        ):
            await self._refresh(since=self._tried_at)
        key = self._find(kid)
        if key is not None:
            return key
        if self._clock() - self._tried_at >= self._refetch_seconds:
            await self._refresh(since=self._tried_at)
            key = self._find(kid)
            if key is not None:
                return key
        if not self._fetched:
            raise JwksUnavailable(self._last_error or "the key set could not be fetched")
        if kid is not None and kid in self._unusable:
            raise UnknownKey(f"the signing key {_shown(kid)} {self._unusable[kid]}")
        raise UnknownKey(f"no signing key with kid {kid!r}" if kid else "the token has no `kid`")

    async def status(self) -> JwksStatus:
        """For /readyz: a set is held (fetching one now if none is, rate-limited)."""
        if not self._fetched and self._clock() - self._tried_at >= self._refetch_seconds:
            with contextlib.suppress(JwksUnavailable):
                await self._refresh(since=self._tried_at)
        if not self._fetched:
            what = "unusable" if self._last_set_unusable else "unreachable"
            return JwksStatus(False, f"{what}: {self._last_error or 'not fetched yet'}")
        if self._last_error is not None:
            return JwksStatus(True, f"ok (serving the last good key set; {self._last_error})")
        return JwksStatus(True, "ok")

    def _find(self, kid: str | None) -> SigningKey | None:
        if kid is None:
            # A set of one key may be used without `kid` (some providers omit it).
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    async def _refresh(self, *, since: float) -> None:
        """Fetch the set, unless another caller finished a fetch after `since` (then theirs
        is used: one fetch serves every request that waited for it). Raises JwksUnavailable
        when no good set is held afterwards."""
        async with self._lock:
            if self._tried_at > since:
                if not self._fetched:
                    raise JwksUnavailable(self._last_error or "the key set could not be fetched")
                return
            self._fetches += 1
            try:
                keys, unusable = await self._fetch()
            except Exception as exc:
                self._last_error = _describe(exc)
                self._last_set_unusable = isinstance(exc, UnusableKeySet)
                log.warning("jwks: could not use %s: %s", self.url, self._last_error)
                raise_unavailable = not self._fetched
            else:
                self._keys, self._unusable = keys, unusable
                self._fetched, self._good_at = True, self._clock()
                self.generation += 1
                self._last_error, self._last_set_unusable = None, False
                raise_unavailable = False
                log.info("jwks: %d signing keys from %s", len(keys), self.url)
                if unusable:
                    log.info("jwks: keys left out of %s: %s", self.url, _reasons(unusable))
            finally:
                self._tried_at = self._clock()
            if raise_unavailable:
                raise JwksUnavailable(self._last_error or "the key set could not be fetched")

    async def _fetch(self) -> tuple[dict[str, SigningKey], dict[str, str]]:
        """The usable keys of the set by `kid`, and why each other key is left out."""
        # Streamed under a cap and one deadline for the whole exchange: a provider (or whoever
        # answers at its address) that sends an endless body, or trickles it, holds neither the
        # api's memory nor its fetch slot.
        body = bytearray()
        async with (
            asyncio.timeout(self._timeout_seconds),
            httpx.AsyncClient(timeout=self._timeout_seconds) as client,
            client.stream("GET", self.url, headers={"accept": "application/json"}) as response,
        ):
            response.raise_for_status()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
        data = json.loads(body)
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError("not a JWK set (no `keys` list)")
        keys: dict[str, SigningKey] = {}
        unusable: dict[str, str] = {}
        for entry in data["keys"]:
            if not isinstance(entry, dict):
                continue
            kid = str(entry.get("kid", ""))
            try:
                keys[kid] = signing_key(entry)
            except UnusableKey as exc:
                unusable[kid] = str(exc)
        if not keys:
            raise UnusableKeySet(
                "the JWKS has no key this api can verify with: "
                + (_reasons(unusable) if unusable else "it holds no keys")
            )
        return keys, unusable


def _reasons(unusable: Mapping[str, str]) -> str:
    """`key 'a' is labelled 'HS256'; key 'b' …`, the first few, then how many more."""
    shown = [f"key {_shown(kid)} {why}" for kid, why in list(unusable.items())[:REASONS_SHOWN]]
    if len(unusable) > REASONS_SHOWN:
        shown.append(f"and {len(unusable) - REASONS_SHOWN} more")
    return "; ".join(shown)


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "no answer in time"
    if isinstance(exc, httpx.HTTPError):
        return f"unreachable ({type(exc).__name__})"
    return str(exc) or type(exc).__name__


__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "JwksKeys",
    "JwksStatus",
    "JwksUnavailable",
    "SigningKey",
    "UnknownKey",
    "UnusableKey",
    "UnusableKeySet",
    "key_algorithms",
    "signing_key",
]
