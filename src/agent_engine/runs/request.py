"""Requesting a run: the start gate, the runtime gate, then a journal row.

Manual and scheduled starts share this path (the scheduler calls the same journal helpers for a
batch). A closed start gate writes nothing and raises; a closed runtime gate writes a `skipped`
row; otherwise a `queued` row whose execute message is sent only after the commit, so a worker
never receives the id of a row it cannot see yet.

A manual start is first tried as one statement (`db.runs.REQUEST_AT_ONCE`: the gate, the budget
sum and the insert; one round trip instead of six), with the platform settings this process saw
last (`runs/seen_platform.py`), which the statement checks are still the stored ones. When it
inserts nothing with the gate open — the budget is spent, a run is unfinished, the settings
changed — the transaction decides and journals, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import direct
from agent_engine.db import runs as runs_sql
from agent_engine.db.lane import autocommit
from agent_engine.db.platform import load_platform_settings
from agent_engine.domain.gate import AgentNotStartable, closed_lock
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs import seen_platform
from agent_engine.runs.budget import agents_over_cap, owners_over_budget
from agent_engine.runs.journal import insert_requested_runs

log = logging.getLogger(__name__)

# Sends a run's execute message (the broker's, or a test's recorder): the one type of it.
Enqueue = Callable[[int], None]

# Each send is a broker round trip: a batch's messages go out over a few threads at once (the
# Redis and RabbitMQ brokers of Dramatiq are thread-safe for sending). Small sends use one thread.
SEND_THREADS = 4
SEND_MESSAGES_PER_THREAD_MIN = 16
# A sender with `many` (the broker's) sends this many messages per round trip.
SEND_BATCH = 250
_FOREIGN_KEY_VIOLATION = "23503"


class AgentNotFound(Exception):
    def __init__(self, agent_id: int) -> None:
        super().__init__(f"agent {agent_id} not found")
        self.agent_id = agent_id


async def request_run(
    engine: AsyncEngine,
    agent_id: int,
    *,
    trigger: RunTrigger,
    now: datetime,
    enqueue: Enqueue,
    send_wait_seconds: float | None = None,
    database_clock: bool = False,
) -> runs_sql.RunRow:
    """Request one run; returns the inserted `agent_runs` row (queued or skipped).

    `now` decides the budget week; with `database_clock` the row's times are the database's
    `now()` (the API: a request's clock may be older than the write), else `now`.

    `send_wait_seconds` bounds how long the caller waits for the broker to take the execute
    message: a broker that hangs must not hang the request. The send goes on in its thread; the
    run is journaled `queued` either way, and the reaper re-sends a message that never arrived.
    """
    written = None if database_clock else now
    try:
        row = await _request_at_once(engine, agent_id, trigger=trigger, now=now, written=written)
        if row is None:
            row = await _request_in_transaction(
                engine, agent_id, trigger=trigger, now=now, written=written
            )
    except IntegrityError as exc:
        # The share lock prevents it; should the agent still vanish under the insert (the FK
        # refuses the run), the answer is the same as for a start just after the delete.
        if getattr(exc.orig, "sqlstate", None) == _FOREIGN_KEY_VIOLATION:
            raise AgentNotFound(agent_id) from exc
        raise
    if row.state == RunState.QUEUED:
        sending = asyncio.ensure_future(_sender(enqueue).send(row.id))
        _sends_in_flight.add(sending)
        sending.add_done_callback(_sends_in_flight.discard)
        try:
            await asyncio.wait_for(asyncio.shield(sending), send_wait_seconds)
        except TimeoutError:
            log.warning(
                "the broker did not take run %s's message within %g s; the reaper re-sends it",
                row.id,
                send_wait_seconds,
            )
    return row


async def _request_at_once(
    engine: AsyncEngine,
    agent_id: int,
    *,
    trigger: RunTrigger,
    now: datetime,
    written: datetime | None,
) -> runs_sql.RunRow | None:
    """The queued row, inserted in one statement; None when the transaction must decide. Raises
    as the transaction does for a missing agent or a closed gate (nothing is written then)."""
    seen = seen_platform.seen()
    async with autocommit(engine) as conn:
        result = await direct.fetch_one(
            conn,
            runs_sql.REQUEST_AT_ONCE,
            {
                "agent_id": agent_id,
                "trigger": str(trigger),
                "now": written,
                **seen_platform.budget_params(seen, now),
            },
        )
    row = _refuse_closed_gate(agent_id, result)
    if row.id is not None:
        return runs_sql.RunRow.from_row(row._mapping)
    seen_platform.remember(row.platform)  # the stored ones, for the next request
    return None


async def _request_in_transaction(
    engine: AsyncEngine,
    agent_id: int,
    *,
    trigger: RunTrigger,
    now: datetime,
    written: datetime | None,
) -> runs_sql.RunRow:
    """The journal row (queued or skipped), every case decided under the gate's lock."""
    async with engine.begin() as conn:
        agent = _refuse_closed_gate(
            agent_id,
            (await conn.execute(runs_sql.AGENT_GATE, {"agent_id": agent_id})).one_or_none(),
        )
        platform = await load_platform_settings(conn)
        spent = await owners_over_budget(conn, [agent.user_id], now=now, platform=platform)
        # The owner's budget first; then the agent's own cap, when it has one.
        capped = (
            set()
            if spent or agent.weekly_token_cap is None
            else await agents_over_cap(conn, [agent_id], now=now, platform=platform)
        )
        rows = await insert_requested_runs(
            conn,
            [agent_id],
            trigger=trigger,
            now=written,
            budget_spent=[agent_id] if spent else [],
            agent_cap_spent=capped,
        )
    return rows[agent_id]


def _refuse_closed_gate(
    agent_id: int, gate: Row[Any] | direct.Record | None
) -> Row[Any] | direct.Record:
    """The agent's gate row (`AGENT_GATE`'s columns) when it may start; raises when the agent
    is gone or its start gate is closed."""
    if gate is None:
        raise AgentNotFound(agent_id)
    lock = closed_lock(
        enabled=gate.enabled, admin_paused=gate.admin_paused, has_model=gate.has_model
    )
    if lock is not None:
        raise AgentNotStartable(agent_id, lock)
    return gate


# Sends a request stopped waiting for, kept referenced until they end (they log their outcome).
_sends_in_flight: set[asyncio.Future[None]] = set()


class _Sender:
    """The execute messages of single requests, sent together while a send is in flight.

    A request's message goes out at once when no send of the same `enqueue` is in progress on
    this loop. Requests committed meanwhile wait for it, then go out together: one hop to a
    sender thread and, with `many` (the broker's), one broker round trip for all of them. Alone,
    a request waits for nothing more than before; under load (the api's `startRun`s, a burst of
    manual starts) the per-message thread hop and round trip are shared. Each request still
    returns once the broker took its message (or `send_wait_seconds` passed).
    """

    def __init__(self, enqueue: Enqueue) -> None:
        self._enqueue = enqueue
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        self._draining = False

    async def send(self, run_id: int) -> None:
        sent = asyncio.get_running_loop().create_future()
        self._waiting.append((run_id, sent))
        if not self._draining:
            self._draining = True
            draining = asyncio.ensure_future(self._drain())
            _sends_in_flight.add(draining)
            draining.add_done_callback(_sends_in_flight.discard)
        await sent

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    await send_after_commit(self._enqueue, [run_id for run_id, _ in batch])
                finally:
                    _settle(batch)
        finally:
            # Cancelled (the loop is closing): nobody waits for a send that will not happen;
            # the reaper re-sends the messages of queued runs nobody claimed.
            self._draining = False
            waiting, self._waiting = self._waiting, []
            _settle(waiting)


def _settle(waiting: list[tuple[int, asyncio.Future[None]]]) -> None:
    for _, sent in waiting:
        if not sent.done():
            sent.set_result(None)


# Each loop's senders, by `enqueue` (a test's recorder, the broker's sender).
_senders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Enqueue, _Sender]] = (
    weakref.WeakKeyDictionary()
)


def _sender(enqueue: Enqueue) -> _Sender:
    of_loop = _senders.setdefault(asyncio.get_running_loop(), {})
    sender = of_loop.get(enqueue)
    if sender is None:
        sender = of_loop[enqueue] = _Sender(enqueue)
    return sender


async def send_after_commit(enqueue: Enqueue, run_ids: Iterable[int]) -> None:
    """Send execute messages for committed queued runs.

    A failed send is logged, not raised: the row is committed, and the reaper re-sends messages
    for queued runs nobody claimed. The sends run off the event loop (the broker client blocks).
    """
    ids = list(run_ids)
    if not ids:
        return

    def send_all(chunk: list[int]) -> None:
        for run_id in chunk:
            try:
                enqueue(run_id)
            except Exception:
                log.exception("could not send the execute message for run %s", run_id)

    loop = asyncio.get_running_loop()
    executor = _send_executor()
    many = getattr(enqueue, "many", None)
    if many is not None and len(ids) > 1:
        # The broker sends a batch in one round trip (`workers.broker.enqueue_execute.many`).
        def send_batch(chunk: list[int]) -> None:
            try:
                many(chunk)
            except Exception:
                log.exception("could not send the execute messages of %d runs", len(chunk))

        await asyncio.gather(
            *(
                loop.run_in_executor(
                    executor, copy_context().run, send_batch, ids[i : i + SEND_BATCH]
                )
                for i in range(0, len(ids), SEND_BATCH)
            )
        )
        return
    threads = max(1, min(SEND_THREADS, len(ids) // SEND_MESSAGES_PER_THREAD_MIN))
    await asyncio.gather(
        # Each send in a copy of this context: the messages carry the caller's trace (if any).
        *(
            loop.run_in_executor(executor, copy_context().run, send_all, ids[i::threads])
            for i in range(threads)
        )
    )


_executor_lock = threading.Lock()
_executor: tuple[int, ThreadPoolExecutor] | None = None


def _send_executor() -> ThreadPoolExecutor:
    """The process's sender threads (created again in a forked child: threads do not survive)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor[0] != os.getpid():
            _executor = (
                os.getpid(),
                ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="execute-send"),
            )
        return _executor[1]
