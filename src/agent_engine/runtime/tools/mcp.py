"""MCP tools in a run: the check of a call's arguments against the tool's JSON Schema, and the
call's `_meta` (who is acting). What the run knows of each tool is `spec.McpTool`."""

from __future__ import annotations

from typing import Any

import jsonschema

from agent_engine.runtime.tools.spec import ToolError

META_USER = "agentEngine/userId"
META_AGENT = "agentEngine/agentId"
META_RUN = "agentEngine/runId"


def check_arguments(schema: dict[str, Any], arguments: object) -> dict[str, Any]:
    """The arguments if they fit the tool's JSON Schema; else a refusal naming where they don't
    (the model may correct the call)."""
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except jsonschema.SchemaError as exc:  # checked at sync; a defensive refusal
        raise ToolError(f"the tool's schema is invalid: {exc.message[:200]}") from exc
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise ToolError(
            f"arguments do not fit the schema{f' at {where}' if where else ''}: "
            f"{error.message[:300]}"
        )
    return arguments


def call_meta(*, owner_id: int, agent_id: int, run_id: int) -> dict[str, str]:
    """Who is acting, in the request's `_meta`; ids as strings, like the API's."""
    return {META_USER: str(owner_id), META_AGENT: str(agent_id), META_RUN: str(run_id)}
