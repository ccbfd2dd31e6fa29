"""Run retention with real processes: `agent-engine serve`, `worker` and `clock`.

An admin sets `runRetentionDays` through the API; within a few of the clock's retention ticks the
old finished runs are gone, while the runs of the current budget week, each agent's last
finished run and its last successful run stay -- and until the setting exists, nothing goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.budget import week_window
from agent_engine.settings import Settings
from tests.e2e.support import Client, Stack, eventually, fast_settings, fetch, token
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

ADMIN = 77
DAY = timedelta(days=1)
# Zones from UTC-12 to UTC+14: whatever the real day, in one of them the budget week began long
# enough ago for a run to be older than one day and still inside it.
ZONES = ("UTC", "Etc/GMT+12", "Etc/GMT-14")
REASONS = {"failed": "error", "skipped": "budget_exceeded"}
SETTINGS = """mutation($d: Int) { updatePlatformSettings(input: {runRetentionDays: $d}) {
  runRetentionDays } }"""


@pytest.fixture
def retention_stack(settings: Settings, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(fast_settings(settings, retention_tick_seconds=0.5), tmp_path)
    try:
        yield running
    finally:
        running.stop()


def zone_with_an_old_week_start(now: datetime) -> tuple[str, datetime]:
    for name in ZONES:
        start = week_window(now, ZoneInfo(name)).start
        if now - start >= timedelta(hours=36):
            return name, start
    raise AssertionError(f"no zone in {ZONES} has a week older than 36 h at {now}")


async def finished(factories: Factories, agent: dict[str, Any], state: str, at: datetime) -> int:
    run = await factories.run(
        agent_id=agent["id"],
        state=state,
        reason=REASONS.get(state),
        created_at=at - timedelta(minutes=1),
        started_at=None if state == "skipped" else at - timedelta(minutes=1),
        finished_at=at,
        tokens_used=7,
    )
    return int(run["id"])


async def remaining(engine: AsyncEngine) -> set[int]:
    return {int(row["id"]) for row in await fetch(engine, "SELECT id FROM agent_runs")}


async def retention_ticks(engine: AsyncEngine) -> int:
    rows = await fetch(engine, "SELECT count FROM engine_activity WHERE name = 'tick.retention'")
    return int(rows[0]["count"]) if rows else 0


async def test_old_runs_are_pruned_by_the_clock_and_the_kept_ones_stay(
    retention_stack: Stack, engine: AsyncEngine, factories: Factories
) -> None:
    now = datetime.now(UTC)
    zone, week_start = zone_with_an_old_week_start(now)
    await factories.setting("timezone", zone)
    busy, lonely, skipper = [await factories.agent() for _ in range(3)]
    old = [
        await finished(factories, busy, "succeeded", now - 40 * DAY),
        await finished(factories, busy, "failed", now - 35 * DAY),
        await finished(factories, skipper, "skipped", now - 40 * DAY),
    ]
    kept = {
        # Older than a day but inside the budget week: its tokens count this week.
        "this week": await finished(factories, busy, "succeeded", week_start + timedelta(hours=1)),
        "busy's last": await finished(factories, busy, "succeeded", now - timedelta(minutes=10)),
        "lonely's only run": await finished(factories, lonely, "succeeded", now - 400 * DAY),
        "skipper's last": await finished(factories, skipper, "succeeded", now - 39 * DAY),
    }

    api = await retention_stack.api()
    retention_stack.worker()
    retention_stack.clock()
    assert api.url is not None

    # Retention is off until an admin sets it: the ticks run and change nothing.
    await eventually(
        lambda: _at_least(retention_ticks(engine), 3), within=60, what="three retention ticks"
    )
    assert await remaining(engine) == set(old) | set(kept.values())

    admin = Client(api.url, bearer=token(retention_stack.settings, ADMIN, admin=True))
    try:
        set_to = await admin.data(SETTINGS, {"d": 1})
        assert set_to["updatePlatformSettings"]["runRetentionDays"] == 1

        async def pruned() -> bool:
            return not set(old) & await remaining(engine)

        await eventually(pruned, within=60, what="the old runs to be pruned")
        assert await remaining(engine) == set(kept.values()), kept
        # It stays that way tick after tick.
        ticks = await retention_ticks(engine)
        await eventually(
            lambda: _at_least(retention_ticks(engine), ticks + 3), within=60, what="more ticks"
        )
        assert await remaining(engine) == set(kept.values())

        samples = await _scrape(api.url)
        assert samples[("agent_engine_runs_pruned_total", ())] == len(old)
        assert samples[("agent_engine_tick_age_seconds", (("tick", "retention"),))] < 60
        log = await admin.data(
            "{ adminAuditLog(first: 5) { edges { node { action details actor { id } } } } }"
        )
        [entry] = [e["node"] for e in log["adminAuditLog"]["edges"]]
        assert entry["action"] == "settings.updated"
        assert entry["details"] == {"runRetentionDays": {"old": None, "new": 1}}
        assert entry["actor"]["id"] == str(ADMIN)
    finally:
        await admin.aclose()


async def _at_least(count: Any, minimum: int) -> bool:
    return int(await count) >= minimum


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"{url}/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
