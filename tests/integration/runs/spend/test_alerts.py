"""Budget alerts: recorded once per owner, week and threshold when finishing runs cross it, seen
live on the subscription, listed by the queries, counted in /metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.api.subscriptions.support import GraphQLWs, Server, acknowledged_client
from tests.integration.runs.spend.support import (
    ADMIN_ID,
    SETTINGS,
    create_agent,
    fake_model,
    run_to_the_end,
    start_run,
)
from tests.integration.runs.support import eventually, fetch
from tests.integration.runs.transcript.support import Gql

OWNER, OTHER = 7, 8
RUNS = 8
TOKENS_PER_RUN = 15  # the fake's default usage: 10 prompt + 5 completion
QUIET_SECONDS = 1.0

ALERTS = """subscription { budgetAlerts { id percent usedTokens capTokens windowStart crossedAt
  owner { id } } }"""
VIEWER_ALERTS = "{ viewer { budgetAlerts { id percent usedTokens capTokens } } }"
ADMIN_ALERTS = """query Alerts($owner: ID) {
  adminBudgetAlerts(ownerId: $owner) { id percent owner { id } } }"""


async def wait_alert_subscribers(server: Server, count: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while server.subscribers_of("budgetAlerts") != count:
        assert time.monotonic() < deadline, f"{server.subscribers_of('budgetAlerts')} subscribers"
        await asyncio.sleep(0.02)


async def alerts_received(ws: GraphQLWs, count: int) -> list[dict[str, Any]]:
    return [(await ws.next_data("a"))["budgetAlerts"] for _ in range(count)]


async def test_racing_runs_record_each_threshold_once_and_it_is_seen_live(
    gql: Gql,
    server: Server,
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
) -> None:
    cap = RUNS * TOKENS_PER_RUN
    await gql.data(
        SETTINGS,
        {"input": {"weeklyTokenCap": cap, "budgetAlertPercents": [50, 100]}},
        as_user=ADMIN_ID,
        admin=True,
    )
    model = await fake_model(gql, fake_openai.base_url)
    agents = [await create_agent(gql, OWNER, model, name=f"a{i}") for i in range(RUNS)]
    # Slow replies: the runs are in flight together and finish within moments of each other.
    fake_openai.script(lambda _request: text_reply("ok", delay_seconds=0.5))

    async with (
        acknowledged_client(server, gql.token(OWNER)) as owner_ws,
        acknowledged_client(server, gql.token(OTHER)) as other_ws,
        acknowledged_client(server, gql.token(1, admin=True)) as admin_ws,
    ):
        for ws in (owner_ws, other_ws, admin_ws):
            await ws.subscribe("a", ALERTS)
        await wait_alert_subscribers(server, 3)
        runs = await asyncio.gather(*(start_run(gql, OWNER, agent) for agent in agents))
        finished = await asyncio.gather(*(gql.finished_run(run, as_user=OWNER) for run in runs))
        seen_by_owner = await alerts_received(owner_ws, 2)
        seen_by_admin = await alerts_received(admin_ws, 2)
        await owner_ws.nothing_for(QUIET_SECONDS)
        await admin_ws.nothing_for(0)
        await other_ws.nothing_for(0)

    assert [run["state"] for run in finished] == ["SUCCEEDED"] * RUNS
    rows = await fetch(engine, "SELECT started_at, finished_at FROM agent_runs")
    # They raced: every run had started before the first one finished.
    assert max(r["started_at"] for r in rows) < min(r["finished_at"] for r in rows)
    stored = await fetch(engine, "SELECT * FROM budget_alerts ORDER BY percent")
    assert [(a["owner_id"], a["percent"], a["cap_tokens"]) for a in stored] == [
        (OWNER, 50, cap),
        (OWNER, 100, cap),
    ]
    assert stored[1]["used_tokens"] == cap
    assert cap // 2 <= stored[0]["used_tokens"] <= cap
    by_percent = {alert["percent"]: alert for alert in seen_by_owner}
    assert set(by_percent) == {50, 100}
    assert by_percent[100]["usedTokens"] == cap and by_percent[100]["capTokens"] == cap
    assert by_percent[100]["owner"] == {"id": str(OWNER)}
    assert {a["id"] for a in seen_by_admin} == {a["id"] for a in seen_by_owner}
    assert {a["id"] for a in seen_by_owner} == {str(a["id"]) for a in stored}

    listed = (await gql.data(VIEWER_ALERTS, as_user=OWNER))["viewer"]["budgetAlerts"]
    assert [(a["percent"], a["usedTokens"]) for a in listed] == [
        (50, stored[0]["used_tokens"]),
        (100, cap),
    ]
    assert (await gql.data(VIEWER_ALERTS, as_user=OTHER))["viewer"]["budgetAlerts"] == []
    newest_first = (
        await gql.data(ADMIN_ALERTS, {"owner": str(OWNER)}, as_user=ADMIN_ID, admin=True)
    )["adminBudgetAlerts"]
    assert [int(a["id"]) for a in newest_first] == sorted((a["id"] for a in stored), reverse=True)
    assert (await gql.data(ADMIN_ALERTS, {"owner": str(OTHER)}, as_user=ADMIN_ID, admin=True))[
        "adminBudgetAlerts"
    ] == []
    denied = await gql.body(ADMIN_ALERTS, {"owner": str(OWNER)}, as_user=OWNER)
    assert denied["errors"][0]["extensions"]["code"] == "FORBIDDEN"

    metrics = (await gql.http.get(f"{server.url}/metrics")).text
    assert 'agent_engine_budget_alerts_total{percent="50"} 1.0' in metrics
    assert 'agent_engine_budget_alerts_total{percent="100"} 1.0' in metrics


async def test_one_run_past_two_thresholds_records_both(
    gql: Gql, engine: AsyncEngine, fake_openai: FakeOpenAIServer, worker: dramatiq.Worker
) -> None:
    await gql.data(
        SETTINGS,
        {"input": {"weeklyTokenCap": TOKENS_PER_RUN, "budgetAlertPercents": [50, 100]}},
        as_user=ADMIN_ID,
        admin=True,
    )
    agent = await create_agent(gql, OWNER, await fake_model(gql, fake_openai.base_url))

    await run_to_the_end(gql, OWNER, agent)

    # The worker records thresholds right after the finish it just committed.
    await alerts_recorded(engine, 2)
    listed = (await gql.data(VIEWER_ALERTS, as_user=OWNER))["viewer"]["budgetAlerts"]
    assert [(a["percent"], a["usedTokens"], a["capTokens"]) for a in listed] == [
        (50, TOKENS_PER_RUN, TOKENS_PER_RUN),
        (100, TOKENS_PER_RUN, TOKENS_PER_RUN),
    ]


async def test_a_cap_change_records_only_the_thresholds_newly_crossed_on_the_next_finish(
    gql: Gql, engine: AsyncEngine, fake_openai: FakeOpenAIServer, worker: dramatiq.Worker
) -> None:
    await gql.data(
        SETTINGS,
        {"input": {"weeklyTokenCap": 20, "budgetAlertPercents": [50, 100]}},
        as_user=ADMIN_ID,
        admin=True,
    )
    agent = await create_agent(gql, OWNER, await fake_model(gql, fake_openai.base_url))

    await run_to_the_end(gql, OWNER, agent)  # 15 of 20: past 50 %
    await alerts_recorded(engine, 1)
    assert [a["percent"] for a in await stored_alerts(engine)] == [50]

    # A lower cap alone records nothing: only a finishing run does.
    await gql.data(SETTINGS, {"input": {"weeklyTokenCap": 16}}, as_user=ADMIN_ID, admin=True)
    assert [a["percent"] for a in await stored_alerts(engine)] == [50]

    await run_to_the_end(gql, OWNER, agent)  # 30 of 16: past 100 %, 50 % not again
    alerts = await alerts_recorded(engine, 2)
    assert [(a["percent"], a["used_tokens"], a["cap_tokens"]) for a in alerts] == [
        (50, 15, 20),
        (100, 30, 16),
    ]


async def test_alert_thresholds_and_currency_are_validated_settings(gql: Gql) -> None:
    current = await gql.data(
        "{ platformSettings { currency budgetAlertPercents } }", as_user=ADMIN_ID, admin=True
    )
    assert current == {"platformSettings": {"currency": "USD", "budgetAlertPercents": [80, 100]}}

    changed = await gql.data(
        SETTINGS,
        {"input": {"currency": "eur", "budgetAlertPercents": []}},
        as_user=ADMIN_ID,
        admin=True,
    )
    assert changed["updatePlatformSettings"]["currency"] == "EUR"
    assert changed["updatePlatformSettings"]["budgetAlertPercents"] == []

    for field, value in (
        ("currency", "EURO"),
        ("currency", "XYZ"),
        ("currency", None),
        ("budgetAlertPercents", [100, 80]),
        ("budgetAlertPercents", [50, 50]),
        ("budgetAlertPercents", [0, 50]),
        ("budgetAlertPercents", [101]),
        ("budgetAlertPercents", None),
    ):
        body = await gql.body(SETTINGS, {"input": {field: value}}, as_user=1, admin=True)
        (error,) = body["errors"]
        assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": f"input.{field}"}, value
    unchanged = await gql.data(
        "{ platformSettings { currency budgetAlertPercents } }", as_user=ADMIN_ID, admin=True
    )
    assert unchanged == {"platformSettings": {"currency": "EUR", "budgetAlertPercents": []}}


async def stored_alerts(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await fetch(engine, "SELECT * FROM budget_alerts ORDER BY percent")


async def alerts_recorded(engine: AsyncEngine, count: int) -> list[dict[str, Any]]:
    """The stored alerts once there are `count` of them (a few more must not appear meanwhile)."""

    async def probe() -> list[dict[str, Any]] | None:
        alerts = await stored_alerts(engine)
        return alerts if len(alerts) >= count else None

    return list(await eventually(probe, what=f"{count} budget alerts"))
