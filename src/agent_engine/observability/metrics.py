"""Prometheus metrics for `/metrics`.

Two kinds, deliberately:
- Cluster-wide facts read from PostgreSQL at scrape time (runs by state and reason, tokens spent,
  run duration quantiles, scheduler lag, stale runs reaped, the oldest queued run and the oldest
  heartbeat; from `engine_activity` the ticks and pruned runs). The journal is the source of
  truth and any api replica reports the same numbers, however many workers ran the runs. Every
  query is bounded by an index (the budget window on `finished_at`, the partial unfinished-run
  index, the due-scan index), so a scrape stays cheap on a large journal.
- Process-local instruments of the api (active subscriptions, GraphQL requests, HTTP requests by
  route and status with their latency, see `observability/http.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.activity import RUNS_PRUNED, TICK_PREFIX

# Runs finished this long ago still count in the "recent" families.
RECENT_WINDOW = "1 hour"

REGISTRY = CollectorRegistry()
ACTIVE_SUBSCRIPTIONS = Gauge(
    "agent_engine_active_subscriptions",
    "GraphQL subscriptions open on this api process.",
    registry=REGISTRY,
)
GRAPHQL_REQUESTS = Counter(
    "agent_engine_graphql_requests",
    "GraphQL operations executed by this api process, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "agent_engine_http_requests",
    "HTTP requests answered by this api process, by route, method and status code.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_REQUEST_DURATION = Histogram(
    "agent_engine_http_request_duration_seconds",
    "Time to answer an HTTP request on this api process (to the end of the response body).",
    ["route"],
    registry=REGISTRY,
)
CONTENT_TYPE = CONTENT_TYPE_LATEST

_SNAPSHOT_SQL = text(
    f"""
    WITH recent AS (
        SELECT state, reason, tokens_used,
               EXTRACT(EPOCH FROM finished_at - started_at) AS seconds
        FROM agent_runs
        WHERE finished_at >= now() - interval '{RECENT_WINDOW}'
    )
    SELECT 'finished' AS kind, state, reason, count(*)::float8 AS value FROM recent
        GROUP BY state, reason
    UNION ALL
    SELECT 'unfinished', state, NULL, count(*)::float8 FROM agent_runs
        WHERE state IN ('queued', 'running') GROUP BY state
    UNION ALL
    SELECT 'tokens', NULL, NULL, coalesce(sum(tokens_used), 0)::float8 FROM recent
    UNION ALL
    SELECT 'duration_q', NULL, q::text,
           coalesce(percentile_cont(q) WITHIN GROUP (ORDER BY seconds), 0)::float8
        FROM recent, unnest(ARRAY[0.5, 0.9, 0.99]) AS q
        WHERE seconds IS NOT NULL GROUP BY q
    UNION ALL
    SELECT 'lag', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(next_run_at)), 0)::float8
        FROM agents WHERE next_run_at IS NOT NULL AND next_run_at <= now()
    UNION ALL
    SELECT 'queue_age', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
        FROM agent_runs WHERE state = 'queued'
    UNION ALL
    SELECT 'heartbeat_age', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(coalesce(heartbeat_at, started_at))), 0)::float8
        FROM agent_runs WHERE state = 'running'
    UNION ALL
    SELECT 'activity_count', name, NULL, count::float8 FROM engine_activity
    UNION ALL
    SELECT 'activity_age', name, NULL, EXTRACT(EPOCH FROM now() - last_at)::float8
        FROM engine_activity WHERE last_at IS NOT NULL
    """
)


# Budget alerts ever recorded, by threshold: a counter read from the table (a few rows per owner
# and week), so every replica reports the same, whichever worker recorded them.
_BUDGET_ALERTS_SQL = text("SELECT percent, count(*) FROM budget_alerts GROUP BY percent")

# Deliveries (the outbox): pending ones now (and how many are overdue, i.e. not sent when due --
# no clock or no worker on the `deliveries` queue), and those finished in the recent window by
# outcome. Index-backed: the partial due index and the partial finished_at index.
_DELIVERIES_SQL = text(
    f"""
    SELECT 'pending' AS kind, NULL AS status, count(*)::float8 AS value
        FROM run_deliveries WHERE status = 'pending'
    UNION ALL
    SELECT 'overdue', NULL, count(*)::float8 FROM run_deliveries
        WHERE status = 'pending' AND next_attempt_at < now() - interval '1 minute'
        AND (leased_until IS NULL OR leased_until < now())
    UNION ALL
    SELECT 'finished', status, count(*)::float8 FROM run_deliveries
        WHERE finished_at >= now() - interval '{RECENT_WINDOW}' GROUP BY status
    """
)


async def deliveries_snapshot(conn: AsyncConnection) -> list[Metric]:
    pending = GaugeMetricFamily(
        "agent_engine_deliveries_pending", "Run deliveries waiting for an attempt or a retry."
    )
    overdue = GaugeMetricFamily(
        "agent_engine_deliveries_overdue",
        "Pending deliveries more than a minute past their attempt time and not being sent.",
    )
    finished = GaugeMetricFamily(
        "agent_engine_deliveries_finished_recent",
        f"Deliveries that ended in the last {RECENT_WINDOW}, by status (delivered, failed).",
        labels=["status"],
    )
    counts = {"pending": 0.0, "overdue": 0.0}
    by_status = {"delivered": 0.0, "failed": 0.0}
    for kind, status, value in await conn.execute(_DELIVERIES_SQL):
        if kind == "finished":
            by_status[status] = value
        else:
            counts[kind] = value
    pending.add_metric([], counts["pending"])
    overdue.add_metric([], counts["overdue"])
    for status, value in by_status.items():
        finished.add_metric([status], value)
    return [pending, overdue, finished]


async def database_snapshot(conn: AsyncConnection) -> list[Metric]:
    """Read the cluster-wide families in one statement."""
    finished = GaugeMetricFamily(
        "agent_engine_runs_finished_recent",
        f"Runs that reached a terminal state in the last {RECENT_WINDOW}, by state and reason.",
        labels=["state", "reason"],
    )
    unfinished = GaugeMetricFamily(
        "agent_engine_runs_unfinished", "Runs queued or running now.", labels=["state"]
    )
    tokens = GaugeMetricFamily(
        "agent_engine_tokens_spent_recent",
        f"Tokens spent by runs finished in the last {RECENT_WINDOW}.",
    )
    duration = GaugeMetricFamily(
        "agent_engine_run_duration_seconds",
        f"Run duration quantiles over runs finished in the last {RECENT_WINDOW}.",
        labels=["quantile"],
    )
    lag = GaugeMetricFamily(
        "agent_engine_scheduler_lag_seconds",
        "now - the oldest due next_run_at (0 when nothing is due): the scheduler's delay.",
    )
    stale = GaugeMetricFamily(
        "agent_engine_stale_runs_reaped_recent",
        f"Runs the reaper failed as stale in the last {RECENT_WINDOW}.",
    )
    queue_age = GaugeMetricFamily(
        "agent_engine_queued_run_age_seconds",
        "Age of the oldest queued run (0 when none waits): how long runs wait for a worker.",
    )
    heartbeat_age = GaugeMetricFamily(
        "agent_engine_running_heartbeat_age_seconds",
        "Seconds since the stalest running run's last heartbeat (0 when none runs).",
    )
    pruned = CounterMetricFamily(
        "agent_engine_runs_pruned",
        "Finished runs deleted by run retention (runRetentionDays), cluster-wide.",
    )
    ticks = CounterMetricFamily(
        "agent_engine_ticks",
        "Periodic ticks completed by the workers, by tick (schedule, reap, retention).",
        labels=["tick"],
    )
    tick_age = GaugeMetricFamily(
        "agent_engine_tick_age_seconds",
        "Seconds since a worker last completed the tick (absent until the first one).",
        labels=["tick"],
    )
    for unfinished_state in ("queued", "running"):
        unfinished.add_metric([unfinished_state], 0.0)
    stale_count = 0.0
    lag_seconds = 0.0
    token_total = 0.0
    pruned_total = 0.0
    queue_age_seconds = 0.0
    heartbeat_age_seconds = 0.0
    for kind, state, reason, value in await conn.execute(_SNAPSHOT_SQL):
        if kind == "finished":
            finished.add_metric([state, reason or ""], value)
            if state == "failed" and reason == "stale":
                stale_count = value
        elif kind == "unfinished":
            unfinished.add_metric([state], value)
        elif kind == "tokens":
            token_total = value
        elif kind == "duration_q":
            duration.add_metric([reason], value)
        elif kind == "lag":
            lag_seconds = max(0.0, value)
        elif kind == "queue_age":
            queue_age_seconds = max(0.0, value)
        elif kind == "heartbeat_age":
            heartbeat_age_seconds = max(0.0, value)
        elif kind == "activity_count" and state == RUNS_PRUNED:
            pruned_total = value
        elif kind == "activity_count" and state.startswith(TICK_PREFIX):
            ticks.add_metric([state.removeprefix(TICK_PREFIX)], value)
        elif kind == "activity_age" and state.startswith(TICK_PREFIX):
            tick_age.add_metric([state.removeprefix(TICK_PREFIX)], max(0.0, value))
    tokens.add_metric([], token_total)
    lag.add_metric([], lag_seconds)
    stale.add_metric([], stale_count)
    alerts = CounterMetricFamily(
        "agent_engine_budget_alerts",
        "Budget alerts recorded (an owner's week crossed a threshold of the cap), by percent.",
        labels=["percent"],
    )
    for percent, count in await conn.execute(_BUDGET_ALERTS_SQL):
        alerts.add_metric([str(percent)], float(count))
    queue_age.add_metric([], queue_age_seconds)
    heartbeat_age.add_metric([], heartbeat_age_seconds)
    pruned.add_metric([], pruned_total)
    return [
        finished,
        unfinished,
        tokens,
        duration,
        lag,
        stale,
        queue_age,
        heartbeat_age,
        pruned,
        ticks,
        tick_age,
        alerts,
        *await deliveries_snapshot(conn),
    ]


class _Snapshot:
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def render(database_metrics: Iterable[Metric]) -> bytes:
    """The exposition text: the process registry plus a database snapshot."""
    registry = CollectorRegistry()
    registry.register(_Snapshot(database_metrics))
    return generate_latest(REGISTRY) + generate_latest(registry)
