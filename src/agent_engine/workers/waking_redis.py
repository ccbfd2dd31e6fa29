"""Dramatiq's Redis broker with consumers that are woken instead of polling.

Dramatiq's Redis consumer polls: with nothing to fetch it sleeps a backoff that grows to the
worker's timeout, and with its prefetch full (every message it took still in a thread) it sleeps
the same way before it looks again. So an idle worker asks Redis ten times a second per queue at
a 100 ms timeout (about 2 % of a core per process, idle), a message sent to an idle worker waits
up to that timeout (the schedule tick up to a second, the ticks' timeout), and in a burst the
claiming threads sat idle between a freed place and the next fetch.

Here every enqueue also publishes on the queue's wake channel, in the same round trip, and a
consumer waits on that channel (all consumers of the queue, in every process, hear it) when Redis
had nothing for it, and on its own acks when its prefetch is full. The waits still end after the
worker's timeout: a consumer keeps fetching (the fetch is also the broker's heartbeat and its
maintenance) and a delay queue's consumer still wakes to move messages whose time has come. A
wake lost with a dropped connection costs one timeout, as polling did; the consumer reconnects
as Dramatiq's does (its thread restarts it).

A Redis user the server refuses channels (an ACL without `&<namespace>:*`; Redis 7 gives new
users none) still works, as Dramatiq's broker polling: a refused publish turns this broker's wakes
off and a refused subscription turns its consumer back to Dramatiq's backoff, each said once in a
warning that names the fix.

Messages, queues, acks and the Lua scripts are Dramatiq's own; only the waiting changed.
"""

# Dramatiq's Redis consumer is untyped: the calls into it are too.
# mypy: disable-error-code="no-untyped-call,no-any-return"
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import uuid4

import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

WAKE_CHANNEL_SUFFIX = ".wake"
REFUSED = (
    "the Redis server refused the wake channel %s (%s): consumers poll instead, up to the worker's"
    " timeout late; allow the broker's user the channels `%s:*` (ACL `&%s:*`)"
)

log = logging.getLogger(__name__)


class WakingRedisBroker(RedisBroker):
    """`RedisBroker` whose enqueues wake the queue's consumers (see the module)."""

    wakes_refused = False  # set once the server refused a publish

    def wake_channel(self, queue_name: str) -> str:
        """The queue's wake channel. Channels are server-wide, not per database: the database
        number is in the name, so deployments sharing a server by number do not wake each
        other."""
        db = self.client.connection_pool.connection_kwargs.get("db", 0)
        return f"{self.namespace}:{db}:{queue_name}{WAKE_CHANNEL_SUFFIX}"

    def do_enqueue(self, queue_name: str, message_id: str, data: bytes) -> Any:
        """`RedisBroker.enqueue`'s dispatch, and the wake, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        self._dispatch_enqueue(pipe, queue_name, message_id, data)
        return self._execute_waking(pipe, [queue_name])[0]

    def enqueue_many(self, messages: Sequence[Message[Any]]) -> None:
        """`enqueue` for many messages (no delay) in one round trip: each message gets its Redis
        id and the enqueue middleware hooks, and the dispatch script `enqueue` runs; each queue's
        consumers are woken once. Dramatiq has no batch API; this follows `RedisBroker.enqueue`
        of dramatiq 2.x."""
        if not messages:
            return
        pipe = self.client.pipeline(transaction=False)
        sent = []
        for message in messages:
            message = message.copy(options={"redis_message_id": str(uuid4())})
            self.emit_before("enqueue", message, None)
            self._dispatch_enqueue(
                pipe, message.queue_name, message.options["redis_message_id"], message.encode()
            )
            sent.append(message)
        self._execute_waking(pipe, {message.queue_name for message in sent})
        for message in sent:
            self.emit_after("enqueue", message, None)

    def _execute_waking(self, pipe: Any, queue_names: Iterable[str]) -> list[Any]:
        """Run `pipe` with a wake for each of `queue_names` after its commands; the commands'
        results. A wake the server refuses turns wakes off (polling, as Dramatiq's broker); any
        other error is raised, as `execute` would."""
        channels = [] if self.wakes_refused else [self.wake_channel(q) for q in queue_names]
        for channel in channels:
            pipe.publish(channel, b"")
        results: list[Any] = pipe.execute(raise_on_error=False)
        sent = results[: len(results) - len(channels)]
        for result in sent:
            if isinstance(result, Exception):
                raise result
        for channel, result in zip(channels, results[len(sent) :], strict=True):
            if isinstance(result, redis.ResponseError) and not self.wakes_refused:
                self.wakes_refused = True
                self.warn_refused(channel, result)
        return sent

    def warn_refused(self, channel: str, exc: Exception) -> None:
        log.warning(REFUSED, channel, exc, self.namespace, self.namespace)

    def _dispatch_enqueue(self, pipe: Any, queue_name: str, message_id: str, data: bytes) -> None:
        """Queue on `pipe` the `enqueue` of Dramatiq's dispatch script, with the arguments
        `RedisBroker.enqueue` gives it (dramatiq 2.x)."""
        self.scripts["dispatch"](
            keys=[self.namespace],
            args=[
                "enqueue",
                current_millis(),
                queue_name,
                self.broker_id,
                self.heartbeat_timeout,
                self.dead_message_ttl,
                self._should_do_maintenance("enqueue"),
                self._max_unpack_size(),
                message_id,
                data,
            ],
            client=pipe,
        )

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        return _WakingConsumer(self, queue_name, prefetch, timeout)


class _WakingConsumer(_RedisConsumer):
    """Dramatiq's consumer with its two sleeps replaced by waits that end when there is work."""

    def __init__(
        self, broker: WakingRedisBroker, queue_name: str, prefetch: int, timeout: int
    ) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self._freed = threading.Event()
        # Subscribed before the first fetch: a message enqueued after a fetch that found nothing
        # has its wake waiting on this connection. None: the server refused it (polling).
        self._channel = broker.wake_channel(queue_name)
        self._wakes: redis.client.PubSub | None = broker.client.pubsub(
            ignore_subscribe_messages=True
        )
        try:
            self._wakes.subscribe(self._channel)
        except redis.ConnectionError as exc:
            self._wakes.close()
            raise ConnectionClosed(exc) from None

    def ack(self, message: MessageProxy) -> None:
        try:
            super().ack(message)
        finally:
            self._freed.set()

    def nack(self, message: MessageProxy) -> None:
        try:
            super().nack(message)
        finally:
            self._freed.set()

    def __next__(self) -> MessageProxy | None:
        if self.message_cache:
            return super().__next__()  # Dramatiq's own path for a fetched message
        try:
            self._freed.clear()
            # Wakes that came meanwhile are dropped before either wait: the fetch below sees what
            # they announced, and a consumer full for minutes while messages keep coming does
            # not let them pile up (Redis cuts a subscriber whose output buffer passes its limit).
            self._drain_wakes()
            if self.outstanding_message_count >= self.prefetch:
                # Every message taken is still in a thread: look again when one is acked.
                self._freed.wait(self.timeout / 1000)
                return None
            self.message_cache = self.broker.do_fetch(
                self.queue_name, self.prefetch - self.outstanding_message_count
            )
            if not self.message_cache:
                # Nothing queued: wait for an enqueue's wake (or the timeout: the heartbeat,
                # a delay queue's messages whose time has come).
                self._wait_for_wake()
                return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None
        return super().__next__()

    def _wait_for_wake(self) -> None:
        if self._wakes is not None:
            try:
                self._wakes.get_message(timeout=self.timeout / 1000)
                return
            except redis.ResponseError as exc:
                self._refused(exc)
        # Dramatiq's own backoff (the channel was refused).
        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
        time.sleep(backoff_ms / 1000)

    def _drain_wakes(self) -> None:
        """Drop the wakes already here: the fetch that follows sees what they announced."""
        try:
            while self._wakes is not None and self._wakes.get_message(timeout=0.0) is not None:
                pass
        except redis.ResponseError as exc:
            self._refused(exc)

    def _refused(self, exc: redis.ResponseError) -> None:
        """The server refused the subscription (an ACL without the channel): poll from now on."""
        self.broker.warn_refused(self._channel, exc)
        if self._wakes is not None:
            self._wakes.close()
            self._wakes = None

    def requeue(self, messages: Iterable[Any]) -> None:
        """Dramatiq's requeue (a stopping worker gives back what it holds), and the wake."""
        messages = list(messages)
        try:
            super().requeue(messages)
            if messages:
                self.broker._execute_waking(self.broker.client.pipeline(False), [self.queue_name])
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def close(self) -> None:
        """Give back the fetched messages no thread took, then close the wake channel.
        (Dramatiq's consumer leaves them with this broker until its heartbeat lapses and another
        broker's maintenance requeues them, a minute later; a woken consumer often stops with
        a fetch in hand.)"""
        try:
            held = [Message.decode(data) for data in self.message_cache if data is not None]
            self.message_cache = []
            self.requeue(held)
        finally:
            try:
                if self._wakes is not None:
                    self._wakes.close()
            finally:
                super().close()
