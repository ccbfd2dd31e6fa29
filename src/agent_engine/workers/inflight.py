"""The worker process's in-flight set: at most N runs executing at once on its event loop.

A run's lifetime is not tied to a Dramatiq worker thread. The execute actor reserves a place here
(waiting, before it claims anything, while the set is full — so a full worker leaves further
messages in the broker instead of claiming runs it cannot start), claims the run, hands it to a
task of this set and returns: the message is acknowledged and the thread takes the next one. A
waiting model costs a task and a socket, not a thread, so hundreds of runs fit in one process.

On shutdown the set stops admitting (reservations still waiting raise `WorkerStopping`: nothing
was claimed, the message goes back to the broker), gives the runs in flight a grace period, then
cancels the rest — each journals `failed` with the interruption as its error. A SIGKILLed
process journals nothing: its runs stop beating and the reaper fails them as stale.

Loop-bound: create, reserve and start on the process's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

# How long cancelled runs get to journal their interruption once the grace period is over.
CANCEL_JOURNAL_SECONDS = 10.0


class WorkerStopping(Exception):
    """The worker is stopping: the reservation was refused before anything was claimed."""


class InFlight:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the in-flight limit must be at least 1")
        self.limit = limit
        self._free = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting = 0
        self._stopping = False
        self.peak = 0

    @property
    def running(self) -> int:
        return len(self._tasks)

    @property
    def waiting(self) -> int:
        return self._waiting

    async def reserve(self) -> None:
        """Wait for a free place; the caller then `start`s a run or `cancel_reservation`s."""
        if self._stopping:
            raise WorkerStopping
        self._waiting += 1
        try:
            await self._free.acquire()
        finally:
            self._waiting -= 1
        if self._stopping:
            self._free.release()
            raise WorkerStopping

    def cancel_reservation(self) -> None:
        """Nothing to run after all (the claim found the run taken, ended or waiting)."""
        self._free.release()

    def start(self, coro: Coroutine[Any, Any, object], *, name: str) -> asyncio.Task[Any]:
        """Run `coro` in the reserved place; the place frees itself when the task ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        self.peak = max(self.peak, len(self._tasks))
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._free.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("a run's task failed", exc_info=task.exception())

    def stop_admitting(self) -> None:
        """Refuse new reservations and wake the ones waiting (they raise `WorkerStopping`)."""
        self._stopping = True
        for _ in range(self._waiting):
            self._free.release()

    async def drain(self, grace_seconds: float) -> None:
        """Let the runs in flight finish for `grace_seconds`, then interrupt the rest."""
        self.stop_admitting()
        if self._tasks:
            log.info("waiting up to %gs for %d runs in flight", grace_seconds, len(self._tasks))
            await asyncio.wait(set(self._tasks), timeout=grace_seconds)
        pending = [task for task in self._tasks if not task.done()]
        if not pending:
            return
        log.warning("interrupting %d runs still in flight", len(pending))
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=CANCEL_JOURNAL_SECONDS)
