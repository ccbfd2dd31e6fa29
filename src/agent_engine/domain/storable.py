"""Text PostgreSQL can store: no NUL (`text` and `jsonb` refuse it, `\\u0000` too) and no lone
surrogate (UTF-8 cannot encode one; `jsonb` refuses its escape).

A run's output, its steps and its checkpoint are written from what a model and tool servers sent,
which is data, not ours to trust. One character the database refuses would make the run's finish
unwritable, and the run would end STALE ("the worker is gone"). So the writers pass what they
write through here, whatever the boundaries cleaned before: NUL is dropped, a lone surrogate
becomes U+FFFD (a pair split into two code points is joined into its character).
"""

from __future__ import annotations

import json
import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# The same in `json.dumps` output (ASCII escapes). A literal backslash before such text matches too:
# the value is then cleaned for nothing, which is harmless.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def storable_text(value: str) -> str:
    if _UNSTORABLE.search(value) is None:
        return value
    value = value.replace("\x00", "")
    return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def storable_optional(value: str | None) -> str | None:
    return None if value is None else storable_text(value)


def storable_json(value: Any) -> Any:
    """`value` (JSON-shaped: dicts, lists, strings, numbers) with every string storable, keys
    too (a copy)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


def storable_json_dumps(value: Any) -> str:
    """`json.dumps(value)` that `jsonb` accepts; cleaned (`storable_json`) only when it must be."""
    dumped = json.dumps(value)
    if _UNSTORABLE_ESCAPE.search(dumped) is None:
        return dumped
    return json.dumps(storable_json(value))
