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
- only asymmetric keys are kept (RSA, EC): a symmetric (`oct`) key in the set is ignored, so no
  token is ever checked with HS256 against published key material.

When a fetch fails the last good set keeps serving (an identity provider's hiccup does not lock
everyone out); with no good set at all, tokens are refused with `JwksUnavailable` and `/readyz`
says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import jwt
from jwt import PyJWK

log = logging.getLogger(__name__)

# Algorithms a key from the set may carry (the key decides, the token's header must match); a
# PEM public key (api/auth.py) accepts the same.
ASYMMETRIC_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"]
FETCH_TIMEOUT_SECONDS = 5.0
MAX_JWKS_BYTES = 1_000_000


class JwksUnavailable(Exception):
    """No key set could be fetched yet (the identity provider is unreachable or answers badly)."""


class UnknownKey(Exception):
    """The token's `kid` is not in the (freshly fetched, or recently fetched) key set."""


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
        self._keys: dict[str, PyJWK] = {}
        self._fetched = False  # a good set has been read at least once
        self._good_at = -float("inf")  # when the current set was read
        self._tried_at = -float("inf")  # when the last fetch (good or not) finished
        self._fetches = 0  # fetches started (tests and logs)
        self.generation = 0  # key sets read: what was verified with an older one is checked again
        self._last_error: str | None = None
        self._lock = asyncio.Lock()

    @property
    def fetches(self) -> int:
        return self._fetches

    async def key_for(self, kid: str | None) -> PyJWK:
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
        raise UnknownKey(f"no signing key with kid {kid!r}" if kid else "the token has no `kid`")

    async def status(self) -> JwksStatus:
        """For /readyz: a set is held (fetching one now if none is, rate-limited)."""
        if not self._fetched and self._clock() - self._tried_at >= self._refetch_seconds:
            with contextlib.suppress(JwksUnavailable):
                await self._refresh(since=self._tried_at)
        if not self._fetched:
            return JwksStatus(False, f"unreachable: {self._last_error or 'not fetched yet'}")
        if self._last_error is not None:
            return JwksStatus(True, f"ok (serving the last good key set; {self._last_error})")
        return JwksStatus(True, "ok")

    def _find(self, kid: str | None) -> PyJWK | None:
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
                keys = await self._fetch()
            except Exception as exc:
                self._last_error = _describe(exc)
                log.warning("jwks: could not fetch %s: %s", self.url, self._last_error)
                raise_unavailable = not self._fetched
            else:
                self._keys, self._fetched, self._good_at = keys, True, self._clock()
                self.generation += 1
                self._last_error = None
                raise_unavailable = False
                log.info("jwks: %d signing keys from %s", len(keys), self.url)
            finally:
                self._tried_at = self._clock()
            if raise_unavailable:
                raise JwksUnavailable(self._last_error or "the key set could not be fetched")

    async def _fetch(self) -> dict[str, PyJWK]:
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
        keys: dict[str, PyJWK] = {}
        for entry in data["keys"]:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = PyJWK(entry)
            except jwt.PyJWTError as exc:
                log.info("jwks: skipping a key of %s: %s", self.url, exc)
                continue
            if key.algorithm_name not in ASYMMETRIC_ALGORITHMS:
                continue  # e.g. an `oct` (HS256) key: never trusted from a published set
            keys[str(entry.get("kid", ""))] = key
        if not keys:
            raise ValueError("the key set holds no RSA or EC signing key")
        return keys


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "no answer in time"
    if isinstance(exc, httpx.HTTPError):
        return f"unreachable ({type(exc).__name__})"
    return str(exc) or type(exc).__name__


__all__ = ["ASYMMETRIC_ALGORITHMS", "JwksKeys", "JwksStatus", "JwksUnavailable", "UnknownKey"]
