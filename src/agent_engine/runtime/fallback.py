"""Fallback models and a circuit breaker per model: who answers a model call when its model is
down.

A model call goes to the run's model first. When that model is down after its own retries —
rate-limited past the wait, 5xx, timed out, unreachable (`ProviderError.down`) — the same
request (the same conversation) goes to the next model of its chain (`agent_models.
fallback_model_id`), and so on; the last model's failure is the run's error. A refused request
(400, context too long, content filter, refused credentials) fails at once, as without a chain.

While a model has a next one, its 429 wait is bounded by `rate_limit_wait_seconds` (not the
run's whole wall clock): past it, the fallback answers. A model without a next one waits as it
always did.

The breaker (one per worker process, shared by all its runs): a model that was down (a call
gave up on it, or `OPEN_AFTER_FAILED_ATTEMPTS` attempts in a row failed as down, whichever calls
made them) is *open* for `open_seconds`: calls skip it for the next model of their chain without
trying it, so a model in an outage costs each step nothing. Then it is *half-open*: one call
tries it (the others keep skipping it meanwhile); an answer closes it, another failure opens it
again. The breaker only chooses between models: a model with no next one is always tried. Calls
of a model with a next one that are between retries when its breaker opens stop retrying and go
on to the next model at once (`ModelRequest.give_up`), so an outage does not hold every run in
flight for the whole retry schedule.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.fallback import CHAIN_OF_RUN, MAX_CHAIN
from agent_engine.runtime.context import ModelSpec, RunContext
from agent_engine.runtime.credentials import CredentialGuard
from agent_engine.runtime.providers.base import (
    CAUSE_BREAKER_OPEN,
    ModelProvider,
    ModelReply,
    ModelRequest,
    ProviderError,
)
from agent_engine.runtime.transcript import FallbackAnswer, FallbackHop

log = logging.getLogger(__name__)

# How long a model that was down is skipped before one call tries it again.
DEFAULT_BREAKER_OPEN_SECONDS = 30.0
# How long a model with a fallback waits out 429/503 before its fallback answers.
DEFAULT_RATE_LIMIT_WAIT_SECONDS = 20.0
# Failed attempts in a row (of any calls of the worker) that open a model's breaker.
OPEN_AFTER_FAILED_ATTEMPTS = 5
# How long a worker keeps a model's chain before reading it again (an admin's change is seen
# by every worker within this time).
CHAIN_TTL_SECONDS = 10.0

ModelKey = tuple[str, str | None, str, str | None]
ProviderFor = Callable[[ModelSpec], Awaitable[ModelProvider]]


def model_key(model: ModelSpec) -> ModelKey:
    """What the breaker knows a model by: its endpoint and model name (two list entries for the
    same endpoint and model are down together)."""
    return (model.provider, model.base_url, model.model, model.api_key_env)


def model_label(model: ModelSpec) -> str:
    return model.name or model.model


class ModelBreaker:
    """Per model: closed (tried), open until a time (skipped), half-open (one call tries)."""

    def __init__(self, *, open_seconds: float = DEFAULT_BREAKER_OPEN_SECONDS) -> None:
        self.open_seconds = open_seconds
        self._open_until: dict[ModelKey, float] = {}
        self._probing: dict[ModelKey, float] = {}
        self._streak: dict[ModelKey, int] = {}

    def allows(self, key: ModelKey, *, now: float | None = None) -> bool:
        """May a call try this model now? Closed: yes. Open: no. Half-open: the first caller
        only (it becomes the probe; a probe that never reports is replaced after open_seconds)."""
        until = self._open_until.get(key)
        if until is None:
            return True
        now = time.monotonic() if now is None else now
        if now < until:
            return False
        probe = self._probing.get(key)
        if probe is not None and now < probe + self.open_seconds:
            return False
        self._probing[key] = now
        return True

    def is_open(self, key: ModelKey) -> bool:
        return key in self._open_until

    def attempt_failed(self, key: ModelKey, *, now: float | None = None) -> bool:
        """One attempt failed as down (the call may retry): True when the model is known down
        (its breaker open, now or already), so the call should stop retrying."""
        streak = self._streak.get(key, 0) + 1
        self._streak[key] = streak
        if key in self._open_until:
            return True
        if streak >= OPEN_AFTER_FAILED_ATTEMPTS:
            self.failed(key, now=now)
            return True
        return False

    def succeeded(self, key: ModelKey) -> None:
        self._streak.pop(key, None)
        if self._open_until.pop(key, None) is not None:
            log.info("model %s answers again: its circuit breaker closed", key[2])
        self._probing.pop(key, None)

    def failed(self, key: ModelKey, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if key not in self._open_until:
            log.warning(
                "model %s is down: skipped for %g s where it has a fallback",
                key[2],
                self.open_seconds,
            )
        self._open_until[key] = now + self.open_seconds
        self._probing.pop(key, None)


class ChainFailed(ProviderError):
    """The last model tried after the run's model failed too; `model` is that last one."""

    def __init__(self, model: ModelSpec, message: str, *, down: str | None) -> None:
        super().__init__(message, down=down)
        self.model = model


@dataclass(frozen=True)
class Answer:
    reply: ModelReply
    model: ModelSpec
    # Set when a fallback model answered.
    fallback: FallbackAnswer | None = None


class Fallbacks:
    """The chain reader (cached per model) and the breaker of one Runtime (one per worker)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        breaker_open_seconds: float = DEFAULT_BREAKER_OPEN_SECONDS,
        rate_limit_wait_seconds: float = DEFAULT_RATE_LIMIT_WAIT_SECONDS,
    ) -> None:
        self._engine = engine
        self.breaker = ModelBreaker(open_seconds=breaker_open_seconds)
        self.rate_limit_wait_seconds = rate_limit_wait_seconds
        # The run's model (as the run read it) -> (read at, its chain after it).
        self._chains: dict[ModelSpec, tuple[float, tuple[ModelSpec, ...]]] = {}
        self._reads: dict[ModelSpec, asyncio.Future[tuple[ModelSpec, ...]]] = {}

    async def chain(self, ctx: RunContext) -> tuple[ModelSpec, ...]:
        """The models after the run's model in its chain (empty: no fallback)."""
        if ctx.model.provider == "builtin":
            return ()  # answers in-process: never down
        cached = self._chains.get(ctx.model)
        now = time.monotonic()
        if cached is not None and now - cached[0] < CHAIN_TTL_SECONDS:
            return cached[1]
        reading = self._reads.get(ctx.model)
        if reading is not None:  # one read per model however many runs ask at once
            return await asyncio.shield(reading)
        future: asyncio.Future[tuple[ModelSpec, ...]] = asyncio.get_running_loop().create_future()
        self._reads[ctx.model] = future
        try:
            chain = await self._read_chain(ctx)
        except Exception:
            # The call goes to the run's model as it would without a chain; read again next time.
            log.warning(
                "run %s: could not read its model's fallback chain", ctx.run_id, exc_info=True
            )
            future.set_result(())
            return ()
        except BaseException:  # this run was cancelled: the others waiting go on without
            future.set_result(())
            raise
        finally:
            del self._reads[ctx.model]
        future.set_result(chain)
        self._chains[ctx.model] = (now, chain)
        return chain

    async def _read_chain(self, ctx: RunContext) -> tuple[ModelSpec, ...]:
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(CHAIN_OF_RUN, {"run_id": ctx.run_id, "max_chain": MAX_CHAIN})
            ).all()
        specs = tuple(
            ModelSpec(
                provider=row.provider,
                model=row.model,
                base_url=row.base_url,
                api_key_env=row.api_key_env,
                name=row.name,
                id=int(row.id),
            )
            for row in rows
        )
        if not specs or model_key(specs[0]) != model_key(ctx.model):
            return ()  # the agent's model changed since the run read it: no chain of its own
        return specs[1:]

    async def complete(
        self,
        ctx: RunContext,
        request: ModelRequest,
        *,
        provider_for: ProviderFor,
        credentials: CredentialGuard,
    ) -> Answer:
        """The reply of the first model of the run's chain that answers (see the module doc).
        Raises the last tried model's ProviderError (its message names the models passed over)
        or CredentialRefused."""
        later = await self.chain(ctx)
        models = (ctx.model, *later)
        hops: list[FallbackHop] = []
        passed: list[str] = []
        loop = asyncio.get_running_loop()
        for position, model in enumerate(models):
            has_next = position + 1 < len(models)
            key = model_key(model)
            if has_next and not self.breaker.allows(key):
                hops.append(
                    FallbackHop(
                        model_label(model), model_label(models[position + 1]), CAUSE_BREAKER_OPEN
                    )
                )
                passed.append(f"{_quoted(model)} skipped (down a moment ago)")
                continue
            sent = request
            if has_next:
                patience = loop.time() + self.rate_limit_wait_seconds
                deadline = patience if request.deadline is None else min(request.deadline, patience)
                sent = ModelRequest(
                    model=model.model,
                    messages=request.messages,
                    tools=request.tools,
                    owner_prompt=request.owner_prompt,
                    deadline=deadline,
                    give_up=functools.partial(self.breaker.attempt_failed, key),
                )
            elif position > 0:
                sent = ModelRequest(
                    model=model.model,
                    messages=request.messages,
                    tools=request.tools,
                    owner_prompt=request.owner_prompt,
                    deadline=request.deadline,
                )
            provider = await provider_for(model)
            # Before every send: a key variable the rule refuses never leaves.
            await credentials.check(model.api_key_env, what=model.label)
            try:
                reply = await provider.complete(sent)
            except ProviderError as exc:
                if exc.down is not None:
                    self.breaker.failed(key)
                else:  # it answered (a refusal): it is up, whatever this request's fate
                    self.breaker.succeeded(key)
                if exc.down is None or not has_next:
                    if passed:
                        raise ChainFailed(
                            model, f"{exc} (after {'; '.join(passed)})", down=exc.down
                        ) from exc
                    raise
                hops.append(
                    FallbackHop(model_label(model), model_label(models[position + 1]), exc.down)
                )
                passed.append(f"{_quoted(model)} {exc}")
                # The provider logged the failure (a warning, with its details).
                log.info(
                    "run %s: model %s is down (%s); sending the call to %s",
                    ctx.run_id,
                    model_label(model),
                    exc.down,
                    model_label(models[position + 1]),
                )
                continue
            self.breaker.succeeded(key)
            if position == 0:
                return Answer(reply, model)
            return Answer(reply, model, FallbackAnswer(model.model, model.id, tuple(hops)))
        raise AssertionError("the last model of a chain is always tried")


def _quoted(model: ModelSpec) -> str:
    return f"model {model_label(model)!r}"
