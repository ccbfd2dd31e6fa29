"""`agent-engine worker`: Dramatiq worker processes running the actors.

One process runs, in-process and with the settings it was given (no environment round-trip), two
`dramatiq.Worker`s on one event loop: one for the `runs` queue, whose threads only wait for a
place in the in-flight set and claim (the runs themselves execute as tasks on the loop, up to
`runs_in_flight` at once), and one with its own threads for the `ticks` queue, so the schedule
scan and the reaper run on time however many runs are in flight. `--processes N` starts N such
processes (spawned, each with its own event loop, engine and broker connection) and supervises
them: a child that dies is replaced, SIGTERM/SIGINT stop them all. On a stop, runs in flight get a
grace period to finish; runs still going after it are interrupted and journalled as failed, and
anything harder (SIGKILL) is left to the reaper.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import dramatiq

from agent_engine.collector import tune_gc
from agent_engine.observability.logging import configure_logging
from agent_engine.observability.tracing import WORKER_SERVICE, configure_tracing
from agent_engine.runtime.providers import openai_provider
from agent_engine.settings import Settings
from agent_engine.workers.actors import (
    DELIVERIES_QUEUE,
    QUEUES,
    RUNS_QUEUE,
    TICKS_QUEUE,
    worker_context,
)
from agent_engine.workers.broker import close_broker, configure_broker

log = logging.getLogger(__name__)

# Threads of the runs worker: how many messages are claimed at once (and wait for an in-flight
# place when the set is full) — not how many runs execute, which is `runs_in_flight`. Each claim
# waits for the event loop, which in a burst is busy finishing runs: with 8 the refill of a full
# set lagged its finishes (stampede quick: 0.67 times the bare client's runs/s; 16: 0.77; 32: 0.78).
DEFAULT_THREADS = 16
# The ticks worker's own threads: a schedule scan and a reap can run side by side.
TICK_THREADS = 2
# How long a runs consumer waits before it looks at Redis again with nothing to wake it. An
# enqueue wakes it at once and an ack with its prefetch full too (`waking_redis`), so this bounds
# only the heartbeat fetch and the delay queue's lateness; the threads check for a stop as often.
# (Polled, 100 ms cost an idle worker ~2 % of a core; Dramatiq's 1 s left the claiming threads
# idle between fetches in a burst.)
RUNS_WORKER_TIMEOUT_MS = 1000
# How long a stopping worker lets runs in progress finish before interrupting them (the default of
# `AGENT_ENGINE_WORKER_DRAIN_SECONDS`, which the processes use; tests pass their own).
SHUTDOWN_GRACE_SECONDS = 20.0
# Dramatiq joins its threads for at most this long beyond the grace (a claim in progress).
THREAD_JOIN_MARGIN_SECONDS = 10.0
# A crashing child is replaced, but not in a hot loop.
RESTART_DELAY_SECONDS = 1.0
SUPERVISE_POLL_SECONDS = 0.5
# How often the main thread wakes to run a signal handler that is pending (see `_serve`).
STOP_POLL_SECONDS = 0.5


def run_worker(
    settings: Settings,
    *,
    processes: int = 1,
    threads: int = DEFAULT_THREADS,
    queues: Iterable[str] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT."""
    queue_set = _check_queues(queues)
    if processes <= 1:
        _serve(settings, threads, queue_set)
    else:
        _supervise(settings, processes, threads, queue_set)


def _check_queues(queues: Iterable[str] | None) -> set[str] | None:
    if not queues:
        return None
    chosen = set(queues)
    unknown = chosen - set(QUEUES)
    if unknown:
        raise ValueError(f"unknown queues {sorted(unknown)}; the queues are {list(QUEUES)}")
    return chosen


@dataclass
class EngineWorker:
    """The Dramatiq workers of one process: runs (claims) and ticks, sharing one event loop."""

    runs: dramatiq.Worker | None
    ticks: dramatiq.Worker | None


def start_worker(
    settings: Settings, *, threads: int = DEFAULT_THREADS, queues: set[str] | None = None
) -> EngineWorker:
    """Start the workers in this process; the caller stops them with `stop_worker`. Also for
    tests."""
    broker = configure_broker(settings)
    openai_provider.warm_up()  # not inside the first burst of runs
    chosen = queues or set(QUEUES)
    runs = ticks = None
    # Deliveries ride with the ticks: their actor only hands an attempt to a task and returns.
    light = chosen & {TICKS_QUEUE, DELIVERIES_QUEUE}
    if light:
        ticks = _start_dramatiq_worker(broker, queues=light, worker_threads=TICK_THREADS)
    if RUNS_QUEUE in chosen:
        runs = _start_dramatiq_worker(
            broker,
            queues={RUNS_QUEUE},
            worker_threads=threads,
            worker_timeout=RUNS_WORKER_TIMEOUT_MS,
        )
    return EngineWorker(runs=runs, ticks=ticks)


def _start_dramatiq_worker(broker: dramatiq.Broker, **options: Any) -> dramatiq.Worker:
    """Start one Dramatiq worker, then take the middleware its start registered off the broker.

    `Worker.start` adds a middleware to the broker whose only job is to open a consumer for each
    queue: at once for the queues already declared, later for queues declared afterwards. Every
    queue of ours is declared by `configure_broker` (the actors) before a worker starts, so once
    started that middleware has done its work. Left on the broker it is harmful here, because a
    process runs two workers on one broker (runs and ticks): the second start logged Dramatiq's
    "You're adding a middleware of the same type twice: _WorkerMiddleware" warning, and each
    stop/start in one process (tests) left one more behind, still notified of every event.
    """
    worker = dramatiq.Worker(broker, **options)
    worker.start()
    broker.middleware[:] = [
        one for one in broker.middleware if getattr(one, "worker", None) is not worker
    ]
    return worker


def stop_worker(worker: EngineWorker, *, grace_seconds: float = SHUTDOWN_GRACE_SECONDS) -> None:
    """Stop taking messages, give runs in flight `grace_seconds`, interrupt the rest (they journal
    `failed`), close the resources. Runs first, ticks last: the loop stops with the last one."""
    worker_context().shutdown_grace_seconds = grace_seconds
    for one in (worker.runs, worker.ticks):
        if one is not None:
            # The threads only claim (quick) once the in-flight set stops admitting; the grace is
            # spent on the runs in flight, in the last worker's shutdown.
            one.stop(timeout=int((grace_seconds + THREAD_JOIN_MARGIN_SECONDS) * 1000))


def _serve(settings: Settings, threads: int, queues: set[str] | None) -> None:
    configure_logging(settings)
    configure_tracing(WORKER_SERVICE)
    tune_gc()  # as `serve`: what the process imported is frozen out of the collector's walks
    stop = threading.Event()
    _on_stop_signals(stop)
    worker = start_worker(settings, threads=threads, queues=queues)
    log.info(
        "worker started: up to %d runs in flight, %d claiming threads, queues %s",
        settings.runs_in_flight,
        threads,
        sorted(queues or QUEUES),
    )
    try:
        # Timed waits, not one `stop.wait()`: the kernel delivers a SIGTERM to any thread of the
        # process, and when it lands on one of Dramatiq's, the main thread (where Python runs
        # the handler) sleeps on in an untimed lock wait and the pod is killed undrained when
        # its grace period ends. Waking up now and then runs a handler that is pending.
        while not stop.wait(STOP_POLL_SECONDS):
            pass
    finally:
        log.info("worker stopping: runs in flight get %gs to finish", settings.worker_drain_seconds)
        stop_worker(worker, grace_seconds=settings.worker_drain_seconds)
        close_broker()


def _supervise(settings: Settings, processes: int, threads: int, queues: set[str] | None) -> None:
    configure_logging(settings)
    stop = threading.Event()
    _on_stop_signals(stop)
    spawn = multiprocessing.get_context("spawn")

    def start_child() -> BaseProcess:
        child = spawn.Process(
            target=_child_main, args=(settings, threads, queues), name="agent-engine-worker"
        )
        child.start()
        return child

    children = [start_child() for _ in range(processes)]
    try:
        while not stop.wait(SUPERVISE_POLL_SECONDS):
            for index, child in enumerate(children):
                if not child.is_alive() and not stop.is_set():
                    log.error(
                        "worker process %s exited (%s); replacing it", child.pid, child.exitcode
                    )
                    time.sleep(RESTART_DELAY_SECONDS)
                    children[index] = start_child()
    finally:
        for child in children:
            if child.is_alive() and child.pid is not None:
                _signal(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.worker_drain_seconds * 2 + 10
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()


def _child_main(settings: Settings, threads: int, queues: set[str] | None) -> None:
    _serve(settings, threads, queues)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _on_stop_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT set `stop`; only possible from the main thread (else the embedder stops)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
