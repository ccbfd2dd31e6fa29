"""What an admin may write to the model list and the platform settings: pure rules, no database.

Each `…_problem` returns why a value is refused, or None when it is acceptable; the API names the
input field it came from (the convention of `domain.delivery.target_url_problem`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from agent_engine.domain.providers import Provider
from agent_engine.domain.retention import MAX_RETENTION_DAYS, MIN_RETENTION_DAYS

MAX_CONCURRENT_RUNS = 10_000
MAX_ITERATION_CAP = 100
MAX_WEEKLY_TOKEN_CAP = 2**62
# Query parameters that carry a credential (`?api_key=…`, `?token=…`, `?sig=…`).
_SECRET_QUERY_NAME = re.compile(r"key|token|secret|passw|signature|credential|^sig$", re.I)


def provider_problem(provider: str) -> str | None:
    if provider not in set(Provider):
        return f"must be one of {', '.join(Provider)}"
    return None


def base_url_problem(value: str) -> str | None:
    """An http(s) URL with no credentials in it: keys live in the environment (`apiKeyEnv`),
    never in the database or in what the API shows."""
    try:
        parts = urlsplit(value)
        has_userinfo = parts.username is not None or parts.password is not None
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "must be an http(s) URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL"
    if has_userinfo:
        return (
            "must not contain credentials (user:password@): put the key in the environment "
            "variable named by apiKeyEnv"
        )
    names = {name for name, _ in parse_qsl(parts.query, keep_blank_values=True)}
    secret_params = sorted(name for name in names if _SECRET_QUERY_NAME.search(name))
    if secret_params:
        return (
            f"must not carry credentials in its query ({', '.join(secret_params)}): put the key "
            "in the environment variable named by apiKeyEnv"
        )
    return None


def max_concurrent_runs_problem(limit: int | None) -> str | None:
    """None is no limit."""
    if limit is not None and not 1 <= limit <= MAX_CONCURRENT_RUNS:
        return f"must be between 1 and {MAX_CONCURRENT_RUNS:,}, or null for no limit"
    return None


def weekly_token_cap_problem(cap: int | None) -> str | None:
    """None is no cap."""
    if cap is not None and not 0 <= cap <= MAX_WEEKLY_TOKEN_CAP:
        return "must be zero or more, or null"
    return None


def iteration_cap_problem(cap: int | None) -> str | None:
    if cap is None or not 1 <= cap <= MAX_ITERATION_CAP:
        return f"must be between 1 and {MAX_ITERATION_CAP}"
    return None


def retention_days_problem(days: int | None) -> str | None:
    """None keeps every run."""
    if days is not None and not MIN_RETENTION_DAYS <= days <= MAX_RETENTION_DAYS:
        return (
            f"must be between {MIN_RETENTION_DAYS} and {MAX_RETENTION_DAYS} days, "
            "or null to keep every run"
        )
    return None
