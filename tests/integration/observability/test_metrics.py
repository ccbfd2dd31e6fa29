"""What `/metrics` tells an operator: queue and heartbeat ages, ticks, pruning, HTTP traffic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import activity
from tests.integration.api.support import Api
from tests.support.factories import Factories


async def scrape(api: Api) -> dict[str, list[Sample]]:
    response = await api.http.get(f"{api.url}/metrics")
    assert response.status_code == 200
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


async def test_queue_age_and_heartbeat_age_show_stuck_runs(api: Api, factories: Factories) -> None:
    now = datetime.now(UTC)
    quiet = await scrape(api)
    assert value(quiet, "agent_engine_queued_run_age_seconds") == 0
    assert value(quiet, "agent_engine_running_heartbeat_age_seconds") == 0
    waiting = await factories.agent()
    await factories.run(waiting["id"], state="queued", created_at=now - timedelta(minutes=10))
    silent = await factories.agent()
    await factories.run(
        silent["id"],
        state="running",
        created_at=now - timedelta(minutes=5),
        started_at=now - timedelta(minutes=5),
        heartbeat_at=now - timedelta(minutes=2),
    )
    samples = await scrape(api)
    assert 600 <= value(samples, "agent_engine_queued_run_age_seconds") < 900
    assert 120 <= value(samples, "agent_engine_running_heartbeat_age_seconds") < 300


async def test_ticks_and_pruned_runs_are_counted_cluster_wide(
    api: Api, engine: AsyncEngine
) -> None:
    before = await scrape(api)
    assert value(before, "agent_engine_runs_pruned_total") == 0
    assert "agent_engine_tick_age_seconds" not in before  # no tick completed yet
    async with engine.begin() as conn:
        await activity.bump(conn, activity.tick_name("schedule"))
        await activity.bump(conn, activity.tick_name("schedule"))
        await activity.bump(conn, activity.tick_name("retention"))
        await activity.bump(conn, activity.RUNS_PRUNED, 1234)
    samples = await scrape(api)
    assert value(samples, "agent_engine_runs_pruned_total") == 1234
    assert value(samples, "agent_engine_ticks_total", tick="schedule") == 2
    assert value(samples, "agent_engine_ticks_total", tick="retention") == 1
    assert 0 <= value(samples, "agent_engine_tick_age_seconds", tick="schedule") < 60


async def test_http_requests_are_counted_by_route_and_status_with_their_latency(
    api: Api,
) -> None:
    before = await scrape(api)

    def count(samples: dict[str, list[Sample]], **labels: str) -> float:
        return sum(
            s.value
            for s in samples.get("agent_engine_http_requests_total", [])
            if labels.items() <= s.labels.items()
        )

    def observed(samples: dict[str, list[Sample]]) -> float:
        return sum(
            s.value
            for s in samples.get("agent_engine_http_request_duration_seconds_count", [])
            if s.labels["route"] == "/graphql"
        )

    ok = await api.http.post(f"{api.url}/graphql", json={"query": "{ __typename }"})
    assert ok.status_code == 200
    too_big = await api.http.post(
        f"{api.url}/graphql", content=b"{" + b" " * (api.settings.max_body_bytes + 10) + b"}"
    )
    assert too_big.status_code == 413
    missing = await api.http.get(f"{api.url}/no/such/page/{datetime.now(UTC).timestamp()}")
    assert missing.status_code == 404

    after = await scrape(api)
    assert (
        count(after, route="/graphql", status="200") - count(before, route="/graphql", status="200")
        == 1
    )
    assert (
        count(after, route="/graphql", status="413") - count(before, route="/graphql", status="413")
        == 1
    )
    # Unknown paths share one label: clients cannot grow the label space.
    assert (
        count(after, route="other", status="404") - count(before, route="other", status="404") == 1
    )
    assert observed(after) - observed(before) == 2
