"""MCP tool sources and write-tool approvals: the pure rules (names, access, statuses).

No network, database or clock: the client (`agent_engine.mcp`) and the API apply them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from agent_engine.domain.delivery import target_url_problem

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
