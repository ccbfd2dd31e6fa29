"""The live bus's subscribers: a `BusListener` (its audience entry and its bounded queue of
events), and per watched run one `StepReader`, the task that reads the run's changed steps once
per change and hands them to every watcher of the run (`live/bus.py`, topic `steps`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import structlog

from agent_engine.api.live.events import StepEvent, Topic
from agent_engine.api.live.queue import BoundedQueue
from agent_engine.domain.runs import TERMINAL_STATES

log = structlog.get_logger(__name__)

E = TypeVar("E")


class Bus(Protocol):
    """What a listener and a step reader ask of their bus (`LiveBus`)."""

    def _remove(self, subscription: BusListener[Any]) -> None: ...

    def _forget_reader(self, reader: StepReader) -> None: ...

    async def _read_steps(
        self, run_id: int, from_index: int, kind: str
    ) -> list[dict[str, Any]]: ...


class BusListener(Generic[E]):
    """One subscription to a topic: its audience entry and its bounded queue of events."""

    __slots__ = ("_bus", "agent_id", "counted", "key", "owner_id", "queue", "reader", "topic")

    def __init__(
        self,
        bus: Bus,
        topic: Topic,
        owner_id: int | None,
        limit: int,
        *,
        agent_id: int | None = None,
        key: int | None = None,
        counted: bool = True,
    ) -> None:
        self._bus = bus
        self.topic = topic
        self.owner_id = owner_id  # None: an admin's, every owner's events
        self.agent_id = agent_id  # runs: one agent's only
        self.key = key  # steps: the run watched
        self.reader: StepReader | None = None  # steps: the run's reader
        self.counted = counted  # in agent_engine_active_subscriptions (a group counts members)
        self.queue: BoundedQueue[E] = BoundedQueue(limit)

    @property
    def closed(self) -> bool:
        return self.queue.closed

    def batches(self) -> Any:
        """The events, a burst at a time, until the topic ends it; raises `SubscriberTooSlow`
        when the subscription overflowed."""
        return self._batches()

    async def _batches(self) -> Any:
        try:
            async for batch in self.queue.batches():
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        self._bus._remove(self)
        self.queue.end()


# What a step's row holds only once it finished (blanked in the "started" form of a step whose
# start and finish fell between two reads).
_FINISHED_FIELDS = ("finished_at", "output", "error", "prompt_tokens", "completion_tokens")


class StepReader:
    """The watchers of one run's steps and the reads that feed them.

    One task per watched run does every read of it, one at a time: a change (or several: they
    coalesce) is one read of the steps since the first unfinished one; a replay asked meanwhile
    is served by the next read (from step 0), which starts after the watcher asking was
    registered -- so however many dashboards open the run at once, they share a read, and a
    change committed after a watcher's replay was read reaches it live.
    """

    def __init__(self, bus: Bus, run_id: int, owner_id: int) -> None:
        self.bus = bus
        self.run_id = run_id
        self.owner_id = owner_id
        self.watchers: set[BusListener[StepEvent]] = set()
        self.changed = asyncio.Event()
        self.replays: list[asyncio.Future[list[dict[str, Any]]]] = []
        # index -> finished, as last handed out; None before the first read (the baseline).
        self.shown: dict[int, bool] | None = None
        self.from_index = 0
        self.task = asyncio.create_task(self._run(), name=f"run-steps-{run_id}")

    def replay(self) -> asyncio.Future[list[dict[str, Any]]]:
        """The run's rows from step 0, read after now."""
        waiter: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self.replays.append(waiter)
        self.changed.set()
        return waiter

    def _changed(self, rows: Sequence[dict[str, Any]]) -> list[StepEvent]:
        """The events `rows` show that were not handed out yet (a step that started and
        finished since the last read: its started form, then its finished one)."""
        baseline = self.shown is None
        shown: dict[int, bool] = {} if self.shown is None else self.shown
        self.shown = shown
        events = []
        for row in rows:
            if row["index"] is None:
                continue
            index, finished = int(row["index"]), row["finished_at"] is not None
            before = shown.get(index)
            if before is None or (finished and not before):
                shown[index] = finished
                if not baseline:
                    if finished and before is None:
                        started = dict(row)
                        for name in _FINISHED_FIELDS:
                            started[name] = None
                        events.append(StepEvent(self.run_id, self.owner_id, started))
                    events.append(StepEvent(self.run_id, self.owner_id, row))
        while shown.get(self.from_index):
            self.from_index += 1
        return events

    async def _run(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            waiters, self.replays = self.replays, []
            kind, start = ("replay", 0) if waiters else ("steps", self.from_index)
            try:
                rows = await self.bus._read_steps(self.run_id, start, kind)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: the reconnect wakes us again
                log.warning("run steps read failed", run_id=self.run_id, error=str(exc))
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(rows)
            events = self._changed(rows)
            ended = not rows or rows[0]["run_state"] in TERMINAL_STATES
            for watcher in list(self.watchers):
                for event in events:
                    if not watcher.queue.offer(event):
                        break
                if ended:
                    watcher.queue.end()
            if ended:
                self.bus._forget_reader(self)
                return
