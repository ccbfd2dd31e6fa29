"""The tool registry: the three core Knowledge Store tools and the optional tools.

Optional tools are the built-ins (`current_time`, `calculator`, `previous_output`) plus whatever
is registered under the `agent_engine.tools` entry-point group; each entry point loads a
`ToolSpec`. `sync_tool_catalog` mirrors the optional tools into the `tools` catalog, where an admin
allows them for agents (new tools start disallowed).
"""

from __future__ import annotations

import logging
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.catalog import upsert_tool_descriptions
from agent_engine.runtime.tools.builtins import BUILTIN_TOOLS
from agent_engine.runtime.tools.core import CORE_TOOLS
from agent_engine.runtime.tools.spec import ToolCallContext as ToolCallContext
from agent_engine.runtime.tools.spec import ToolError as ToolError
from agent_engine.runtime.tools.spec import ToolSpec as ToolSpec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agent_engine.tools"
CORE_TOOL_NAMES = ("search_knowledge", "read_document", "related_documents")


def core_tools() -> dict[str, ToolSpec]:
    return {spec.name: spec for spec in CORE_TOOLS}


@cache
def optional_tools() -> dict[str, ToolSpec]:
    """Built-ins plus entry points, by name. Loaded once per process.

    A plugin that fails to load, or loads something other than a ToolSpec, is logged and left
    out: one broken plugin must not stop every agent. Plugins cannot shadow core or built-in
    tools.
    """
    tools = {spec.name: spec for spec in BUILTIN_TOOLS}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = entry_point.load()
        except Exception:
            log.exception("tool entry point %r failed to load", entry_point.value)
            continue
        if not isinstance(spec, ToolSpec):
            log.warning("tool entry point %r is not a ToolSpec; ignored", entry_point.value)
            continue
        if spec.name in tools or spec.name in CORE_TOOL_NAMES:
            log.warning(
                "tool entry point %r reuses the name %r; ignored", entry_point.value, spec.name
            )
            continue
        tools[spec.name] = spec
    return tools


async def sync_tool_catalog(conn: AsyncConnection) -> None:
    """Upsert the optional tools into `tools`: new rows start with agents_allowed = false,
    descriptions are refreshed, agents_allowed is never changed, and rows of tools the code no
    longer has are left for the admin (deleting them would drop agents' selections)."""
    specs = sorted(optional_tools().values(), key=lambda spec: spec.name)
    await upsert_tool_descriptions(conn, [(spec.name, spec.description) for spec in specs])


_JSON_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
}


def validate_arguments(schema: dict[str, Any], arguments: object) -> dict[str, Any]:
    """Check a call's arguments against the tool's (flat) JSON schema before the handler runs.

    Models often send numbers as strings ("12"); integers and numbers are coerced when exact.
    Errors name the argument so the model can correct the call.
    """
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if arguments.get(name) is None:
            raise ToolError(f"missing required argument '{name}'")
    checked: dict[str, Any] = {}
    for name, value in arguments.items():
        prop = properties.get(name)
        if prop is None:
            if schema.get("additionalProperties") is False:
                raise ToolError(f"unknown argument '{name}'")
            checked[name] = value
        elif value is None and name not in schema.get("required", ()):
            continue
        else:
            checked[name] = _coerce(name, prop, value)
    return checked


def _coerce(name: str, prop: dict[str, Any], value: object) -> Any:
    kind = prop.get("type")
    coerced: object = value
    if kind == "integer":
        coerced = _as_integer(value)
    elif kind == "number":
        coerced = _as_number(value)
    elif kind == "string":
        coerced = value if isinstance(value, str) else None
    elif kind == "boolean":
        coerced = value if isinstance(value, bool) else None
    elif kind == "object":
        coerced = value if isinstance(value, dict) else None
    elif kind == "array":
        coerced = value if isinstance(value, list) else None
    if coerced is None:
        expected = _JSON_TYPE_NAMES.get(str(kind), str(kind))
        raise ToolError(f"argument '{name}' must be {expected}, got {value!r:.80}")
    if "enum" in prop and coerced not in prop["enum"]:
        raise ToolError(f"argument '{name}' must be one of {prop['enum']}")
    return coerced


def _as_integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 20:
        return int(value.strip())
    return None


def _as_number(value: object) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
