"""The process's one bus of live updates: events in, each to the subscriptions that may see it.

Topics (`Topic`):

- `runs` -- a run was inserted or changed state. A burst of notifications is loaded in one read
  (`Store.load_runs`), only for runs somebody here may see, and each subscriber gets the row as
  it was at *its* transition (`RunChange`: the event's state, later fields blanked).
- `alerts` -- a budget alert was recorded; the NOTIFY carries the whole row: no read.
- `approvals` -- a tool approval was written; the NOTIFY carries its id and owner
  (`ApprovalChange`), and the `toolApprovals` feed reads the row (once per event and group).
- `steps` -- one run's transcript changed. Per watched run there is one `StepReader`: a change
  wakes it, it reads the run's changed steps once (`Store.steps_since`) and hands the rows to
  every watcher of the run -- one read per change per api process, whatever the number of
  watchers. A runSteps subscription reads its replay itself when it opens (`replay_steps`), after
  it started watching, so no change falls between; it drops what it has shown already.

Who may see an event is the `AudienceIndex` (owner -> subscriptions, admins); what a subscriber
holds is a `BoundedQueue` (overflow ends it with SUBSCRIBER_TOO_SLOW). The bus does not know
PostgreSQL: the notifications come from `PostgresSource` (`live/postgres.py`, the one LISTEN
connection of `db/listen.py`) or, in tests, from a test calling `notify` with an in-memory `Store`.

A new topic (as `approvals` was added): a name in `Topic`, a channel in `CHANNELS` whose decoder
publishes the event (with its `owner_id`), and a `Feed` in `api/subscriptions.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import structlog

from agent_engine.api.live.audience import AudienceIndex
from agent_engine.api.live.queue import BoundedQueue
from agent_engine.db import approvals as approvals_db
from agent_engine.db.alerts import BudgetAlertRow
from agent_engine.domain.runs import TERMINAL_STATES
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS, LIVE_READS

log = structlog.get_logger(__name__)

E = TypeVar("E")


class Topic(StrEnum):
    RUNS = "runs"
    ALERTS = "alerts"
    STEPS = "steps"
    APPROVALS = "approvals"


# The NOTIFY channels the bus hears (on the one LISTEN connection of the api process).
RUNS_CHANNEL = "agent_run_events"
STEPS_CHANNEL = "agent_run_steps"
ALERTS_CHANNEL = "budget_alert_events"
APPROVALS_CHANNEL = approvals_db.CHANNEL
CHANNELS = (RUNS_CHANNEL, STEPS_CHANNEL, ALERTS_CHANNEL, APPROVALS_CHANNEL)

# Fields that only exist once a run reached a later state than the event shows.
_LATER_FIELDS_BY_STATE = {
    "queued": ("started_at", "finished_at", "heartbeat_at", "output", "error", "reason", "cost"),
    "running": ("finished_at", "output", "error", "reason", "cost"),
}


@dataclass(frozen=True)
class ApprovalChange:
    """A write to `tool_approvals` (requested, decided, expired, cancelled): ids only."""

    id: int
    owner_id: int


@dataclass(frozen=True)
class RunChange:
    run: dict[str, Any]
    previous_state: str | None
    owner_id: int

    @property
    def state(self) -> str:
        return str(self.run["state"])


@dataclass(frozen=True)
class StepEvent:
    """One step of a run as read (`row`: the step's columns and the run's `run_state`)."""

    run_id: int
    owner_id: int
    row: dict[str, Any]

    @property
    def index(self) -> int:
        return int(self.row["index"])

    @property
    def finished(self) -> bool:
        return self.row["finished_at"] is not None


class Store(Protocol):
    """What the bus reads (PostgreSQL in the api; a dict in the unit tests)."""

    async def load_runs(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]: ...

    async def steps_since(self, run_id: int, from_index: int) -> list[dict[str, Any]]:
        """The run's state and its steps from `from_index` on (`run_state` in every row; one row
        with a NULL `index` when there are none; no row when the run is gone)."""
        ...

    async def close(self) -> None: ...


class Subscription(Generic[E]):
    """One subscription to a topic: its audience entry and its bounded queue of events."""

    __slots__ = ("_bus", "agent_id", "counted", "key", "owner_id", "queue", "reader", "topic")

    def __init__(
        self,
        bus: LiveBus,
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

    def __init__(self, bus: LiveBus, run_id: int, owner_id: int) -> None:
        self.bus = bus
        self.run_id = run_id
        self.owner_id = owner_id
        self.watchers: set[Subscription[StepEvent]] = set()
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


class LiveBus:
    def __init__(self, store: Store, *, queue_size: int = 256) -> None:
        self._store = store
        self.queue_size = queue_size
        self._index: dict[Topic, AudienceIndex[Subscription[Any]]] = {
            Topic.RUNS: AudienceIndex(),
            Topic.ALERTS: AudienceIndex(),
            Topic.APPROVALS: AudienceIndex(),
        }
        self._readers: dict[int, StepReader] = {}
        self._notes: list[dict[str, Any]] = []
        self._noted = asyncio.Event()
        self._dispatch: asyncio.Task[None] | None = None
        # channel -> decoder of its JSON payload (what `notify` does with it).
        self.channels: dict[str, Callable[[dict[str, Any]], None]] = {
            RUNS_CHANNEL: self.run_changed,
            STEPS_CHANNEL: self.step_changed,
            ALERTS_CHANNEL: self.alert_recorded,
            APPROVALS_CHANNEL: self.approval_changed,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._dispatch = asyncio.create_task(self._dispatch_forever(), name="live-dispatch")

    async def stop(self) -> None:
        tasks = [t for t in [self._dispatch, *(r.task for r in self._readers.values())] if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._dispatch = None
        for index in self._index.values():
            for subscription in list(index):
                subscription.close()
        for reader in list(self._readers.values()):
            for watcher in list(reader.watchers):
                watcher.close()
        with contextlib.suppress(Exception):
            await self._store.close()

    # -- subscribing -------------------------------------------------------------------------

    def subscribe(
        self,
        topic: Topic,
        *,
        owner_id: int | None,
        agent_id: int | None = None,
        queue_size: int | None = None,
        counted: bool = True,
    ) -> Subscription[Any]:
        """Events of `owner_id`'s (None: every owner's) runs or alerts; `agent_id`: one agent's."""
        subscription: Subscription[Any] = Subscription(
            self, topic, owner_id, queue_size or self.queue_size, agent_id=agent_id, counted=counted
        )
        self._index[topic].add(owner_id, subscription)
        if counted:
            ACTIVE_SUBSCRIPTIONS.inc()
        return subscription

    def watch_steps(
        self, run_id: int, *, owner_id: int, queue_size: int | None = None, counted: bool = True
    ) -> Subscription[StepEvent]:
        """The changes of `run_id`'s steps (owned by `owner_id`); the subscription ends when the
        run ends or is deleted. Call `replay_steps` after this for the steps so far."""
        subscription: Subscription[StepEvent] = Subscription(
            self, Topic.STEPS, owner_id, queue_size or self.queue_size, key=run_id, counted=counted
        )
        reader = self._readers.get(run_id)
        if reader is None:
            reader = self._readers[run_id] = StepReader(self, run_id, owner_id)
        reader.watchers.add(subscription)
        subscription.reader = reader
        if counted:
            ACTIVE_SUBSCRIPTIONS.inc()
        return subscription

    async def replay_steps(self, run_id: int, owner_id: int) -> tuple[list[StepEvent], bool]:
        """The run's steps so far and whether it has ended (or is gone); read after the call
        (watchers of the run asking at once share the read)."""
        reader = self._readers.get(run_id)
        if reader is not None:
            rows = await reader.replay()
        else:  # nobody watches it (the run ended meanwhile): a read of its own
            rows = await self._read_steps(run_id, 0, "replay")
        events = [StepEvent(run_id, owner_id, row) for row in rows if row["index"] is not None]
        return events, not rows or rows[0]["run_state"] in TERMINAL_STATES

    def _remove(self, subscription: Subscription[Any]) -> None:
        if subscription.topic is Topic.STEPS:
            reader = subscription.reader  # also once the run ended and the reader was forgotten
            if reader is None or subscription not in reader.watchers:
                return
            reader.watchers.discard(subscription)
            if not reader.watchers:
                self._forget_reader(reader)
                if reader.task is not asyncio.current_task():
                    reader.task.cancel()
        elif not self._index[subscription.topic].discard(subscription.owner_id, subscription):
            return
        if subscription.counted:
            ACTIVE_SUBSCRIPTIONS.dec()

    def _forget_reader(self, reader: StepReader) -> None:
        if self._readers.get(reader.run_id) is reader:
            del self._readers[reader.run_id]

    @property
    def subscriber_count(self) -> int:
        """Subscriptions fed by the bus directly (the groups' shared sources not included)."""
        direct = sum(1 for index in self._index.values() for s in index if s.counted)
        return direct + sum(1 for r in self._readers.values() for w in r.watchers if w.counted)

    def count(self, topic: Topic) -> int:
        """Every subscription of a topic (the groups' sources included)."""
        if topic is Topic.STEPS:
            return sum(len(r.watchers) for r in self._readers.values())
        return len(self._index[topic])

    # -- events in ---------------------------------------------------------------------------

    def notify(self, channel: str, payload: str) -> None:
        """A notification heard on `channel` (malformed ones are logged and dropped)."""
        handler = self.channels.get(channel)
        if handler is None:
            return
        try:
            handler(json.loads(payload))
        except Exception as exc:
            log.warning("ignored an event", channel=channel, error=str(exc), payload=payload[:200])

    def run_changed(self, note: dict[str, Any]) -> None:
        """`{run_id, agent_id, owner_id, state, previous_state}`: loaded and offered in a burst."""
        run_id, owner_id, agent_id = (int(note[k]) for k in ("run_id", "owner_id", "agent_id"))
        if self._index[Topic.RUNS].has_audience(owner_id):
            self._notes.append(
                {**note, "run_id": run_id, "owner_id": owner_id, "agent_id": agent_id}
            )
            self._noted.set()
        reader = self._readers.get(run_id)
        if reader is not None:  # a run that ends ends its runSteps subscriptions
            reader.changed.set()

    def step_changed(self, note: dict[str, Any]) -> None:
        reader = self._readers.get(int(note["run_id"]))
        if reader is not None:
            reader.changed.set()

    def alert_recorded(self, payload: dict[str, Any]) -> None:
        self.publish(Topic.ALERTS, alert_from_payload(payload))

    def approval_changed(self, payload: dict[str, Any]) -> None:
        self.publish(
            Topic.APPROVALS,
            ApprovalChange(id=int(payload["id"]), owner_id=int(payload["owner_id"])),
        )

    def publish(self, topic: Topic, event: Any, *, agent_id: int | None = None) -> None:
        """Offer `event` (with its `owner_id`) to the subscriptions of `topic` that may see it;
        `agent_id`: the event's agent, for subscriptions to one agent's events (runs)."""
        for subscription in self._index[topic].audience(event.owner_id):
            if subscription.agent_id is not None and subscription.agent_id != agent_id:
                continue
            if not subscription.queue.offer(event):  # it fell behind: out of the index
                self._remove(subscription)

    async def caught_up(self) -> None:
        """After a reconnect: step changes may have been missed, every reader reads again."""
        for reader in self._readers.values():
            reader.changed.set()

    # -- reading -----------------------------------------------------------------------------

    async def _read_steps(self, run_id: int, from_index: int, kind: str) -> list[dict[str, Any]]:
        LIVE_READS.labels(kind).inc()
        return await self._store.steps_since(run_id, from_index)

    async def _dispatch_forever(self) -> None:
        while True:
            await self._noted.wait()
            self._noted.clear()
            batch, self._notes = self._notes, []
            try:
                await self._dispatch_runs(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("run events dispatch failed", error=str(exc), events=len(batch))

    async def _dispatch_runs(self, batch: Collection[dict[str, Any]]) -> None:
        index = self._index[Topic.RUNS]
        wanted = [note for note in batch if index.has_audience(note["owner_id"])]
        if not wanted:
            return
        LIVE_READS.labels("runs").inc()
        rows = await self._store.load_runs(sorted({note["run_id"] for note in wanted}))
        for note in wanted:
            row = rows.get(note["run_id"])
            if row is None:  # deleted with its agent meanwhile
                continue
            # Taken again after the await: subscriptions may have come or gone meanwhile.
            self.publish(
                Topic.RUNS,
                RunChange(
                    run=_as_of(row, str(note["state"])),
                    previous_state=note.get("previous_state"),
                    owner_id=note["owner_id"],
                ),
                agent_id=note["agent_id"],
            )


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


def alert_from_payload(payload: dict[str, Any]) -> BudgetAlertRow:
    """The alert from the trigger's JSON (timestamps in ISO 8601 with their offset)."""
    return BudgetAlertRow(
        id=int(payload["id"]),
        owner_id=int(payload["owner_id"]),
        window_start=datetime.fromisoformat(str(payload["window_start"])),
        percent=int(payload["percent"]),
        used_tokens=int(payload["used_tokens"]),
        cap_tokens=int(payload["cap_tokens"]),
        crossed_at=datetime.fromisoformat(str(payload["crossed_at"])),
    )
