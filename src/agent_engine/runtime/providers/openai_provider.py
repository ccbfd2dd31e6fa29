"""`openai` provider: any OpenAI-compatible Chat Completions endpoint via the official SDK.

The API key is never stored: the model row names the environment variable that holds it. Servers
that need no key (vLLM, Ollama) get a placeholder, because the SDK insists on one.

Where the SDK's client would connect directly (no proxy in the environment), the chat call is
one HTTP/1.1 exchange on the provider's own keep-alive connections (`WireCall` over
`wire.WirePool`): the request the SDK would send (its default and auth headers, built once by its
client), the body serialised with orjson, the reply read as a dict — about a tenth of the CPU of
the SDK's generic call (`bench/model_call_ab.py`). Otherwise, and with `direct=False`, it is a thin
POST over the SDK client's own `httpx2` client (`ThinCall`), which also follows the redirects the
wire hands back. What the SDK does well is kept either way: its error classes and their mapping
(`_make_status_error_from_response`: `APIStatusError` subclasses with the provider's body;
`APITimeoutError`; `APIConnectionError` for transport failures and truncated bodies), its
decoders for compressed replies, and its client for proxies, so the retry policy and the run's
error below read the same exceptions as before. A reply whose JSON does not parse fails as the
SDK's parsing failed (the same exception). `thin=False` sends through the SDK's generic
`post(..., cast_to=ChatCompletion)` instead, the reference the tests compare with.

Retries are ours, not the SDK's (its client is made with `max_retries=0`): a `429` or `503` (rate
limit, overload) is waited out — `Retry-After` when the provider sends one, else exponential
backoff with jitter — for as long as the run's wall clock allows (`ModelRequest.deadline`), since
the SDK's two quick retries end a run in the middle of a Monday-morning burst. Other transient
failures (connection, timeout, 408/409/5xx) get `MAX_RETRIES` more attempts; `400`/`401`/`404`…
fail at once. The run's error says the kind of failure (`failure_kind`), never the endpoint or
the reply's body: those go to the worker log. Only answered calls report usage, so only they
count.

The three calls (`WireCall`, `ThinCall`, `SdkCall`) and the reading of a reply live in
`openai_calls.py`; this module keeps the provider: its clients, the retry policy, the errors.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import os
import random
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx2  # the SDK's HTTP client (its dependency)
import openai

from agent_engine.bounded_reads import BodyTooLarge
from agent_engine.runtime.providers import wire
from agent_engine.runtime.providers.backoff import backoff_seconds, retry_after_seconds
from agent_engine.runtime.providers.base import (
    CAUSE_RATE_LIMITED,
    CAUSE_SERVER_ERROR,
    CAUSE_TIMEOUT,
    CAUSE_UNREACHABLE,
    ModelReply,
    ModelRequest,
    ProviderError,
)
from agent_engine.runtime.providers.openai_calls import (
    CHAT_COMPLETIONS_PATH as CHAT_COMPLETIONS_PATH,
)
from agent_engine.runtime.providers.openai_calls import (
    MAX_MODEL_REPLY_BYTES as MAX_MODEL_REPLY_BYTES,
)
from agent_engine.runtime.providers.openai_calls import WIRE_MAX_CONNECTIONS as WIRE_MAX_CONNECTIONS
from agent_engine.runtime.providers.openai_calls import (
    SdkCall,
    ThinCall,
    WireCall,
    connects_directly,
    wire_pool,
)

log = logging.getLogger(__name__)

# One way of making the chat call: the body and the request in, the reply out.
_Call = Callable[[dict[str, Any], ModelRequest], Awaitable[ModelReply]]

# Retries of transient failures other than rate limits (what the SDK did by itself before).
MAX_RETRIES = 2
# Waited out for as long as the run's wall clock allows.
RATE_LIMIT_STATUSES = frozenset({429, 503})
TRANSIENT_STATUSES = frozenset({408, 409, 500, 502, 504})
# Without a deadline from the run (a direct caller), rate limits are waited out this long.
DEFAULT_RATE_LIMIT_PATIENCE_SECONDS = 600.0
# When calls go through the SDK's client (a proxy, or `direct=False`): its HTTP connection pool
# (httpcore) walks all its connections on every request event, so
# with hundreds of calls in flight that walk is the worker's largest CPU cost: calls are spread
# round-robin over several clients (one per endpoint and key otherwise), each holding about this
# many connections. At 50 the walk (and its `poll` of each idle connection) was still ~45 % of the
# model call's CPU with 200 calls in flight (stampede profile); 16: ~20 % less CPU per call; 8:
# another ~4 % of the worker's CPU per run (stampede quick, interleaved pairs).
CONNECTIONS_PER_CLIENT = 8
PLACEHOLDER_API_KEY = "not-needed"
MAX_ERROR_DETAIL_CHARS = 500


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's TLS context for model endpoints (the CA store loaded once, shared by every
    provider and key). A worker makes it at start (`warm_up`), not inside its first burst."""
    return httpx2.create_ssl_context()


def warm_up() -> None:
    """Load what the first model call would otherwise load in the middle of a burst: the HTTP
    stack's modules (httpx2 imports httpcore2 and h11 on first use) and the TLS context."""
    tls_context()


def api_key_from_env(api_key_env: str | None) -> str:
    if api_key_env:
        value = os.environ.get(api_key_env)
        if value:
            return value
    return PLACEHOLDER_API_KEY


class OpenAIProvider:
    def __init__(
        self,
        *,
        base_url: str | None,
        api_key_env: str | None,
        timeout_seconds: float,
        max_retries: int = MAX_RETRIES,
        concurrency: int = 1,
        thin: bool = True,
        direct: bool = True,
    ) -> None:
        """`concurrency`: how many calls may be in flight at once (the worker's in-flight
        limit); it sizes the set of clients the calls are spread over when they go through the
        SDK's client. `thin=False`: through the SDK's own request path (the reference of the
        thin call); `direct=False`: the thin call over the SDK's client, not the wire."""
        self.base_url = base_url
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self._rng = random.Random()
        # One TLS context for all of them: loading the CA store costs ~0.2 s of CPU and a few MiB.
        tls = tls_context()

        def sdk_client() -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key_from_env(api_key_env),
                timeout=timeout_seconds,
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(verify=tls),
            )

        first = sdk_client()
        self._pool: wire.WirePool | None = None
        if thin and direct and connects_directly(first):
            # One client for what the wire leaves to it (redirects, compressed replies).
            self._clients = [first]
            thin_call = ThinCall(first)
            self._pool = wire_pool(thin_call, tls)
            self._calls: list[_Call] = [WireCall(thin_call, self._pool)]
        else:
            clients = max(1, math.ceil(concurrency / CONNECTIONS_PER_CLIENT))
            self._clients = [first, *(sdk_client() for _ in range(clients - 1))]
            self._calls = [ThinCall(c) if thin else SdkCall(c) for c in self._clients]
        self._next_call = itertools.cycle(self._calls)

    @property
    def _where(self) -> str:
        return self.base_url or "the OpenAI API"

    async def complete(self, request: ModelRequest) -> ModelReply:
        body: dict[str, Any] = {"model": request.model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = (
            request.deadline
            if request.deadline is not None
            else started + DEFAULT_RATE_LIMIT_PATIENCE_SECONDS
        )
        attempt = 0  # retries so far
        transient_retries = 0
        call = next(self._next_call)
        while True:
            try:
                return await call(body, request)
            except BodyTooLarge as exc:
                # Not retried: the same endpoint would send the same again.
                log.warning(
                    "model %r at %s answered more than %d bytes",
                    request.model,
                    self._where,
                    exc.limit_bytes,
                )
                raise ProviderError(f"its answer is larger than {exc.limit_bytes} bytes") from exc
            except openai.OpenAIError as exc:
                down = down_cause(exc)
                failure = ProviderError(
                    failure_kind(exc, timeout_seconds=self.timeout_seconds), down=down
                )
                rate_limited = (
                    isinstance(exc, openai.APIStatusError)
                    and exc.status_code in RATE_LIMIT_STATUSES
                )
                retryable = rate_limited or (
                    _transient(exc) and transient_retries < self.max_retries
                )
                if not retryable:
                    self._log_failure(exc, request, attempts=attempt + 1)
                    raise failure from exc
                if down is not None and request.give_up is not None and request.give_up():
                    # Known down meanwhile (other calls failed too): its fallback answers now.
                    self._log_failure(exc, request, attempts=attempt + 1)
                    raise failure from exc
                attempt += 1
                transient_retries += 0 if rate_limited else 1
                wait = _wait_seconds(exc, attempt, self._rng)
                if loop.time() + wait >= deadline:
                    waited = loop.time() - started
                    self._log_failure(exc, request, attempts=attempt)
                    raise ProviderError(
                        f"{failure}; gave up after {attempt} attempts over {waited:.0f} s: the"
                        f" next try ({wait:.0f} s away) would pass the run's wall-clock limit",
                        down=down,
                    ) from exc
                log.info(
                    "model %r at %s answered %s; retrying in %.1f s (attempt %d)",
                    request.model,
                    self._where,
                    getattr(exc, "status_code", type(exc).__name__),
                    wait,
                    attempt + 1,
                )
                await asyncio.sleep(wait)

    def _log_failure(
        self, exc: openai.OpenAIError, request: ModelRequest, *, attempts: int
    ) -> None:
        """The journal's `error` holds the kind of failure only (`failure_kind`): owners read it,
        so it never names the endpoint (an admin's setting) nor repeats the reply's body (a
        remote chose it). Both go to the worker log, where the worker bound the run's id."""
        log.warning(
            "model %r at %s failed after %d attempts: %s",
            request.model,
            self._where,
            attempts,
            _log_detail(exc),
            extra={"model": request.model, "model_url": self._where, "attempts": attempts},
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
        for client in self._clients:
            await client.close()


def _transient(exc: openai.OpenAIError) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in TRANSIENT_STATUSES
    return isinstance(exc, openai.APIConnectionError)  # includes APITimeoutError


def down_cause(exc: openai.OpenAIError) -> str | None:
    """Why the model counts as down after this failure (a fallback may answer), or None for a
    request it refused: 400 (bad request, context too long, content filter), 404, 422, and
    401/403 — refused credentials are a configuration error of this model, which the admin
    must see and fix, not hide behind another model's answers (and bill)."""
    if isinstance(exc, openai.APITimeoutError):
        return CAUSE_TIMEOUT
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code == 429:
            return CAUSE_RATE_LIMITED
        if code >= 500 or code in (408, 409):
            return CAUSE_SERVER_ERROR
        return None
    if isinstance(exc, openai.APIConnectionError):
        return CAUSE_UNREACHABLE
    return None


def _wait_seconds(exc: openai.OpenAIError, attempt: int, rng: random.Random) -> float:
    if isinstance(exc, openai.APIStatusError):
        asked = retry_after_seconds(exc.response.headers, now=datetime.now(UTC))
        if asked is not None:
            return asked
    return backoff_seconds(attempt, rng=rng)


def failure_kind(exc: openai.OpenAIError, *, timeout_seconds: float) -> str:
    """The kind of a failed call in words an owner understands (no URL, host or body)."""
    if isinstance(exc, openai.APITimeoutError):
        return f"timed out (no answer within {timeout_seconds:g} s)"
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code in (401, 403):
            return f"the provider refused the credentials (HTTP {code})"
        if code == 429:
            return "rate limited by the provider (HTTP 429)"
        if code >= 500:
            return f"the provider failed (HTTP {code})"
        return f"the provider refused the request (HTTP {code})"
    if isinstance(exc, openai.APIConnectionError):
        return "the provider is unreachable"
    return "bad response from the provider"


def _log_detail(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {_detail(exc)}"
    cause = exc.__cause__
    return f"{type(exc).__name__}: {exc}" + (f" ({cause!r})" if cause is not None else "")


def _detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    message: object = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
    text = str(message or exc.message or "no detail")
    return text[:MAX_ERROR_DETAIL_CHARS]
