"""Bounded text: every output the runtime keeps or hands on (the run's output, tool results,
errors, transcript steps) is cut to a limit and says so.
"""

from __future__ import annotations


def truncate(text: str, limit: int) -> str:
    """At most `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    marker = f"\n… [truncated {len(text) - limit} characters]"
    keep = max(limit - len(marker), 0)
    return (text[:keep] + marker)[:limit]
