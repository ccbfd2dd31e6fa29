"""The outbox's two halves directly against the database: the dispatcher's leases (a few in
flight per target, none twice) and one attempt's outcomes (redirects are not followed, a stale
lease records nothing)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.delivery import outbox
from agent_engine.delivery.receiver import WebhookReceiver
from agent_engine.delivery.signing import new_secret
from agent_engine.domain.delivery import DeliveryStatus
from tests.integration.runs.support import fetch
from tests.support.factories import Factories


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(follow_redirects=False) as http:
        yield http


async def _pending(engine: AsyncEngine, factories: Factories, url: str, runs: int) -> list[int]:
    """`runs` finished runs of one agent with one target: one pending delivery each."""
    agent = await factories.agent()
    async with engine.begin() as conn:
        target = (
            await conn.execute(
                text(
                    "INSERT INTO delivery_targets (name, url, secret_env)"
                    " VALUES ('t', :url, 'OUTBOX_TEST_SECRET') RETURNING id"
                ),
                {"url": url},
            )
        ).scalar_one()
        await conn.execute(
            text("INSERT INTO agent_delivery_targets (agent_id, target_id) VALUES (:a, :t)"),
            {"a": agent["id"], "t": target},
        )
    for _ in range(runs):
        await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
    rows = await fetch(engine, "SELECT id FROM run_deliveries WHERE target_id = :t", t=target)
    return sorted(int(r["id"]) for r in rows)


async def test_the_dispatcher_leases_a_few_per_target_and_never_one_twice(
    engine: AsyncEngine, factories: Factories
) -> None:
    first = await _pending(engine, factories, "https://a.example.com/", 5)
    second = await _pending(engine, factories, "https://b.example.com/", 1)
    sent: list[tuple[int, str]] = []
    now = datetime.now(UTC) + timedelta(seconds=1)

    chosen = await outbox.dispatch_due(
        engine, now=now, enqueue=lambda d, t: sent.append((d, t)), per_target=2
    )
    assert sorted(chosen) == sorted([*first[:2], *second])
    assert [d for d, _ in sent] == chosen
    # While those leases hold, the next tick sends the rest of the first target only as slots free.
    again = await outbox.dispatch_due(engine, now=now, enqueue=lambda d, t: None, per_target=2)
    assert again == []
    later = now + outbox.LEASE + timedelta(seconds=1)
    expired = await outbox.dispatch_due(engine, now=later, enqueue=lambda d, t: None, per_target=2)
    assert len(expired) == 3  # two of the first target again (leases ran out), the second's one


async def test_a_redirect_is_not_followed_and_a_stale_lease_records_nothing(
    engine: AsyncEngine,
    factories: Factories,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = new_secret()
    monkeypatch.setenv("OUTBOX_TEST_SECRET", secret)
    with WebhookReceiver(secret, statuses=[307]) as receiver:
        (delivery,) = await _pending(engine, factories, receiver.url, 1)
        sent: list[str] = []
        await outbox.dispatch_due(
            engine,
            now=datetime.now(UTC) + timedelta(seconds=1),
            enqueue=lambda d, t: sent.append(t),
        )
        attempt = await outbox.deliver(engine, client, delivery, sent[0])
        assert attempt is not None and attempt.status is DeliveryStatus.PENDING
        assert attempt.status_code == 307 and "not followed" in (attempt.error or "")
        # The same message again (a duplicate): its lease was used up, nothing is sent.
        assert await outbox.deliver(engine, client, delivery, sent[0]) is None
        assert len(receiver.received) == 1
    (row,) = await fetch(engine, "SELECT * FROM run_deliveries WHERE id = :d", d=delivery)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, 307)
    assert row["next_attempt_at"] is not None and row["lease_token"] is None
