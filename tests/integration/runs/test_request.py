"""Requesting a run: the start gate, the budget, the one-unfinished-run lock, send after commit."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE, WEEKLY_TOKEN_CAP
from agent_engine.domain.gate import AgentNotStartable, Lock
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.budget import owners_budgets
from agent_engine.runs.request import AgentNotFound, request_run
from tests.support.factories import Factories

# A Wednesday: the budget week (Sunday 00:00 in the organisation zone) started three days ago.
NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)


async def journal(engine: AsyncEngine, agent_id: int) -> list[dict[str, object]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT * FROM agent_runs WHERE agent_id = :a ORDER BY id"), {"a": agent_id}
        )
        return [dict(r._mapping) for r in rows]


async def test_queued_row_then_message_after_commit(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    sent: list[int] = []

    row = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
    )

    assert row.state == "queued"
    assert row.trigger == "manual"
    assert row.reason is None
    assert row.created_at == NOW
    assert sent == [row.id]
    assert [r["id"] for r in await journal(engine, agent["id"])] == [row.id]


@pytest.mark.parametrize(
    ("values", "lock"),
    [
        ({"enabled": False}, Lock.DISABLED),
        ({"admin_paused": True}, Lock.ADMIN_PAUSED),
        ({"model_id": None}, Lock.NO_MODEL),
    ],
)
async def test_closed_gate_refuses_and_writes_nothing(
    engine: AsyncEngine, factories: Factories, values: dict[str, object], lock: Lock
) -> None:
    agent = await factories.agent(**values)
    sent: list[int] = []

    with pytest.raises(AgentNotStartable) as refused:
        await request_run(
            engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
        )

    assert refused.value.lock == lock
    assert await journal(engine, agent["id"]) == []
    assert sent == []


async def test_unknown_agent(engine: AsyncEngine) -> None:
    with pytest.raises(AgentNotFound):
        await request_run(engine, 999_999, trigger=RunTrigger.MANUAL, now=NOW, enqueue=print)


async def test_fifty_simultaneous_starts_leave_one_unfinished_run(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    sent: list[int] = []

    rows = await asyncio.gather(
        *(
            request_run(
                engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
            )
            for _ in range(50)
        )
    )

    states = sorted((r.state, r.reason) for r in rows)
    assert states.count(("queued", None)) == 1
    assert states.count(("skipped", "already_running")) == 49
    queued = next(r for r in rows if r.state == "queued")
    assert sent == [queued.id]
    stored = await journal(engine, agent["id"])
    assert len(stored) == 50
    for skipped in (r for r in stored if r["state"] == "skipped"):
        assert skipped["tokens_used"] == 0
        assert skipped["started_at"] is None
        assert skipped["finished_at"] == NOW


async def test_a_finished_run_does_not_block_the_next(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    await factories.run(agent["id"], state="succeeded", finished_at=NOW - timedelta(hours=1))

    row = await request_run(engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=print)

    assert row.state == "queued"


async def test_spent_budget_skips_until_next_week_counting_all_the_owners_agents(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    other_owner = await factories.user()
    busy = await factories.agent(user_id=owner["id"])
    quiet = await factories.agent(user_id=owner["id"])
    stranger = await factories.agent(user_id=other_owner["id"])
    await factories.setting(WEEKLY_TOKEN_CAP, 1000)
    # Spent this week by the owner's *other* agent; last week's spend does not count.
    await factories.run(
        busy["id"], state="succeeded", tokens_used=600, finished_at=NOW - timedelta(days=1)
    )
    await factories.run(
        busy["id"], state="failed", reason="error", tokens_used=400, finished_at=NOW
    )
    await factories.run(
        quiet["id"], state="succeeded", tokens_used=5000, finished_at=NOW - timedelta(days=7)
    )
    sent: list[int] = []

    refused = await request_run(
        engine, quiet["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
    )
    other = await request_run(
        engine, stranger["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
    )
    next_week = await request_run(
        engine,
        quiet["id"],
        trigger=RunTrigger.SCHEDULED,
        now=NOW + timedelta(days=7),
        enqueue=sent.append,
    )

    assert (refused.state, refused.reason) == ("skipped", "budget_exceeded")
    assert refused.tokens_used == 0
    assert refused.started_at is None
    assert refused.finished_at == NOW
    assert other.state == "queued"
    assert next_week.state == "queued"
    assert sent == [other.id, next_week.id]


async def test_budget_window_is_the_organisation_week(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user(timezone="Asia/Tokyo")  # the owner's zone does not matter
    agent = await factories.agent(user_id=owner["id"])
    await factories.setting(WEEKLY_TOKEN_CAP, 100)
    await factories.setting(TIMEZONE, "America/New_York")
    # Sunday 2025-03-09 03:30 UTC is still Saturday evening in New York: last week there.
    await factories.run(
        agent["id"],
        state="succeeded",
        tokens_used=70,
        finished_at=datetime(2025, 3, 9, 3, 30, tzinfo=UTC),
    )
    await factories.run(
        agent["id"],
        state="succeeded",
        tokens_used=40,
        finished_at=datetime(2025, 3, 9, 6, 0, tzinfo=UTC),
    )

    async with engine.connect() as conn:
        budget = (await owners_budgets(conn, [owner["id"]], now=NOW))[owner["id"]]
        many = await owners_budgets(conn, [owner["id"], 424242], now=NOW)

    assert budget.used_tokens == 40
    assert budget.cap_tokens == 100
    assert not budget.exceeded
    assert many[owner["id"]].used_tokens == 40
    assert many[424242].used_tokens == 0


async def test_a_failed_send_keeps_the_committed_run_for_the_reaper(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()

    def broker_down(run_id: int) -> None:
        raise ConnectionError("broker unreachable")

    row = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=broker_down
    )

    assert row.state == "queued"
    assert [r["state"] for r in await journal(engine, agent["id"])] == ["queued"]


class _SlowBroker:
    """An `Enqueue` with `many`, as the Redis sender: each send takes a broker round trip's time
    (in the sender thread), and every call is recorded with the ids it carried."""

    def __init__(self, seconds: float, *, fail_first: bool = False) -> None:
        self.seconds = seconds
        self.calls: list[list[int]] = []
        self.fail_first = fail_first

    def __call__(self, run_id: int) -> None:
        self.many([run_id])

    def many(self, run_ids: list[int]) -> None:
        time.sleep(self.seconds)
        self.calls.append(list(run_ids))
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("broker unreachable")


async def test_simultaneous_starts_share_sends_and_each_returns_once_its_message_is_taken(
    engine: AsyncEngine, factories: Factories
) -> None:
    agents = [await factories.agent() for _ in range(30)]
    broker = _SlowBroker(0.05)
    taken_when_returned: dict[int, bool] = {}

    async def start(agent_id: int) -> int:
        row = await request_run(
            engine, agent_id, trigger=RunTrigger.MANUAL, now=NOW, enqueue=broker
        )
        taken_when_returned[row.id] = any(row.id in call for call in broker.calls)
        return row.id

    run_ids = await asyncio.gather(*(start(a["id"]) for a in agents))

    sent = [run_id for call in broker.calls for run_id in call]
    assert sorted(sent) == sorted(run_ids)  # each message once
    assert all(taken_when_returned.values())
    # While one send is in flight, the starts committed meanwhile wait and go out together.
    assert len(broker.calls) < len(run_ids), broker.calls


async def test_a_failed_shared_send_leaves_its_runs_queued_and_the_next_start_sends(
    engine: AsyncEngine, factories: Factories
) -> None:
    first, second = await factories.agent(), await factories.agent()
    broker = _SlowBroker(0.0, fail_first=True)

    lost = await request_run(
        engine, first["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=broker
    )
    sent = await request_run(
        engine, second["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=broker
    )

    assert (lost.state, sent.state) == ("queued", "queued")
    assert broker.calls == [[lost.id], [sent.id]]  # the failure did not stop the sender
    assert [r["state"] for r in await journal(engine, first["id"])] == ["queued"]
