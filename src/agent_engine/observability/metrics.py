"""Prometheus metrics for `/metrics`.

Two kinds, deliberately:
- Cluster-wide facts read from PostgreSQL at scrape time (runs by state and reason, tokens spent,
  run duration quantiles, scheduler lag, stale runs reaped, the oldest queued run and the oldest
  heartbeat; from `engine_activity` the ticks and pruned runs). The journal is the source of
  truth and any api replica reports the same numbers, however many workers ran the runs. The
  statements, each bounded by an index, are in `db/metrics.py`.
- Process-local instruments of the api (active subscriptions, GraphQL requests, HTTP requests by
  route and status with their latency, see `observability/http.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import metrics as facts
from agent_engine.db.activity import RUNS_PRUNED, TICK_PREFIX, fallback_labels
from agent_engine.db.metrics import RECENT_WINDOW

REGISTRY = CollectorRegistry()
ACTIVE_SUBSCRIPTIONS = Gauge(
    "agent_engine_active_subscriptions",
    "GraphQL subscriptions open on this api process.",
    registry=REGISTRY,
)
LIVE_READS = Counter(
    "agent_engine_live_reads_total",
    "Database statements of the live-update path: `runs` (a burst of run changes), `steps` (a "
    "run's changed steps, once per change whatever the number of watchers), `replay` (a runSteps "
    "subscription's first read).",
    ["kind"],
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
    for fact in await facts.deliveries_snapshot(conn):
        if fact.kind == "finished":
            by_status[fact.label or ""] = fact.value
        else:
            counts[fact.kind] = fact.value
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
    fallbacks = CounterMetricFamily(
        "agent_engine_model_fallbacks",
        "Model calls sent on to a fallback model (cluster-wide, from the workers' counts): by the"
        " model that was down, the fallback, and the cause (rate_limited, server_error, timeout,"
        " unreachable; breaker_open: skipped while its circuit breaker is open).",
        labels=["model", "fallback", "cause"],
    )
    for unfinished_state in ("queued", "running"):
        unfinished.add_metric([unfinished_state], 0.0)
    stale_count = 0.0
    lag_seconds = 0.0
    token_total = 0.0
    pruned_total = 0.0
    queue_age_seconds = 0.0
    heartbeat_age_seconds = 0.0
    for fact in await facts.runs_snapshot(conn):
        kind, state, reason, value = fact.kind, fact.label or "", fact.detail, fact.value
        if kind == "finished":
            finished.add_metric([state, reason or ""], value)
            if state == "failed" and reason == "stale":
                stale_count = value
        elif kind == "unfinished":
            unfinished.add_metric([state], value)
        elif kind == "tokens":
            token_total = value
        elif kind == "duration_q":
            duration.add_metric([reason or ""], value)
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
        elif kind == "activity_count" and (labels := fallback_labels(state)) is not None:
            fallbacks.add_metric(list(labels), value)
    tokens.add_metric([], token_total)
    lag.add_metric([], lag_seconds)
    stale.add_metric([], stale_count)
    alerts = CounterMetricFamily(
        "agent_engine_budget_alerts",
        "Budget alerts recorded (an owner's week crossed a threshold of the cap), by percent.",
        labels=["percent"],
    )
    for percent, count in (await facts.budget_alerts_by_percent(conn)).items():
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
        fallbacks,
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
