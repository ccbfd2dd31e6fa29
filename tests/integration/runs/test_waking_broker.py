"""The Redis broker's consumers are woken by an enqueue and by an ack, not by polling
(workers/waking_redis.py): each test gives its consumer a 60-second timeout, so a consumer that
only polled would not see the message within the test's wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.broker import Consumer, MessageProxy

from agent_engine.workers.waking_redis import WakingRedisBroker

QUEUE = "wake-test"
POLL_TIMEOUT_MS = 60_000  # a consumer that waits this long between looks has not been woken
WITHIN_SECONDS = 10.0
IDLE_SECONDS = 1.0


@pytest.fixture
def broker(redis_url: str) -> Iterator[WakingRedisBroker]:
    broker = WakingRedisBroker(url=redis_url)
    broker.declare_queue(QUEUE)
    try:
        yield broker
    finally:
        broker.close()


def message(n: int) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=QUEUE, actor_name="noop", args=(n,), kwargs={}, options={})


class Looks:
    """Counts a broker's fetches from Redis and a consumer's turns (`next` calls)."""

    def __init__(self, broker: WakingRedisBroker) -> None:
        self.fetches = 0
        self.turns = 0
        fetch = broker._dispatch("fetch")

        def counted(*args: Any) -> Any:
            self.fetches += 1
            return fetch(*args)

        broker.do_fetch = counted  # type: ignore[method-assign]


def next_message(
    consumer: Consumer, stop: threading.Event, looks: Looks | None = None
) -> MessageProxy | None:
    """Iterate the consumer (as Dramatiq's consumer thread does) until a message comes."""
    while not stop.is_set():
        if looks is not None:
            looks.turns += 1
        found = next(consumer)
        if found is not None:
            return found
    return None


@pytest.fixture
def waiter() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class Consumers:
    """The test's consumers and extra brokers, and the stop their threads iterate under: all
    stopped and closed when the test ends."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._consumers: list[Consumer] = []
        self._brokers: list[WakingRedisBroker] = []

    def broker(self, url: str) -> WakingRedisBroker:
        broker = WakingRedisBroker(url=url)
        broker.declare_queue(QUEUE)
        self._brokers.append(broker)
        return broker

    def of(
        self, broker: WakingRedisBroker, *, prefetch: int, timeout: int = POLL_TIMEOUT_MS
    ) -> Consumer:
        consumer = broker.consume(QUEUE, prefetch=prefetch, timeout=timeout)
        self._consumers.append(consumer)
        return consumer

    def close(self, consumer: Consumer) -> None:
        self._consumers.remove(consumer)
        consumer.close()

    def close_all(self) -> None:
        self.stop.set()
        for consumer in self._consumers:
            consumer.close()
        for broker in self._brokers:
            broker.close()


@pytest.fixture
def consumers() -> Iterator[Consumers]:
    made = Consumers()
    try:
        yield made
    finally:
        made.close_all()


def idle(
    pool: ThreadPoolExecutor, consumer: Consumer, stop: threading.Event, looks: Looks
) -> Future[MessageProxy | None]:
    """The consumer iterated in a thread for IDLE_SECONDS with nothing to take."""
    future = pool.submit(next_message, consumer, stop, looks)
    time.sleep(IDLE_SECONDS)
    assert not future.done()
    return future


def receive(future: Future[MessageProxy | None], consumer: Consumer) -> tuple[Any, ...]:
    """The arguments of the message the waiting consumer got (and acked)."""
    got = future.result(timeout=WITHIN_SECONDS)
    assert got is not None
    consumer.ack(got)
    return tuple(got.args)


def test_an_idle_consumer_waits_without_polling_and_an_enqueue_wakes_it(
    broker: WakingRedisBroker, consumers: Consumers, waiter: ThreadPoolExecutor
) -> None:
    looks = Looks(broker)
    consumer = consumers.of(broker, prefetch=4)
    future = idle(waiter, consumer, consumers.stop, looks)
    # One look, and one more after the subscription's confirmation; Dramatiq's own consumer
    # looks about ten times in a second of backing off.
    assert looks.fetches <= 2
    broker.enqueue(message(1))
    assert receive(future, consumer) == (1,)


def test_a_pipelined_batch_wakes_every_consumer_of_the_queue(
    broker: WakingRedisBroker, redis_url: str, consumers: Consumers, waiter: ThreadPoolExecutor
) -> None:
    """Two processes' consumers (two brokers), both idle: one batch wakes both."""
    other = consumers.broker(redis_url)
    looks = [Looks(broker), Looks(other)]
    first = consumers.of(broker, prefetch=1)
    second = consumers.of(other, prefetch=1)
    futures = [waiter.submit(next_message, first, consumers.stop, looks[0])]
    futures.append(idle(waiter, second, consumers.stop, looks[1]))
    assert [one.fetches <= 2 for one in looks] == [True, True]
    broker.enqueue_many([message(1), message(2)])
    got = [receive(futures[0], first), receive(futures[1], second)]
    assert sorted(got) == [(1,), (2,)]


def test_a_consumer_with_its_prefetch_full_looks_again_when_a_message_is_acked(
    broker: WakingRedisBroker, consumers: Consumers, waiter: ThreadPoolExecutor
) -> None:
    looks = Looks(broker)
    consumer = consumers.of(broker, prefetch=1)
    broker.enqueue(message(1))
    broker.enqueue(message(2))
    taken = next_message(consumer, consumers.stop, looks)
    assert taken is not None and taken.args == (1,)
    looks.turns = 0
    future = idle(waiter, consumer, consumers.stop, looks)  # full: it waits for a free place
    assert looks.turns == 1  # Dramatiq's own consumer turns about ten times a second
    consumer.ack(taken)
    assert receive(future, consumer) == (2,)


def test_a_closed_consumer_gives_back_the_messages_it_fetched_and_no_thread_took(
    broker: WakingRedisBroker, redis_url: str, consumers: Consumers, waiter: ThreadPoolExecutor
) -> None:
    """A stopping worker's consumer often holds a fetch (woken as messages arrive): they go
    back to the queue at once, not when its heartbeat lapses a minute later."""
    consumer = consumers.of(broker, prefetch=4)
    broker.enqueue_many([message(1), message(2)])
    taken = next_message(consumer, consumers.stop)
    assert taken is not None and taken.args == (1,)
    consumer.ack(taken)
    consumers.close(consumer)  # message 2 was fetched with message 1

    successor = consumers.of(consumers.broker(redis_url), prefetch=4)
    assert receive(waiter.submit(next_message, successor, consumers.stop), successor) == (2,)


@pytest.fixture
def no_channels_url(redis_url: str) -> Iterator[str]:
    """The server's URL as a user allowed every key and command but no channel (Redis 7's default
    for a new ACL user)."""
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser(
        "ae-no-channels",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    scheme, rest = redis_url.split("://", 1)
    try:
        yield f"{scheme}://ae-no-channels:secret@{rest}"
    finally:
        admin.acl_deluser("ae-no-channels")
        admin.close()


def test_a_user_refused_the_channels_still_sends_and_consumes_by_polling(
    no_channels_url: str,
    consumers: Consumers,
    waiter: ThreadPoolExecutor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = consumers.broker(no_channels_url)
    consumer = consumers.of(broker, prefetch=4, timeout=200)
    looking = waiter.submit(next_message, consumer, consumers.stop)
    broker.enqueue(message(1))
    broker.enqueue_many([message(2)])
    assert receive(looking, consumer) == (1,)
    assert next_message(consumer, consumers.stop) is not None
    consumers.close(consumer)
    assert broker.wakes_refused
    refusals = [r.getMessage() for r in caplog.records if "refused the wake channel" in r.message]
    # Said once by the broker (its publish) and once by the consumer (its subscription).
    assert len(refusals) == 2 and all("&dramatiq:*" in one for one in refusals)


def test_wakes_are_per_database(broker: WakingRedisBroker, redis_url: str) -> None:
    """Pub/sub channels are server-wide: two databases on one server have their own."""
    base, _, db = redis_url.rpartition("/")
    other = WakingRedisBroker(url=f"{base}/{(int(db) + 1) % 16}")
    try:
        assert broker.wake_channel(QUEUE) != other.wake_channel(QUEUE)
    finally:
        other.close()


def test_a_consumer_whose_server_is_gone_reports_the_connection_closed() -> None:
    """Dramatiq's consumer thread restarts a consumer that raises `ConnectionClosed`."""
    unreachable = WakingRedisBroker(
        connection_pool=redis.ConnectionPool(host="127.0.0.1", port=1, socket_connect_timeout=1.0)
    )
    try:
        with pytest.raises(dramatiq.errors.ConnectionClosed):
            unreachable.consume(QUEUE, prefetch=1, timeout=POLL_TIMEOUT_MS)
    finally:
        unreachable.close()
