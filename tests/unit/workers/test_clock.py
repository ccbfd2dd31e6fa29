"""The clock's schedule tick lands on the wall clock's whole multiples of its period, so a slot
on a whole minute (09:00:00) is seen as it comes, not up to a period late."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_engine.workers.clock import SCHEDULE_TICK_MARGIN_SECONDS, _Tick, next_boundary


@pytest.mark.parametrize(
    ("every", "now", "expected"),
    [
        (5.0, 100.0, 105.0),  # on a boundary: the next one
        (5.0, 101.3, 105.0),
        (5.0, 104.999, 105.0),
        (1.0, 7.25, 8.0),
        (60.0, 119.0, 120.0),
    ],
)
def test_the_next_boundary_is_the_next_whole_multiple_of_the_period(
    every: float, now: float, expected: float
) -> None:
    assert next_boundary(every, now) == pytest.approx(expected)


def test_a_margin_follows_the_boundary_and_is_never_in_the_past() -> None:
    assert next_boundary(1.0, 7.02, 0.05) == pytest.approx(7.05)
    assert next_boundary(1.0, 7.05, 0.05) == pytest.approx(8.05)
    assert next_boundary(1.0, 7.5, 0.05) == pytest.approx(8.05)


def test_a_nine_o_clock_slot_is_ticked_at_nine_not_a_period_later() -> None:
    nine = datetime(2026, 12, 7, 9, 0, tzinfo=UTC).timestamp()
    tick = _Tick("schedule", 5.0, lambda: None, aligned=True, margin=SCHEDULE_TICK_MARGIN_SECONDS)
    # The last tick went out 3.7 s before nine, at monotonic 1,000.
    due = tick.next_due(1000.0, nine - 3.7)
    assert due - 1000.0 == pytest.approx(3.7 + SCHEDULE_TICK_MARGIN_SECONDS)
    # An unaligned tick keeps its fixed cadence from the last send.
    plain = _Tick("reap", 5.0, lambda: None)
    assert plain.next_due(1000.0, nine - 3.7) == pytest.approx(1005.0)
