"""Delivery rules (docs/architecture.md §10.6): which target URLs are acceptable, how attempts
are spaced.

Pure: no database, HTTP or clock. The sending side (agent_engine.delivery) applies them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import timedelta
from enum import StrEnum
from urllib.parse import urlsplit

from agent_engine.domain.credentials import ENV_NAME


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# After the first attempt fails, the next ones wait this long (about 1 s, 5 s, 30 s, 2 min,
# 10 min, 1 h, 6 h); after the last the delivery is failed. Settings may override it.
RETRY_SCHEDULE: tuple[timedelta, ...] = (
    timedelta(seconds=1),
    timedelta(seconds=5),
    timedelta(seconds=30),
    timedelta(minutes=2),
    timedelta(minutes=10),
    timedelta(hours=1),
    timedelta(hours=6),
)
# One attempt waits at most this long for the receiver's answer.
ATTEMPT_TIMEOUT = timedelta(seconds=10)
# At most this many attempts in flight per target, across all workers.
CONCURRENCY_PER_TARGET = 4

URL_MAX_CHARS = 2_000
SECRET_PREFIX = "whsec_"


def retry_delay(attempts: int, schedule: Sequence[timedelta] = RETRY_SCHEDULE) -> timedelta | None:
    """How long after failed attempt number `attempts` (1, 2, …) the next one goes; None when
    that was the last attempt (the delivery is failed)."""
    if attempts < 1:
        raise ValueError("attempts counts from 1")
    return schedule[attempts - 1] if attempts - 1 < len(schedule) else None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def target_url_problem(url: str) -> str | None:
    """Why `url` cannot be a delivery target, or None: https://, or http:// to a loopback address
    only (tests and local receivers); no credentials in the URL."""
    if len(url) > URL_MAX_CHARS:
        return f"at most {URL_MAX_CHARS} characters"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL (or http:// to a loopback address)"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@); the signature authenticates us"
    if parts.scheme == "http" and not _is_loopback(host):
        return "plain http:// is allowed only to a loopback address (127.0.0.1, ::1, localhost)"
    if port == 0:
        return "not a valid port"
    return None


def env_name_problem(name: str) -> str | None:
    if not ENV_NAME.match(name):
        return (
            "must be an environment variable name (letters, digits, _; not starting with a digit)"
        )
    return None


def secret_env_problem(name: str) -> str | None:
    """`secret_env` names the variable; a pasted secret is refused before it is stored."""
    if name.startswith(SECRET_PREFIX):
        return (
            "looks like the secret itself: give the name of the environment variable that holds"
            " it (the secret stays on the workers)"
        )
    return env_name_problem(name)
