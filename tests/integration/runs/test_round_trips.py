"""What a one-call run costs the database, counted on the wire (a relay in front of PostgreSQL):
the request in one statement; the claim in one, the finish in one, and the budget-alert check (a
sum and an insert) only once the owner's week has reached a threshold —
and the one-statement request and claim keep every refusal their transactions make (budget, gate,
a run unfinished, settings changed since)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.engine import create_engine_for_url
from agent_engine.db.platform import WEEKLY_TOKEN_CAP
from agent_engine.db.runs import RunRow
from agent_engine.domain.gate import AgentNotStartable, Lock
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs.request import AgentNotFound, request_run
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.runs.support import FakeAgent, execute_run, fetch, run_row
from tests.integration.runs.test_execute import queued_run
from tests.support.factories import Factories
from tests.support.pg_wire import RoundTrips, counting_relay

MAX_ROUND_TRIPS_PER_RUN = 3


@pytest.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[AsyncEngine, RoundTrips]]:
    """An engine of one pooled connection through the counting relay (as a worker's, no
    pre-ping)."""
    async with counting_relay(database_url) as (url, trips):
        engine = create_engine_for_url(url, pool_size=1, pre_ping=False, max_overflow=0)
        try:
            yield engine, trips
        finally:
            await engine.dispose()


async def _run_once(
    engine: AsyncEngine, counted: AsyncEngine, runtime: Runtime, agent_id: int
) -> tuple[int, RunState | None]:
    run_id = await queued_run(engine, agent_id)
    return run_id, await execute_run(counted, runtime, run_id)


async def test_a_one_call_run_costs_two_round_trips_until_its_week_reaches_an_alert(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    counted: tuple[AsyncEngine, RoundTrips],
) -> None:
    counted_engine, trips = counted
    await factories.setting(WEEKLY_TOKEN_CAP, 1_000_000)
    agent = await fake_agent()
    fake_openai.script(lambda _: text_reply("Done.", prompt_tokens=30, completion_tokens=12))

    async def measured() -> tuple[int, RunState | None, int]:
        # Warm: the first claim after a settings change reads them in its transaction, and the
        # connection prepares each statement once.
        await _run_once(engine, counted_engine, runtime, agent["id"])
        trips.count = 0
        run_id, state = await _run_once(engine, counted_engine, runtime, agent["id"])
        return run_id, state, trips.count

    async with Runtime(counted_engine) as runtime:
        await _run_once(engine, counted_engine, runtime, agent["id"])
        run_id, state, under_cap = await measured()  # 42 of 1,000,000 tokens: no alert near
        await factories.setting(WEEKLY_TOKEN_CAP, None)
        _, _, without_cap = await measured()
        # 210 tokens spent; the next run reaches 80 % of the cap (240), the one after it is over
        # that threshold still.
        await factories.setting(WEEKLY_TOKEN_CAP, 300)
        _, reached_state, reached = await measured()

    assert state is RunState.SUCCEEDED
    row = await run_row(engine, run_id)
    assert (row["state"], row["output"], row["tokens_used"]) == ("succeeded", "Done.", 42)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (30, 12)
    steps = await fetch(engine, "SELECT * FROM agent_run_steps WHERE run_id = :r", r=run_id)
    assert [(s["index"], s["kind"], s["output"], s["finished_at"] is not None) for s in steps] == [
        (0, "model_call", "Done.", True)
    ]
    # The claim and the finish: the finish returns the owner's week with the run, under every
    # threshold, so no budget-alert check follows.
    assert under_cap == 2 <= MAX_ROUND_TRIPS_PER_RUN, trips.statements
    assert without_cap == 2
    assert reached_state is RunState.SUCCEEDED
    # Reached: the check's sum and its (idempotent) insert after the commit, as before.
    assert reached == 4, trips.statements
    alerts = await fetch(engine, "SELECT percent, used_tokens FROM budget_alerts")
    assert [(a["percent"], a["used_tokens"]) for a in alerts] == [(80, 252)]


async def test_the_one_statement_claim_refuses_what_the_transaction_refuses(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    runtime: Runtime,
) -> None:
    owner = await factories.user()
    agent = await fake_agent(user_id=owner["id"])
    sibling = await fake_agent(user_id=owner["id"])
    await factories.setting(WEEKLY_TOKEN_CAP, 100)
    # Warm: this process has seen these settings.
    run_id, state = await _run_once(engine, engine, runtime, agent["id"])
    assert state is RunState.SUCCEEDED
    spent = (await run_row(engine, run_id))["tokens_used"]

    async def claimed_after(
        meanwhile: Callable[[], Awaitable[None]],
    ) -> tuple[int, RunState | None]:
        run_id = await queued_run(engine, agent["id"])
        await meanwhile()
        return run_id, await execute_run(engine, runtime, run_id)

    # The week's spend reached the cap after the request (the settings unchanged): skipped.
    async def spend() -> None:
        await factories.run(sibling["id"], state="succeeded", tokens_used=100, finished_at=now())

    run_id, state = await claimed_after(spend)
    assert state is RunState.SKIPPED
    assert (await run_row(engine, run_id))["reason"] == "budget_exceeded"

    # The cap raised since this process last read it: the stored value counts.
    await factories.setting(WEEKLY_TOKEN_CAP, 10_000)
    run_id, state = await _run_once(engine, engine, runtime, agent["id"])
    assert state is RunState.SUCCEEDED

    # Lowered after the request: refused with the stored cap, not the one seen last.
    async def lower() -> None:
        await factories.setting(WEEKLY_TOKEN_CAP, 100 + spent)

    run_id, state = await claimed_after(lower)
    assert state is RunState.SKIPPED

    # The gate closed after the request: failed at the claim, the model never called.
    await factories.setting(WEEKLY_TOKEN_CAP, None)
    calls = fake_openai.request_count

    async def lock() -> None:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE agents SET admin_paused = true WHERE id = :a"), {"a": agent["id"]}
            )

    run_id, state = await claimed_after(lock)
    assert state is RunState.FAILED
    assert "admin" in (await run_row(engine, run_id))["error"].lower()
    assert fake_openai.request_count == calls


def now() -> datetime:
    return datetime.now(UTC)


# --- the request ---------------------------------------------------------------------------------


async def _request(engine: AsyncEngine, agent_id: int, sent: list[int]) -> RunRow:
    return await request_run(
        engine, agent_id, trigger=RunTrigger.MANUAL, now=now(), enqueue=sent.append
    )


async def _finish(engine: AsyncEngine, run_id: int, tokens: int = 0) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE agent_runs SET state = 'succeeded', tokens_used = :t, started_at = now(),"
                " finished_at = now() WHERE id = :r"
            ),
            {"r": run_id, "t": tokens},
        )


async def test_a_manual_request_costs_one_round_trip_once_the_settings_are_seen(
    engine: AsyncEngine, factories: Factories, counted: tuple[AsyncEngine, RoundTrips]
) -> None:
    counted_engine, trips = counted
    await factories.setting(WEEKLY_TOKEN_CAP, 1_000_000)
    agent = await factories.agent()
    sent: list[int] = []
    # Warm: settings this process has not seen are read in the transaction, and remembered.
    await factories.setting(WEEKLY_TOKEN_CAP, 2_000_000)
    await _finish(engine, (await _request(counted_engine, agent["id"], sent)).id)

    trips.count = 0
    row = await _request(counted_engine, agent["id"], sent)
    at_once = trips.count

    assert (row.state, row.trigger, row.reason) == ("queued", "manual", None)
    assert sent[-1] == row.id
    assert at_once == 1, trips.statements


async def test_the_one_statement_request_refuses_what_the_transaction_refuses(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"])
    sibling = await factories.agent(user_id=owner["id"])
    await factories.setting(WEEKLY_TOKEN_CAP, 100)
    sent: list[int] = []
    await _finish(engine, (await _request(engine, agent["id"], sent)).id)  # settings seen

    # A run is unfinished: journaled skipped, no message.
    queued = await _request(engine, agent["id"], sent)
    assert queued.state == "queued"
    again = await _request(engine, agent["id"], sent)
    assert (again.state, again.reason) == ("skipped", "already_running")
    assert sent[-1] == queued.id
    await _finish(engine, queued.id)

    # The week's spend reached the cap: skipped for the budget.
    await factories.run(sibling["id"], state="succeeded", tokens_used=100, finished_at=now())
    spent = await _request(engine, agent["id"], sent)
    assert (spent.state, spent.reason) == ("skipped", "budget_exceeded")

    # The cap raised since this process last saw it: the stored cap counts.
    await factories.setting(WEEKLY_TOKEN_CAP, 10_000)
    raised = await _request(engine, agent["id"], sent)
    assert raised.state == "queued" and sent[-1] == raised.id
    await _finish(engine, raised.id)

    # ... and lowered again: refused with the stored cap, not the one seen last.
    await factories.setting(WEEKLY_TOKEN_CAP, 50)
    lowered = await _request(engine, agent["id"], sent)
    assert (lowered.state, lowered.reason) == ("skipped", "budget_exceeded")

    # The gate closed: refused, nothing written.
    await factories.setting(WEEKLY_TOKEN_CAP, None)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET admin_paused = true WHERE id = :a"), {"a": agent["id"]}
        )
    journaled = await fetch(
        engine, "SELECT count(*) AS n FROM agent_runs WHERE agent_id = :a", a=agent["id"]
    )
    with pytest.raises(AgentNotStartable) as refused:
        await _request(engine, agent["id"], sent)
    assert refused.value.lock is Lock.ADMIN_PAUSED
    assert (
        await fetch(
            engine, "SELECT count(*) AS n FROM agent_runs WHERE agent_id = :a", a=agent["id"]
        )
        == journaled
    )
    with pytest.raises(AgentNotFound):
        await _request(engine, 999_999_999, sent)
