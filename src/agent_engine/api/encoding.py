"""JSON text of GraphQL results, for the HTTP view and the subscription groups alike."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """JSON text; orjson, or the standard library for what orjson refuses (integers beyond 64
    bits in a JSON scalar)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))
