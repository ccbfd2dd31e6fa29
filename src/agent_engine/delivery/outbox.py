"""Sending the outbox: the dispatcher hands due deliveries to the `deliver` actor, which makes one
attempt and records it.

The outbox rows are written by the database in the run's finishing transaction (the
`agent_runs_on_finish` trigger, see schema/database.sql), whatever path ended the run. Each clock
tick the dispatcher claims the pending deliveries that are due and not leased -- at most
`per_target` in flight per target, across all workers -- gives each a fresh lease token and sends
one message per delivery.
Only the message carrying the current token may record the attempt, so a duplicate or a late
message changes nothing. A lost message or a worker that died mid-attempt leaves the lease to
expire, and the next tick sends the delivery again: nothing is lost, attempts may repeat (the
receiver deduplicates by `webhook-id`, the same on every attempt).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import deliveries
from agent_engine.delivery.signing import SecretProblem, body_bytes, load_secret, signed_headers
from agent_engine.domain.delivery import (
    ATTEMPT_TIMEOUT,
    CONCURRENCY_PER_TARGET,
    RETRY_SCHEDULE,
    DeliveryStatus,
    retry_delay,
)

log = logging.getLogger(__name__)

EnqueueDelivery = Callable[[int, str], None]

# How long a dispatched delivery is left to its message before it is dispatched again: the
# attempt's timeout plus room for a queue backlog.
LEASE = timedelta(seconds=60)
DISPATCH_LIMIT = 500
ERROR_BODY_CHARS = 300
USER_AGENT = "agent-engine-webhooks/1"


async def dispatch_due(
    engine: AsyncEngine,
    *,
    now: datetime,
    enqueue: EnqueueDelivery,
    per_target: int = CONCURRENCY_PER_TARGET,
    lease: timedelta = LEASE,
    limit: int = DISPATCH_LIMIT,
) -> list[int]:
    """Lease the due deliveries (within each target's concurrency) and send their messages."""
    async with engine.begin() as conn:
        in_flight = await deliveries.in_flight_by_target(conn, now=now)
        chosen: list[int] = []
        for due in await deliveries.lock_due(conn, now=now, limit=limit):
            if in_flight[due.target_id] < per_target:
                in_flight[due.target_id] += 1
                chosen.append(due.id)
        tokens = [uuid.uuid4().hex for _ in chosen]
        if chosen:
            await deliveries.lease(conn, chosen, tokens, until=now + lease)
    for delivery_id, token in zip(chosen, tokens, strict=True):
        try:
            enqueue(delivery_id, token)
        except Exception:
            # The lease expires and a later tick sends it again.
            log.warning("could not send delivery %s", delivery_id, exc_info=True)
    return chosen


@dataclass(frozen=True)
class Attempt:
    status: DeliveryStatus
    status_code: int | None
    error: str | None


async def deliver(
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    delivery_id: int,
    token: str,
    *,
    now_fn: Callable[[], datetime] = lambda: datetime.now(UTC),
    schedule: Sequence[timedelta] = RETRY_SCHEDULE,
    attempt_timeout: timedelta = ATTEMPT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
) -> Attempt | None:
    """One attempt of a leased delivery; None when the lease is no longer this message's."""
    async with engine.connect() as conn:
        row = await deliveries.load_leased(conn, delivery_id, token)
    if row is None:
        return None
    attempt_number = row.attempts + 1
    target = f"target {row.target_name!r}"
    try:
        webhook = load_secret(row.secret_env, environ)
    except SecretProblem as exc:
        # A configuration error, not a receiver's hiccup: retrying would not help. The owner
        # reads that the target is misconfigured; the variable's name is the admin's (the log).
        log.error("delivery %s to %s: %s", delivery_id, target, exc)
        attempt = Attempt(
            DeliveryStatus.FAILED,
            None,
            f"{target}: its signing secret is not configured on the workers (an admin must fix"
            " it; details in the worker log)",
        )
        await _record(engine, delivery_id, token, attempt, now=now_fn(), next_at=None)
        return attempt
    at = now_fn().astimezone(UTC)
    body = body_bytes(row.payload)
    headers = {
        **signed_headers(webhook, row.webhook_id, at, body),
        "user-agent": USER_AGENT,
    }
    code: int | None = None
    # What the owner reads names the target and the kind of failure; the URL, the redirect's
    # location and the receiver's body are the admin's and go to the worker log.
    detail: str | None = None
    try:
        response = await client.post(
            row.url, content=body, headers=headers, timeout=attempt_timeout.total_seconds()
        )
        code = response.status_code
        if 200 <= code < 300:
            attempt = Attempt(DeliveryStatus.DELIVERED, code, None)
        elif 300 <= code < 400:
            detail = f"redirect to {response.headers.get('location', '?')} not followed"
            error = f"{target} answered a redirect (HTTP {code}), not followed"
            attempt = Attempt(DeliveryStatus.PENDING, code, error)
        else:
            detail = response.text[:ERROR_BODY_CHARS].strip()
            attempt = Attempt(DeliveryStatus.PENDING, code, f"{target} answered HTTP {code}")
    except httpx.TimeoutException as exc:
        detail = f"{type(exc).__name__}: {exc}"
        attempt = Attempt(
            DeliveryStatus.PENDING,
            None,
            f"{target} timed out (no answer within {attempt_timeout.total_seconds():g} s)",
        )
    except httpx.HTTPError as exc:
        detail = f"{type(exc).__name__}: {exc}"
        attempt = Attempt(DeliveryStatus.PENDING, None, f"{target} is unreachable")
    if detail is not None:
        log.warning(
            "delivery %s attempt %d to %s at %s: %s",
            delivery_id,
            attempt_number,
            target,
            row.url,
            detail[:500],
        )
    next_at: datetime | None = None
    if attempt.status is DeliveryStatus.PENDING:
        delay = retry_delay(attempt_number, schedule)
        if delay is None:
            attempt = Attempt(DeliveryStatus.FAILED, attempt.status_code, attempt.error)
        else:
            next_at = now_fn() + delay
    await _record(engine, delivery_id, token, attempt, now=now_fn(), next_at=next_at)
    log.info(
        "delivery %s attempt %d: %s%s",
        delivery_id,
        attempt_number,
        attempt.status,
        f" ({attempt.error})" if attempt.error else "",
    )
    return attempt


async def _record(
    engine: AsyncEngine,
    delivery_id: int,
    token: str,
    attempt: Attempt,
    *,
    now: datetime,
    next_at: datetime | None,
) -> None:
    finished = attempt.status is not DeliveryStatus.PENDING
    async with engine.begin() as conn:
        await deliveries.record_attempt(
            conn,
            delivery_id,
            token,
            status=str(attempt.status),
            status_code=attempt.status_code,
            error=attempt.error,
            delivered_at=now if attempt.status is DeliveryStatus.DELIVERED else None,
            next_attempt_at=next_at,
            finished_at=now if finished else None,
        )
