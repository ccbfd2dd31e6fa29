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

Where each part lives: the topics, channels, events and `Store` in `live/events.py`; a
subscriber (`BusListener`) and the per-run `StepReader` in `live/listeners.py`.

A new topic (as `approvals` was added): a name in `Topic`, a channel in `CHANNELS` (both in
`live/events.py`) whose decoder publishes the event (with its `owner_id`), and a `Feed` in
`api/subscriptions.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection
from typing import Any

import structlog

from agent_engine.api.live.audience import AudienceIndex
from agent_engine.api.live.events import (
    ALERTS_CHANNEL,
    APPROVALS_CHANNEL,
    CHANNELS,
    RUNS_CHANNEL,
    STEPS_CHANNEL,
    ApprovalChange,
    RunChange,
    StepEvent,
    Store,
    Topic,
    alert_from_payload,
    as_of,
)
from agent_engine.api.live.listeners import BusListener, StepReader
from agent_engine.domain.runs import TERMINAL_STATES
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS, LIVE_READS

log = structlog.get_logger(__name__)

__all__ = [
    "ALERTS_CHANNEL",
    "APPROVALS_CHANNEL",
    "CHANNELS",
    "RUNS_CHANNEL",
    "STEPS_CHANNEL",
    "ApprovalChange",
    "BusListener",
    "LiveBus",
    "RunChange",
    "StepEvent",
    "StepReader",
    "Store",
    "Topic",
    "alert_from_payload",
]


class LiveBus:
    def __init__(self, store: Store, *, queue_size: int = 256) -> None:
        self._store = store
        self.queue_size = queue_size
        self._index: dict[Topic, AudienceIndex[BusListener[Any]]] = {
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
    ) -> BusListener[Any]:
        """Events of `owner_id`'s (None: every owner's) runs or alerts; `agent_id`: one agent's."""
        subscription: BusListener[Any] = BusListener(
            self, topic, owner_id, queue_size or self.queue_size, agent_id=agent_id, counted=counted
        )
        self._index[topic].add(owner_id, subscription)
        if counted:
            ACTIVE_SUBSCRIPTIONS.inc()
        return subscription

    def watch_steps(
        self, run_id: int, *, owner_id: int, queue_size: int | None = None, counted: bool = True
    ) -> BusListener[StepEvent]:
        """The changes of `run_id`'s steps (owned by `owner_id`); the subscription ends when the
        run ends or is deleted. Call `replay_steps` after this for the steps so far."""
        subscription: BusListener[StepEvent] = BusListener(
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

    def _remove(self, subscription: BusListener[Any]) -> None:
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
                    run=as_of(row, str(note["state"])),
                    previous_state=note.get("previous_state"),
                    owner_id=note["owner_id"],
                ),
                agent_id=note["agent_id"],
            )
