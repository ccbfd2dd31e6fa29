"""MCP tool sources and write-tool approvals: the pure rules (names, access, statuses).

No network, database or clock: the client (`agent_engine.mcp`) and the API apply them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from agent_engine.domain.delivery import target_url_problem
from agent_engine.domain.storable import storable_text

SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The models' function-name limit: a longer catalog name is left out of a sync.
CATALOG_NAME_MAX_CHARS = 64
# Function names the Chat Completions API accepts.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEPARATOR = "__"


class ToolAccess(StrEnum):
    READ = "read"
    WRITE = "write"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DECLINED = "declined"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


def source_name_problem(name: str) -> str | None:
    if not SOURCE_NAME.match(name):
        return (
            "must be lowercase letters, digits and _, starting with a letter, at most 32 "
            "characters (^[a-z][a-z0-9_]{0,31}$)"
        )
    return None


def source_url_problem(url: str) -> str | None:
    """https://, or http:// to a loopback address; no credentials (the delivery targets' rule)."""
    return target_url_problem(url)


def slug(tool_name: str) -> str:
    """The server's tool name as a function-name part: anything but [A-Za-z0-9_-] becomes _."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", tool_name)


def catalog_name(source: str, tool_name: str) -> str:
    return f"{source}{SEPARATOR}{slug(tool_name)}"


def access_of(annotations: dict[str, Any] | None) -> ToolAccess:
    """READ only when the server says readOnlyHint: true; anything else may change the world."""
    if annotations and annotations.get("readOnlyHint") is True:
        return ToolAccess.READ
    return ToolAccess.WRITE


# --- what a server sends is data ----------------------------------------------------------------

# JSON nesting (objects and arrays) a tool's inputSchema may have: validators recurse, and a
# real tool's arguments rarely go past five levels of objects (two JSON levels each).
MAX_SCHEMA_DEPTH = 32
# Keywords that point at another schema. Only local ones ("#...", inside the same document) are
# kept: anything else would be a retrieval, which never happens.
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _odd(char: str) -> bool:
    """A character PostgreSQL cannot store (NUL in text and jsonb; a lone surrogate in UTF-8) or
    a control other than newline and tab."""
    code = ord(char)
    return (code < 0x20 and char not in "\n\t") or code == 0x7F or 0xD800 <= code <= 0xDFFF


def name_problem(name: str) -> str | None:
    """Why a server's tool name is refused: it is sent back verbatim at every call, so it is
    never cleaned -- a name with a control character or a lone surrogate is left out."""
    if not name:
        return "its name is empty"
    if any(_odd(c) for c in name):
        return "its name holds a control character"
    return None


# Controls but tab, newline and carriage return (NUL among them), and DEL: what `cleaned_text`
# drops with one `str.translate` (C speed: a tool result may be 4 MB).
_CONTROLS = dict.fromkeys([*(c for c in range(0x20) if chr(c) not in "\t\n\r"), 0x7F])
_SURROGATE = re.compile("[\ud800-\udfff]")


def cleaned_text(value: str) -> str:
    """Text a tool server sent, as stored and shown to the model (a description, a call's result):
    controls other than tab, newline and carriage return (NUL among them) and lone surrogates
    (JSON may carry them, UTF-8 may not) removed."""
    value = value.translate(_CONTROLS)
    if value.isascii():
        return value
    return _SURROGATE.sub("", value)


def escaped(value: str) -> str:
    """Text fit to store and show (an admin's lastError): odd characters as \\xNN or \\uNNNN."""
    if not any(_odd(c) for c in value):
        return value
    return "".join(
        (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") if _odd(c) else c
        for c in value
    )


def schema_shape_problem(schema: object) -> str | None:
    """Why an inputSchema is refused before any validator sees it: deeper than MAX_SCHEMA_DEPTH,
    a `$ref` (or `$dynamicRef`, `$recursiveRef`) that is not local, or text PostgreSQL cannot
    store (NUL, lone surrogates) in a key or a value. Walked with a stack, never recursion: the
    depth is what is being checked."""
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > MAX_SCHEMA_DEPTH:
                return f"is nested deeper than {MAX_SCHEMA_DEPTH} levels"
            for key, item in value.items():
                if _unstorable(key):
                    return "holds a NUL or a lone surrogate"
                if key in REF_KEYWORDS and isinstance(item, str) and not item.startswith("#"):
                    return f"has a {key} that is not local ({item[:100]!r})"
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > MAX_SCHEMA_DEPTH:
                return f"is nested deeper than {MAX_SCHEMA_DEPTH} levels"
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and _unstorable(value):
            return "holds a NUL or a lone surrogate"
    return None


def _unstorable(value: str) -> bool:
    # The run writers' rule of what PostgreSQL refuses; a schema is refused, not cleaned: a
    # cleaned enum or pattern would no longer say what the server meant.
    return storable_text(value) is not value


def access_change_note(tool: str, old: ToolAccess, new: ToolAccess) -> str | None:
    """What the admin reads in lastError when a tool's label changed at a sync. Only the change
    to the safer label asks for nothing: WRITE -> READ is not believed by itself (the tool is
    disallowed until an admin allows it again); READ -> WRITE applies at once."""
    if old is ToolAccess.WRITE and new is ToolAccess.READ:
        return (
            f"tool {tool!r} now says it is read-only: disallowed for agents until an admin "
            "allows it again"
        )
    return None
