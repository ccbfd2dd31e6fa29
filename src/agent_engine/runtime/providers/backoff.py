"""How long to wait before calling a provider again: its `Retry-After`, or backoff with jitter.

Pure functions (time and randomness passed in), used by the openai provider's retry loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# Exponential backoff with "equal jitter" (AWS architecture blog, "Exponential Backoff And
# Jitter"): the n-th wait is uniform in [c/2, c], c = min(cap, base * 2**(n-1)) — it grows every
# time, and many runs rate-limited at the same moment do not come back at the same moment.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
# A Retry-After beyond this is not believed as such (a misconfigured proxy saying "come back
# tomorrow"); the run's wall-clock limit bounds the waiting anyway.
RETRY_AFTER_MAX_SECONDS = 3600.0


def retry_after_seconds(headers: Mapping[str, str], *, now: datetime) -> float | None:
    """The server's requested wait, from `retry-after-ms` (OpenAI, Azure) or `Retry-After` (RFC
    9110: delay-seconds or an HTTP-date); None when absent or unreadable."""
    lowered = {key.lower(): value for key, value in headers.items()}
    milliseconds = lowered.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return _bounded(float(milliseconds) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return _bounded(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded((when - now).total_seconds())


def backoff_seconds(attempt: int, *, rng: random.Random | None = None) -> float:
    """The wait before retry number `attempt` (1 = the first retry), with jitter."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(ceiling / 2, ceiling)


def _bounded(seconds: float) -> float | None:
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_SECONDS)
