"""The Dramatiq broker: the one place that calls `dramatiq.set_broker`.

Redis (Valkey) from `REDIS_URL` by default; `BROKER_URL=amqp://…` selects RabbitMQ. The API, the
clock and the workers all call `configure_broker(settings)` once at start-up; after that
`enqueue_execute(run_id)` sends an execute message from any thread of the process, and
`enqueue_execute.many(run_ids)` a batch of them in one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dramatiq
import redis.asyncio as aioredis

from agent_engine.runs import connection_waits
from agent_engine.settings import Settings
from agent_engine.workers.actors import Actors, declare_actors
from agent_engine.workers.middleware import SharedAsyncIO
from agent_engine.workers.tracing import TraceContextMiddleware
from agent_engine.workers.waking_redis import WakingRedisBroker

AMQP_DEFAULT_PORT = 5672
AMQPS_DEFAULT_PORT = 5671
# The AMQP 0-9-1 protocol header; a broker answers with a Connection.Start method frame (type 1).
AMQP_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP_METHOD_FRAME = 1

_lock = threading.Lock()
_configured: tuple[Settings, dramatiq.Broker, Actors] | None = None


def configure_broker(settings: Settings) -> dramatiq.Broker:
    """Create, install and return the broker with the actors declared on it.

    Idempotent: the same settings return the same broker. Different settings (a test with a new
    database) replace it, closing the old one.
    """
    global _configured
    with _lock:
        if _configured is not None:
            old_settings, old_broker, _ = _configured
            if old_settings == settings:
                return old_broker
            old_broker.close()
            _configured = None
        broker = _make_broker(settings)
        # First, so a message skipped by any other middleware still ends its span.
        broker.add_middleware(TraceContextMiddleware(), before=type(broker.middleware[0]))
        broker.add_middleware(SharedAsyncIO())
        actors = declare_actors(
            broker, settings, enqueue_execute=enqueue_execute, enqueue_delivery=enqueue_delivery
        )
        dramatiq.set_broker(broker)
        _configured = (settings, broker, actors)
        # The OAuth callback resumes the runs waiting for the account it connected through it.
        connection_waits.use_sender(enqueue_execute)
        return broker


def _make_broker(settings: Settings) -> dramatiq.Broker:
    """The broker, with connect and socket timeouts: a broker that accepts connections but never
    answers fails a send after `broker_timeout_seconds` instead of hanging it (the run stays
    journaled `queued`, and the reaper re-sends its message)."""
    url = settings.effective_broker_url
    if not url:
        raise RuntimeError("no broker: set REDIS_URL (or BROKER_URL=amqp://… for RabbitMQ)")
    timeout = settings.broker_timeout_seconds
    if _is_amqp(url):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=_with_amqp_timeouts(url, timeout))
    import redis

    # Dramatiq passes no options to a pool it builds from a URL: build the pool ourselves.
    pool = redis.ConnectionPool.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    return WakingRedisBroker(connection_pool=pool)  # type: ignore[no-untyped-call]


def _is_amqp(url: str) -> bool:
    return url.startswith(("amqp://", "amqps://"))


def _with_amqp_timeouts(url: str, timeout: float) -> str:
    """pika reads its timeouts from the URL's query; ones already given win."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for name in ("socket_timeout", "stack_timeout", "blocked_connection_timeout"):
        query.setdefault(name, f"{timeout:g}")
    return urlunsplit(parts._replace(query=urlencode(query)))


def actors() -> Actors:
    if _configured is None:
        raise RuntimeError("the broker is not configured: call configure_broker(settings) first")
    return _configured[2]


class _ExecuteSender:
    """`enqueue_execute(run_id)` sends the execute message for a committed `queued` run;
    `enqueue_execute.many(run_ids)` sends many (the schedule tick's batch) in one Redis round
    trip (`WakingRedisBroker.enqueue_many`), or one by one on another broker."""

    def __call__(self, run_id: int) -> None:
        actors().execute_run.send(run_id)

    def many(self, run_ids: Sequence[int]) -> None:
        actor = actors().execute_run
        broker = actor.broker
        if not isinstance(broker, WakingRedisBroker):
            for run_id in run_ids:
                actor.send(run_id)
            return
        broker.enqueue_many([actor.message(run_id) for run_id in run_ids])


enqueue_execute = _ExecuteSender()


def enqueue_delivery(delivery_id: int, token: str) -> None:
    """Send one attempt of a leased delivery."""
    actors().deliver.send(delivery_id, token)


def send_delivery_tick() -> None:
    actors().dispatch_deliveries.send()


def send_schedule_tick() -> None:
    actors().schedule_due_agents.send()


def send_reap_tick() -> None:
    actors().reap_stale_runs.send()


def send_retention_tick() -> None:
    actors().prune_finished_runs.send()


def send_tool_sources_tick() -> None:
    actors().sync_tool_sources.send()


def close_broker() -> None:
    """Close the broker's connections (process exit, tests)."""
    global _configured
    with _lock:
        if _configured is not None:
            _configured[1].close()
            _configured = None
        connection_waits.use_sender(None)


async def ping_broker(url: str, *, timeout_seconds: float) -> None:
    """Raise unless the broker at `url` answers (the readiness probe): a Redis PING, or the AMQP
    handshake's first frame."""
    if _is_amqp(url):
        await _amqp_handshake(url)
        return
    client = aioredis.Redis.from_url(
        url, socket_connect_timeout=timeout_seconds, socket_timeout=timeout_seconds
    )
    try:
        await client.ping()
    finally:
        await client.aclose()


async def _amqp_handshake(url: str) -> None:
    """Open a connection and read the broker's Connection.Start: it speaks AMQP and accepts us.
    (Credentials are checked by the workers' own connections, not here.)"""
    parts = urlsplit(url)
    tls = parts.scheme == "amqps"
    port = parts.port or (AMQPS_DEFAULT_PORT if tls else AMQP_DEFAULT_PORT)
    reader, writer = await asyncio.open_connection(parts.hostname or "localhost", port, ssl=tls)
    try:
        writer.write(AMQP_PROTOCOL_HEADER)
        await writer.drain()
        frame_type = (await reader.readexactly(1))[0]
        if frame_type != AMQP_METHOD_FRAME:
            raise ConnectionError(f"not an AMQP 0-9-1 broker (frame type {frame_type})")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
