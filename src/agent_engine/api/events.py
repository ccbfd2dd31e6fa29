"""Run events: one `LISTEN agent_run_events` connection per api process, fanned out in process.

The NOTIFY trigger on `agent_runs` sends ids and states only. For each notification the hub loads
the run row once (a burst is loaded in one statement), whatever the number of subscribers, and
hands every subscriber whose viewer may see the run an event that shows the state of *its*
transition with its previous state -- not whatever the row holds by the time it is delivered.

Subscribers have bounded queues (`api/subscribers.py`). The listener reconnects after the
database goes away (`db/listen.py`); events committed while it was away are not replayed: the
stream is live, and a client re-queries the journal after reconnecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import asyncpg
import structlog

from agent_engine.api.subscribers import BoundedSubscriber
from agent_engine.db.listen import Listener, Notify
from agent_engine.db.run_events import load_runs
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS
from agent_engine.settings import to_libpq_url

CHANNEL = "agent_run_events"
# Transcript changes (agent_run_steps rows): ids only; they wake the runSteps subscribers of the
# run, which read the steps themselves (see `StepWatch`).
STEPS_CHANNEL = "agent_run_steps"
# Fields that only exist once a run reached a later state than the event shows.
_LATER_FIELDS_BY_STATE = {
    "queued": ("started_at", "finished_at", "heartbeat_at", "output", "error", "reason", "cost"),
    "running": ("finished_at", "output", "error", "reason", "cost"),
}

log = structlog.get_logger(__name__)

# A handler of another channel heard on the hub's LISTEN connection; gets the decoded payload.
ChannelHandler = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class RunEvent:
    run: dict[str, Any]
    previous_state: str | None
    owner_id: int

    @property
    def state(self) -> str:
        return str(self.run["state"])

    @property
    def agent_id(self) -> int:
        return int(self.run["agent_id"])


class Subscriber(BoundedSubscriber[RunEvent]):
    """One subscription: which runs it may see and its bounded queue."""

    def __init__(
        self,
        owner_id: int | None,  # None: an admin, sees every owner's runs
        agent_id: int | None,
        queue: asyncio.Queue[RunEvent | Exception],
        hub: RunEventHub | None = None,
        *,
        counted: bool = True,
    ) -> None:
        super().__init__(queue)
        self.owner_id = owner_id
        self.agent_id = agent_id
        self._hub = hub
        # A subscription of its own (in `agent_engine_active_subscriptions`), or the shared source
        # of a group of subscriptions (api/fanout), which counts its members instead.
        self.counted = counted

    def wants(self, owner_id: int, agent_id: int) -> bool:
        if self.owner_id is not None and owner_id != self.owner_id:
            return False
        return self.agent_id is None or agent_id == self.agent_id

    def forget(self) -> None:
        if self._hub is not None:
            self._hub._remove(self)


@dataclass(eq=False)
class StepWatch:
    """A runSteps subscription's wake-up: set on any change of its run's steps or state.

    Coalescing by design: the subscriber re-reads the run's steps after waking, so a burst of
    changes, a change missed while the listener reconnected, or notifications arriving in another
    order than their writes all end in the same, current view.
    """

    run_id: int
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _hub: RunEventHub | None = field(default=None, repr=False)

    async def wait(self) -> None:
        await self.changed.wait()
        self.changed.clear()

    def close(self) -> None:
        if self._hub is not None:
            self._hub._unwatch_steps(self)
            self._hub = None


class RunEventHub:
    def __init__(self, database_url: str, *, queue_size: int = 256) -> None:
        self._dsn = to_libpq_url(database_url)
        self._queue_size = queue_size
        self._subscribers: set[Subscriber] = set()
        # The audience of an event is its owner's subscribers plus the admins': an event touches
        # only them, not every subscriber of the process.
        self._by_owner: dict[int, set[Subscriber]] = {}
        self._admins: set[Subscriber] = set()
        self._notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._loader: asyncpg.Connection | None = None
        self._step_watches: dict[int, set[StepWatch]] = {}
        # Read by the listener at each connect: `add_channel` adds to it.
        self._channels: dict[str, Notify] = {
            CHANNEL: self._on_notify,
            STEPS_CHANNEL: self._on_step_notify,
        }
        self._listener = Listener(
            self._dsn, self._channels, name="run events", on_reconnect=self._caught_up
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listener.run(), name="run-events-listen"),
            asyncio.create_task(self._dispatch_forever(), name="run-events-dispatch"),
        ]

    async def wait_listening(self) -> None:
        await self._listener.listening.wait()

    @property
    def listening(self) -> bool:
        return self._listener.listening.is_set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._loader is not None:
            with contextlib.suppress(Exception):
                await self._loader.close()
            self._loader = None
        for subscriber in list(self._subscribers):
            subscriber.close()
        self._wake_steps()

    def add_channel(self, channel: str, handler: ChannelHandler) -> None:
        """Hear another channel on the same LISTEN connection (one per api process), e.g. the
        budget alerts (`api/alert_events.py`). Call before `start()`."""
        self._channels[channel] = partial(self._on_channel, handler)

    # -- subscribers -------------------------------------------------------------------------

    def subscribe(
        self,
        *,
        owner_id: int | None,
        agent_id: int | None = None,
        queue_size: int | None = None,
        counted: bool = True,
    ) -> Subscriber:
        """Events of `owner_id`'s runs (None: every owner's), or of one agent's runs."""
        queue: asyncio.Queue[RunEvent | Exception] = asyncio.Queue(queue_size or self._queue_size)
        subscriber = Subscriber(owner_id, agent_id, queue, self, counted=counted)
        self._subscribers.add(subscriber)
        if owner_id is None:
            self._admins.add(subscriber)
        else:
            self._by_owner.setdefault(owner_id, set()).add(subscriber)
        if counted:
            ACTIVE_SUBSCRIPTIONS.inc()
        return subscriber

    def _remove(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.discard(subscriber)
            if subscriber.owner_id is None:
                self._admins.discard(subscriber)
            else:
                owners = self._by_owner.get(subscriber.owner_id)
                if owners is not None:
                    owners.discard(subscriber)
                    if not owners:
                        del self._by_owner[subscriber.owner_id]
            if subscriber.counted:
                ACTIVE_SUBSCRIPTIONS.dec()

    def _audience(self, owner_id: int, agent_id: int) -> list[Subscriber]:
        """The subscribers that may see an event of this owner's agent (a copy: offering may
        close a subscriber that fell behind)."""
        candidates = [*self._by_owner.get(owner_id, ()), *self._admins]
        return [s for s in candidates if s.agent_id is None or s.agent_id == agent_id]

    @property
    def subscriber_count(self) -> int:
        """Subscriptions fed by this hub directly (the groups' shared sources not included)."""
        return sum(1 for s in self._subscribers if s.counted) + sum(
            len(w) for w in self._step_watches.values()
        )

    def watch_steps(self, run_id: int) -> StepWatch:
        watch = StepWatch(run_id, _hub=self)
        self._step_watches.setdefault(run_id, set()).add(watch)
        ACTIVE_SUBSCRIPTIONS.inc()
        return watch

    def _unwatch_steps(self, watch: StepWatch) -> None:
        watches = self._step_watches.get(watch.run_id)
        if watches is not None and watch in watches:
            watches.discard(watch)
            if not watches:
                del self._step_watches[watch.run_id]
            ACTIVE_SUBSCRIPTIONS.dec()

    def _wake_steps(self, run_id: int | None = None) -> None:
        """Wake the runSteps subscribers of `run_id` (all of them when None: after a reconnect)."""
        if run_id is None:
            groups = list(self._step_watches.values())
        else:
            groups = [self._step_watches.get(run_id, set())]
        for watches in groups:
            for watch in watches:
                watch.changed.set()

    def _on_step_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._wake_steps(int(json.loads(payload)["run_id"]))
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed step event", payload=payload[:200])

    # -- listening ---------------------------------------------------------------------------

    async def _caught_up(self) -> None:
        """After a reconnect: step changes may have been missed, the runSteps readers re-read."""
        self._wake_steps()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            note = json.loads(payload)
        except ValueError:
            log.warning("ignored a malformed run event", payload=payload[:200])
            return
        self._notifications.put_nowait(note)
        if self._step_watches:
            # A run that ends also ends its runSteps subscriptions.
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._wake_steps(int(note["run_id"]))

    def _on_channel(
        self, handler: ChannelHandler, _conn: object, _pid: int, channel: str, payload: str
    ) -> None:
        try:
            handler(json.loads(payload))
        except Exception as exc:
            log.warning("ignored an event", channel=channel, error=str(exc), payload=payload[:200])

    # -- dispatch ----------------------------------------------------------------------------

    async def _dispatch_forever(self) -> None:
        while True:
            batch = [await self._notifications.get()]
            while not self._notifications.empty():
                batch.append(self._notifications.get_nowait())
            try:
                await self._dispatch(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("run events dispatch failed", error=str(exc), events=len(batch))

    async def _dispatch(self, batch: list[dict[str, Any]]) -> None:
        wanted = [
            note for note in batch if self._audience(int(note["owner_id"]), int(note["agent_id"]))
        ]
        if not wanted:
            return
        rows = await self._load_runs(sorted({int(note["run_id"]) for note in wanted}))
        for note in wanted:
            row = rows.get(int(note["run_id"]))
            if row is None:  # deleted with its agent meanwhile
                continue
            event = RunEvent(
                run=_as_of(row, str(note["state"])),
                previous_state=note.get("previous_state"),
                owner_id=int(note["owner_id"]),
            )
            # Taken again after the await: subscribers may have come or gone meanwhile.
            for subscriber in self._audience(event.owner_id, event.agent_id):
                subscriber.offer(event)

    async def _load_runs(self, run_ids: list[int]) -> dict[int, dict[str, Any]]:
        for attempt in range(2):
            try:
                if self._loader is None or self._loader.is_closed():
                    self._loader = await asyncpg.connect(self._dsn)
                return await load_runs(self._loader, run_ids)
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError):
                if self._loader is not None:
                    with contextlib.suppress(Exception):
                        await self._loader.close(timeout=1)
                self._loader = None
                if attempt:
                    raise
        return {}


def _as_of(row: dict[str, Any], state: str) -> dict[str, Any]:
    """The row as it was at the transition: the event's state, later fields blanked."""
    if row["state"] == state:
        return row
    shown = dict(row, state=state)
    for name in _LATER_FIELDS_BY_STATE.get(state, ()):
        shown[name] = None
    if state == "queued":
        shown["tokens_used"] = 0
    return shown
