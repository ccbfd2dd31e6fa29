"""Stopping a run (cancelRun).

The API side is one compare-and-set: a `queued` or `running` run becomes `failed`/`cancelled` at
once, with the tokens spent so far (the larger of the last heartbeat and the recorded model calls),
and the same transaction notifies `agent_run_cancels`. A run that already finished makes the
cancel a `RunFinished` (CONFLICT); a late finish or heartbeat from the worker then matches no row.

The worker side is `CancelWatcher`: one LISTEN connection per worker process. A notification for a
run this process is executing cancels that run's asyncio task wherever it waits (the model, a
tool, a rate limit). When the listener was away (database restart) it re-checks the runs it
watches on reconnecting; the heartbeat's compare-and-set is the last resort.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.agents import audit
from agent_engine.db import approvals as approvals_db
from agent_engine.db import connection_waits as waits_db
from agent_engine.db import runs as runs_sql
from agent_engine.db.listen import Listener
from agent_engine.settings import to_libpq_url

log = logging.getLogger(__name__)

CHANNEL = "agent_run_cancels"
# A cancel can arrive a moment before this process registers the run it just claimed: remember
# cancels of unwatched runs this long (and at most this many), and honour them in `watch`.
RECENT_CANCEL_SECONDS = 60.0
RECENT_CANCELS_MAX = 10_000


class RunFinished(Exception):
    """The run was already terminal: nothing to cancel."""

    def __init__(self, run_id: int, state: str) -> None:
        super().__init__(f"run {run_id} already finished ({state})")
        self.run_id = run_id
        self.state = state


class RunMissing(Exception):
    def __init__(self, run_id: int) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


async def cancel_run(
    engine: AsyncEngine,
    run_id: int,
    *,
    error: str,
    audited_actor_id: int | None = None,
    owner_id: int | None = None,
) -> runs_sql.RunRow:
    """queued | running → failed/cancelled, a compare-and-set; the worker is told at commit. The
    finish time is the database's (`now()`), so it is never before the run's start.
    Returns the cancelled run's row. `audited_actor_id`: an admin cancelling another owner's run,
    recorded in the audit log in the same transaction."""
    async with engine.begin() as conn:
        found = (
            await conn.execute(runs_sql.CANCEL, {"run_id": run_id, "error": error})
        ).one_or_none()
        if found is None:
            state = (await conn.execute(runs_sql.STATE_OF, {"run_id": run_id})).scalar()
            if state is None:
                raise RunMissing(run_id)
            raise RunFinished(run_id, str(state))
        row = runs_sql.RunRow.from_row(found)
        # A run parked on its owner's approval: the approval ends with it.
        cancelled = await approvals_db.cancel_pending(
            conn, run_id, actor_id=audited_actor_id or owner_id, error=error
        )
        if cancelled is not None:
            await approvals_db.notify(conn, cancelled)
        # A run parked on its owner's connection: the wait ends with it.
        await waits_db.cancel_open(conn, [run_id], error=error)
        # Delivered at commit, to every worker process; only the one executing it acts. Also for
        # a queued run: a worker may have claimed it while this statement waited for the row.
        await conn.execute(runs_sql.NOTIFY, {"channel": CHANNEL, "payload": str(run_id)})
        if audited_actor_id is not None:
            await audit.record(
                conn,
                audited_actor_id,
                audit.AuditAction.RUN_CANCELLED,
                agent_id=row.agent_id,
                user_id=owner_id,
                details={"runId": str(run_id), "state": row.state, "error": error},
            )
    return row


class CancelWatcher:
    """A worker process's ear for cancels of the runs it executes."""

    def __init__(self, database_url: str) -> None:
        self._listener = Listener(
            to_libpq_url(database_url),
            {CHANNEL: self._on_notify},
            name="cancel",
            on_reconnect=self._recheck,
        )
        self._watched: dict[int, asyncio.Future[Any]] = {}
        self._recent: OrderedDict[int, float] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._checker: AsyncEngine | None = None
        self.listening = self._listener.listening

    def start(self, engine: AsyncEngine) -> None:
        """Start listening (idempotent); `engine` serves the re-checks after a reconnect."""
        self._checker = engine
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._listener.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def watch(self, run_id: int, work: asyncio.Future[Any]) -> None:
        """Cancel `work` when run `run_id` is cancelled; forgotten when `work` is done."""
        self._watched[run_id] = work
        cancelled_at = self._recent.pop(run_id, None)
        if cancelled_at is not None and time.monotonic() - cancelled_at < RECENT_CANCEL_SECONDS:
            self._cancel(run_id)

        def forget(_: asyncio.Future[Any]) -> None:
            if self._watched.get(run_id) is work:
                del self._watched[run_id]

        work.add_done_callback(forget)

    @property
    def watched(self) -> int:
        return len(self._watched)

    def _cancel(self, run_id: int) -> None:
        work = self._watched.get(run_id)
        if work is None:
            self._recent[run_id] = time.monotonic()
            while len(self._recent) > RECENT_CANCELS_MAX:
                self._recent.popitem(last=False)
        elif not work.done():
            log.info("run %s was cancelled: stopping its work", run_id)
            work.cancel()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            self._cancel(int(payload))

    async def _recheck(self) -> None:
        """Runs cancelled while the listener was away: stop those no longer running."""
        if not self._watched or self._checker is None:
            return
        async with self._checker.connect() as conn:
            result = await conn.execute(runs_sql.NOT_RUNNING, {"ids": list(self._watched)})
            for row in result:
                self._cancel(int(row.id))
