"""The in-flight set: bounded, refuses reservations once stopping, interrupts after the grace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent_engine.workers.inflight import InFlight, WorkerStopping


async def test_a_full_set_makes_reservations_wait_until_a_run_ends() -> None:
    flight = InFlight(2)
    release = asyncio.Event()
    for index in range(2):
        await flight.reserve()
        flight.start(release.wait(), name=f"run-{index}")
    third = asyncio.create_task(flight.reserve())
    await _until(lambda: flight.waiting == 1)
    assert not third.done()
    assert (flight.running, flight.waiting) == (2, 1)

    release.set()
    await asyncio.wait_for(third, timeout=1)
    assert flight.peak == 2


async def test_a_cancelled_reservation_frees_its_place() -> None:
    flight = InFlight(1)
    await flight.reserve()
    flight.cancel_reservation()  # the claim found nothing to run
    await asyncio.wait_for(flight.reserve(), timeout=1)


async def test_stopping_refuses_waiting_and_new_reservations() -> None:
    flight = InFlight(1)
    await flight.reserve()
    flight.start(asyncio.sleep(10), name="long")
    waiting = asyncio.create_task(flight.reserve())
    await _until(lambda: flight.waiting == 1)

    flight.stop_admitting()

    with pytest.raises(WorkerStopping):
        await asyncio.wait_for(waiting, timeout=1)
    with pytest.raises(WorkerStopping):
        await flight.reserve()
    await flight.drain(0.01)


async def test_drain_lets_runs_finish_within_the_grace_then_interrupts_the_rest() -> None:
    flight = InFlight(5)
    interrupted: list[str] = []

    async def run(name: str, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            interrupted.append(name)  # where a run journals its interruption
            raise

    for name, seconds in (("quick", 0.05), ("slow", 30)):
        await flight.reserve()
        flight.start(run(name, seconds), name=name)

    await flight.drain(grace_seconds=0.5)

    assert interrupted == ["slow"]
    assert flight.running == 0


async def _until(condition: Callable[[], bool]) -> None:
    """Let the loop run until `condition` holds (each pass yields to every ready task)."""
    async with asyncio.timeout(1):
        while not condition():
            await asyncio.sleep(0)
