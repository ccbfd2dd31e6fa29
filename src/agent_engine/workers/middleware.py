"""Dramatiq middleware of the worker process: one event loop shared by its workers, and the
actors' resources stopped and closed with the last of them."""

from __future__ import annotations

import logging
import threading

import dramatiq
from dramatiq.asyncio import EventLoopThread, get_event_loop_thread, set_event_loop_thread
from dramatiq.middleware import AsyncIO, Middleware

from agent_engine.server_thread import new_event_loop
from agent_engine.workers.context import WorkerContext

log = logging.getLogger(__name__)


class SharedAsyncIO(AsyncIO):
    """Dramatiq's AsyncIO middleware for several `dramatiq.Worker`s in one process: the first to
    boot starts the event loop (uvloop when installed), the last to shut down stops it (the runs
    and the ticks worker share one loop, one engine and one in-flight set)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._workers = 0

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers += 1
            if self._workers == 1:
                thread = EventLoopThread(self.logger)
                # uvloop when installed (as the api under uvicorn): its transports and callbacks
                # are C, a run's socket writes and wake-ups cost less CPU.
                thread.loop.close()
                thread.loop = new_event_loop()
                thread.start(timeout=1.0)
                set_event_loop_thread(thread)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers -= 1
            if self._workers == 0:
                super().after_worker_shutdown(broker, worker)  # type: ignore[no-untyped-call]


class WorkerContextMiddleware(Middleware):
    """Stops admitting runs when a worker begins to stop; closes the per-process resources after
    the last worker stopped, while the event loop still runs (SharedAsyncIO stops it next)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self._lock = threading.Lock()
        self._workers = 0

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers += 1

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # The process is stopping (its workers stop together): wake the threads waiting for an
        # in-flight place, so Dramatiq can join them; their messages go back to the broker.
        loop_thread = get_event_loop_thread()
        if loop_thread is not None:
            loop_thread.loop.call_soon_threadsafe(self.context.stop_admitting)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers -= 1
            last = self._workers == 0
        loop_thread = get_event_loop_thread()
        if not last or loop_thread is None:
            return
        try:
            loop_thread.run_coroutine(self.context.close())
        except Exception:
            log.warning("could not close the worker's resources cleanly", exc_info=True)
