"""Fallback models: a step whose model is down is answered by the next model of its chain.

The fake OpenAI server serves every model; failure scripts per model (`fail_model`) take one
down. Each test reads what a user sees: the run's state, its steps (which model answered, the
`fallback` flag), its cost, the fallback counter of /metrics.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.demo.seed import DEMO_DOWN_MODEL_NAME, seed_demo
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.observability.metrics import database_snapshot
from agent_engine.runs.request import Enqueue, request_run
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeReply,
    FakeToolCall,
    ModelFailure,
    bad_request,
    context_too_long,
    error_reply,
    hang,
    rate_limited,
    text_reply,
    tool_reply,
    unavailable,
)
from agent_engine.workers.broker import enqueue_execute
from agent_engine.workers.main import EngineWorker
from tests.integration.runs.support import (
    FAKE_KEY_ENV,
    eventually,
    execute_run,
    fetch,
    run_row,
)
from tests.support.factories import Factories

BREAKER_SECONDS = 1.0


@pytest.fixture
async def runtime(engine: AsyncEngine) -> AsyncIterator[Runtime]:
    async with Runtime(
        engine,
        model_timeout_seconds=0.5,
        rate_limit_wait_seconds=0.3,
        breaker_open_seconds=BREAKER_SECONDS,
    ) as rt:
        yield rt


async def model(
    factories: Factories,
    fake: FakeOpenAIServer,
    name: str,
    *,
    fallback: int | None = None,
    prices: tuple[str, str] | None = None,
    base_url: str | None = None,
    **values: Any,
) -> int:
    row = await factories.model(
        name=name,
        provider="openai",
        model=name.lower(),
        base_url=base_url or fake.base_url,
        api_key_env=FAKE_KEY_ENV,
        fallback_model_id=fallback,
        input_price_per_million=Decimal(prices[0]) if prices else None,
        output_price_per_million=Decimal(prices[1]) if prices else None,
        **values,
    )
    return int(row["id"])


async def run_on(
    engine: AsyncEngine, factories: Factories, model_id: int, *, enqueue: Enqueue | None = None
) -> int:
    agent = await factories.agent(model_id=model_id)
    row = await request_run(
        engine,
        agent["id"],
        trigger=RunTrigger.MANUAL,
        now=datetime.now(UTC),
        enqueue=enqueue or (lambda _: None),
    )
    return row.id


async def steps(engine: AsyncEngine, run_id: int) -> list[tuple[str, str, bool]]:
    rows = await fetch(
        engine,
        "SELECT kind, name, fallback FROM agent_run_steps WHERE run_id = :r ORDER BY index",
        r=run_id,
    )
    return [(r["kind"], r["name"], r["fallback"]) for r in rows]


async def fallback_counts(engine: AsyncEngine) -> dict[tuple[str, str, str], float]:
    async with engine.connect() as conn:
        families = await database_snapshot(conn)
    (family,) = [f for f in families if f.name == "agent_engine_model_fallbacks"]
    return {
        (s.labels["model"], s.labels["fallback"], s.labels["cause"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there any more


async def test_a_step_whose_model_is_down_is_answered_by_the_fallback_priced_at_its_prices(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    backup = await model(factories, fake_openai, "Backup", prices=("10", "20"))
    primary = await model(factories, fake_openai, "Primary", fallback=backup, prices=("1", "2"))
    run_id = await run_on(engine, factories, primary)

    def answer(body: dict[str, Any]) -> FakeReply:
        if body["model"] == "primary":
            if len(body["messages"]) > 2:  # the second model call: the primary is down now
                return error_reply(503, "overloaded")
            return tool_reply(
                FakeToolCall("no_such_tool", {}), prompt_tokens=100, completion_tokens=10
            )
        return text_reply("Answered by the backup.", prompt_tokens=200, completion_tokens=20)

    fake_openai.script(answer)
    state = await execute_run(engine, runtime, run_id)

    assert state is RunState.SUCCEEDED
    row = await run_row(engine, run_id)
    assert row["output"] == "Answered by the backup."
    assert await steps(engine, run_id) == [
        ("model_call", "primary", False),
        ("tool_call", "no_such_tool", False),
        ("model_call", "backup", True),
    ]
    # The same conversation went to the backup as to the primary's failed tries.
    last_to_primary = fake_openai.requests_for("primary")[-1]
    (to_backup,) = fake_openai.requests_for("backup")
    assert to_backup["messages"] == last_to_primary["messages"]
    assert to_backup["tools"] == last_to_primary["tools"]
    # Each step at the prices of the model that answered it.
    assert row["tokens_used"] == 330
    assert row["cost"] == Decimal("0.00252")  # (100*1 + 10*2 + 200*10 + 20*20) / 1e6
    assert (await fallback_counts(engine)) == {("Primary", "Backup", "server_error"): 1.0}


@pytest.mark.parametrize(
    "failure", [bad_request(), context_too_long()], ids=["400", "context-too-long"]
)
async def test_a_request_the_model_refused_never_falls_back(
    engine: AsyncEngine,
    runtime: Runtime,
    fake_openai: FakeOpenAIServer,
    factories: Factories,
    failure: ModelFailure,
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    run_id = await run_on(engine, factories, primary)
    fake_openai.fail_model("primary", failure)

    state = await execute_run(engine, runtime, run_id)

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["reason"], row["error"]) == (
        "error",
        "model 'Primary' failed: the provider refused the request (HTTP 400)",
    )
    assert fake_openai.requests_for("backup") == []
    assert len(fake_openai.requests_for("primary")) == 1
    assert await fallback_counts(engine) == {}


async def test_refused_credentials_do_not_fall_back(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    run_id = await run_on(engine, factories, primary)
    fake_openai.fail_model("primary", ModelFailure(error_reply(401, "bad key")))

    assert await execute_run(engine, runtime, run_id) is RunState.FAILED
    assert "refused the credentials (HTTP 401)" in (await run_row(engine, run_id))["error"]
    assert fake_openai.requests_for("backup") == []


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        (rate_limited(), "rate_limited"),
        (unavailable(), "server_error"),
        (hang(), "timeout"),
        (None, "unreachable"),
    ],
    ids=["429-forever", "503-forever", "hang", "unreachable"],
)
async def test_each_kind_of_outage_falls_back_and_is_counted_by_cause(
    engine: AsyncEngine,
    runtime: Runtime,
    fake_openai: FakeOpenAIServer,
    factories: Factories,
    failure: ModelFailure | None,
    cause: str,
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    url = closed_port_url() if failure is None else None
    primary = await model(factories, fake_openai, "Primary", fallback=backup, base_url=url)
    if failure is not None:
        fake_openai.fail_model("primary", failure)
    fake_openai.script(lambda body: text_reply(f"from {body['model']}"))
    run_id = await run_on(engine, factories, primary)

    assert await execute_run(engine, runtime, run_id) is RunState.SUCCEEDED

    assert (await run_row(engine, run_id))["output"] == "from backup"
    assert await steps(engine, run_id) == [("model_call", "backup", True)]
    assert await fallback_counts(engine) == {("Primary", "Backup", cause): 1.0}


async def test_a_fallback_that_is_down_too_hands_on_to_the_next_of_the_chain(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    third = await model(factories, fake_openai, "Third")
    second = await model(factories, fake_openai, "Second", fallback=third)
    first = await model(factories, fake_openai, "First", fallback=second)
    fake_openai.fail_model("first", unavailable())
    fake_openai.fail_model("second", rate_limited())
    fake_openai.script(lambda body: text_reply(f"from {body['model']}"))
    run_id = await run_on(engine, factories, first)

    assert await execute_run(engine, runtime, run_id) is RunState.SUCCEEDED

    assert await steps(engine, run_id) == [("model_call", "third", True)]
    assert await fallback_counts(engine) == {
        ("First", "Second", "server_error"): 1.0,
        ("Second", "Third", "rate_limited"): 1.0,
    }


async def test_when_the_last_model_fails_too_the_run_fails_naming_each(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    fake_openai.fail_model("primary", unavailable())
    fake_openai.fail_model("backup", bad_request())
    run_id = await run_on(engine, factories, primary)

    assert await execute_run(engine, runtime, run_id) is RunState.FAILED

    error = (await run_row(engine, run_id))["error"]
    assert error.startswith("model 'Backup' failed: the provider refused the request (HTTP 400)")
    assert "model 'Primary' the provider failed (HTTP 503)" in error
    assert fake_openai.base_url not in error


async def test_the_breaker_skips_a_model_known_down_then_tries_it_again_and_it_recovers(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    fake_openai.fail_model("primary", unavailable())
    fake_openai.script(lambda body: text_reply(f"from {body['model']}"))

    first = await run_on(engine, factories, primary)
    assert await execute_run(engine, runtime, first) is RunState.SUCCEEDED
    tried = len(fake_openai.requests_for("primary"))
    assert tried >= 1

    # Known down: the next runs go straight to the backup, the primary is not asked.
    for _ in range(3):
        run_id = await run_on(engine, factories, primary)
        assert await execute_run(engine, runtime, run_id) is RunState.SUCCEEDED
        assert await steps(engine, run_id) == [("model_call", "backup", True)]
    assert len(fake_openai.requests_for("primary")) == tried
    counts = await fallback_counts(engine)
    assert counts[("Primary", "Backup", "breaker_open")] == 3.0

    # It recovers; after the breaker's time one call tries it, and it answers again.
    fake_openai.fail_model("primary", None)
    await asyncio.sleep(BREAKER_SECONDS + 0.1)
    again = await run_on(engine, factories, primary)
    assert await execute_run(engine, runtime, again) is RunState.SUCCEEDED
    assert await steps(engine, again) == [("model_call", "primary", False)]
    assert (await run_row(engine, again))["output"] == "from primary"
    following = await run_on(engine, factories, primary)
    assert await execute_run(engine, runtime, following) is RunState.SUCCEEDED
    assert await steps(engine, following) == [("model_call", "primary", False)]


async def test_a_model_without_fallback_is_always_tried_even_while_known_down(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    # The same endpoint and model on the list again, without a fallback.
    alone = int(
        (
            await factories.model(
                name="Primary alone",
                provider="openai",
                model="primary",
                base_url=fake_openai.base_url,
                api_key_env=FAKE_KEY_ENV,
            )
        )["id"]
    )
    fake_openai.fail_model("primary", unavailable(times=40))
    fake_openai.script(lambda body: text_reply(f"from {body['model']}"))
    first = await run_on(engine, factories, primary)
    assert await execute_run(engine, runtime, first) is RunState.SUCCEEDED  # breaker opens
    before = len(fake_openai.requests_for("primary"))

    run_id = await run_on(engine, factories, alone)
    state = await execute_run(engine, runtime, run_id)

    assert state is RunState.SUCCEEDED  # waited out the 503s: it has nothing else
    assert len(fake_openai.requests_for("primary")) > before  # tried while known down
    assert (await run_row(engine, run_id))["output"] == "from primary"
    assert len(fake_openai.requests_for("backup")) == 1  # the first run's only
    assert await steps(engine, run_id) == [("model_call", "primary", False)]


async def test_fifty_runs_fall_back_under_the_models_limits(
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    factories: Factories,
    worker: EngineWorker,
) -> None:
    """50 runs of a primary limited to 5 whose endpoint is unreachable, beside 10 runs of its
    backup limited to 2: every run finishes, the primary's runs on the backup. Each limit holds
    for the runs of its model; a fallback call is made inside its run's slot (of the primary),
    so the backup sees at most 5 + 2 calls at once."""
    backup = await model(factories, fake_openai, "Backup", max_concurrent_runs=2)
    primary = await model(
        factories,
        fake_openai,
        "Primary",
        fallback=backup,
        base_url=closed_port_url(),
        max_concurrent_runs=5,
    )
    fake_openai.script(lambda body: text_reply(f"from {body['model']}", delay_seconds=0.05))
    peaks = {primary: 0, backup: 0}
    sampling = True

    async def sample() -> None:
        while sampling:
            for model_id in peaks:
                (row,) = await fetch(
                    engine,
                    "SELECT count(*) AS n FROM agent_runs"
                    " WHERE model_id = :m AND state = 'running'",
                    m=model_id,
                )
                peaks[model_id] = max(peaks[model_id], int(row["n"]))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    primary_runs = [
        await run_on(engine, factories, primary, enqueue=enqueue_execute) for _ in range(50)
    ]
    backup_runs = [
        await run_on(engine, factories, backup, enqueue=enqueue_execute) for _ in range(10)
    ]

    async def all_finished() -> bool:
        (row,) = await fetch(
            engine,
            "SELECT count(*) AS n FROM agent_runs WHERE id = ANY(:ids) AND finished_at IS NULL",
            ids=primary_runs + backup_runs,
        )
        return int(row["n"]) == 0

    await eventually(all_finished, within=120, what="all 60 runs to finish")
    sampling = False
    await sampler

    rows = await fetch(
        engine,
        "SELECT r.id, r.state, r.output, s.name, s.fallback FROM agent_runs r"
        " JOIN agent_run_steps s ON s.run_id = r.id WHERE r.id = ANY(:ids) ORDER BY r.id",
        ids=primary_runs + backup_runs,
    )
    by_run = {r["id"]: (r["state"], r["output"], r["name"], r["fallback"]) for r in rows}
    assert {by_run[i] for i in primary_runs} == {("succeeded", "from backup", "backup", True)}
    assert {by_run[i] for i in backup_runs} == {("succeeded", "from backup", "backup", False)}
    assert 1 <= peaks[primary] <= 5
    assert 1 <= peaks[backup] <= 2
    assert fake_openai.max_active_for("backup") <= 7
    counts = await fallback_counts(engine)
    assert sum(counts.values()) == 50
    # The breaker: after the first runs found it down, the rest skipped it without trying.
    assert counts[("Primary", "Backup", "breaker_open")] >= 40


async def test_the_demos_unreachable_model_falls_back_to_the_builtin_digest(
    engine: AsyncEngine, runtime: Runtime
) -> None:
    demo = await seed_demo(engine, now=datetime.now(UTC))
    (down,) = await fetch(
        engine,
        "SELECT id, fallback_model_id FROM agent_models WHERE name = :n",
        n=DEMO_DOWN_MODEL_NAME,
    )
    assert down["fallback_model_id"] == demo.model_id
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET model_id = :m WHERE id = :a"),
            {"m": down["id"], "a": demo.agent_id},
        )
    row = await request_run(
        engine,
        demo.agent_id,
        trigger=RunTrigger.MANUAL,
        now=datetime.now(UTC),
        enqueue=lambda _: None,
    )

    assert await execute_run(engine, runtime, row.id) is RunState.SUCCEEDED

    model_calls = [s for s in await steps(engine, row.id) if s[0] == "model_call"]
    assert model_calls and all(s == ("model_call", "builtin-digest", True) for s in model_calls)
    assert (await run_row(engine, row.id))["output"]


async def test_a_short_outage_is_waited_out_on_the_model_itself(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, factories: Factories
) -> None:
    """503 for three calls, then answers: within the model's wait, so no fallback."""
    backup = await model(factories, fake_openai, "Backup")
    primary = await model(factories, fake_openai, "Primary", fallback=backup)
    fake_openai.fail_model("primary", unavailable(times=3))
    fake_openai.script(lambda body: text_reply(f"from {body['model']}"))
    run_id = await run_on(engine, factories, primary)

    assert await execute_run(engine, runtime, run_id) is RunState.SUCCEEDED

    assert (await run_row(engine, run_id))["output"] == "from primary"
    assert await steps(engine, run_id) == [("model_call", "primary", False)]
    assert len(fake_openai.requests_for("primary")) == 4
    assert fake_openai.requests_for("backup") == []
    assert await fallback_counts(engine) == {}
