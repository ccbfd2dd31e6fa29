"""`agent-engine clock`: sends the schedule, reap, retention, delivery and tool-source ticks.

Safe to run several replicas: the scan claims agents with `FOR NO KEY UPDATE … SKIP LOCKED` (why not
`FOR UPDATE`: db/runs.py, CLAIM_DUE_AGENTS) and every actor is idempotent, so extra ticks cost a
query, never a duplicate run. No leader election.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from agent_engine.observability.logging import configure_logging
from agent_engine.observability.tracing import CLOCK_SERVICE, configure_tracing
from agent_engine.settings import Settings
from agent_engine.workers.broker import (
    close_broker,
    configure_broker,
    send_delivery_tick,
    send_reap_tick,
    send_retention_tick,
    send_schedule_tick,
    send_tool_sources_tick,
)

log = logging.getLogger(__name__)


# How long after a whole multiple of its period (on the wall clock) the schedule tick is sent:
# a slot is a whole minute, and the scan compares it with the database's clock, which may run a
# little behind this host's.
SCHEDULE_TICK_MARGIN_SECONDS = 0.05


@dataclass
class _Tick:
    name: str
    every_seconds: float
    send: Callable[[], None]
    due_at: float = 0.0  # monotonic; 0 = at start
    # On the wall clock's multiples of `every_seconds` (plus `margin`), not `every_seconds` after
    # the last send: the schedule tick, so a 09:00 slot is seen at 09:00, not up to a period late.
    aligned: bool = False
    margin: float = 0.0

    def next_due(self, mono_now: float, wall_now: float) -> float:
        if not self.aligned:
            # Fixed cadence from now, not from the missed due time: no burst after a stall.
            return mono_now + self.every_seconds
        return mono_now + next_boundary(self.every_seconds, wall_now, self.margin) - wall_now


def next_boundary(every: float, wall_now: float, margin: float = 0.0) -> float:
    """The first wall-clock time after `wall_now` that is a whole multiple of `every` seconds
    plus `margin` (the epoch is a whole minute, so a period dividing a minute lands on each
    minute)."""
    boundary = (math.floor((wall_now - margin) / every) + 1) * every + margin
    return boundary if boundary > wall_now else boundary + every


def run_clock(settings: Settings, *, stop: threading.Event | None = None) -> None:
    """Tick until SIGTERM/SIGINT (or until `stop` is set, for an embedding caller)."""
    configure_logging(settings)
    configure_tracing(CLOCK_SERVICE)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():

        def handler(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
    configure_broker(settings)
    ticks = [
        _Tick(
            "schedule",
            settings.schedule_tick_seconds,
            send_schedule_tick,
            aligned=True,
            margin=SCHEDULE_TICK_MARGIN_SECONDS,
        ),
        _Tick("reap", settings.reap_tick_seconds, send_reap_tick),
        _Tick("retention", settings.retention_tick_seconds, send_retention_tick),
        _Tick("deliveries", settings.delivery_tick_seconds, send_delivery_tick),
        _Tick("tool_sources", settings.tool_source_sync_seconds, send_tool_sources_tick),
    ]
    log.info(
        "clock started: schedule tick every %gs, reap tick every %gs",
        settings.schedule_tick_seconds,
        settings.reap_tick_seconds,
    )
    try:
        while not stop.is_set():
            now, wall = time.monotonic(), time.time()
            for tick in ticks:
                if now >= tick.due_at:
                    tick.due_at = tick.next_due(now, wall)
                    _send(tick)
            stop.wait(max(0.0, min(t.due_at for t in ticks) - time.monotonic()))
    finally:
        close_broker()
        log.info("clock stopped")


def _send(tick: _Tick) -> None:
    try:
        tick.send()
    except Exception:
        # The broker is down: the next tick tries again; nothing is lost (state is in PostgreSQL).
        log.warning("could not send the %s tick", tick.name, exc_info=True)
