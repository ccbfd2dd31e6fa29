"""How long to wait before calling a rate-limited provider again."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from agent_engine.runtime.providers.backoff import (
    BACKOFF_CAP_SECONDS,
    RETRY_AFTER_MAX_SECONDS,
    backoff_seconds,
    retry_after_seconds,
)

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "1"}, 1.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after": " 7 "}, 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the precise one wins
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "86400"}, RETRY_AFTER_MAX_SECONDS),
        ({"retry-after": "tomorrow"}, None),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_in_seconds(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(headers, now=NOW) == expected


def test_retry_after_as_an_http_date() -> None:
    when = format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds({"Retry-After": when}, now=NOW) == 30.0
    past = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    assert retry_after_seconds({"Retry-After": past}, now=NOW) == 0.0


def test_backoff_grows_with_jitter_and_stays_under_its_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(BACKOFF_CAP_SECONDS, 2.0 ** (attempt - 1))
        waits = [backoff_seconds(attempt, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len({round(w, 6) for w in waits}) > 100  # jittered: runs do not come back together
