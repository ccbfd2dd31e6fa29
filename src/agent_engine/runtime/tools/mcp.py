"""MCP tools in a run: the check of a call's arguments against the tool's JSON Schema, and the
call's `_meta` (who is acting). What the run knows of each tool is `spec.McpTool`.

A tool's schema comes from its server and the arguments from the model: both are untrusted data.
The check is `jsonschema_rs` (Rust), built offline -- a `$ref` is never retrieved, whatever the
schema says -- and with Rust's `regex` engine for `pattern` and `patternProperties`, which runs in
time linear in the text (no backtracking; a pattern that would need it, a backreference or a
lookaround, does not compile, and the sync refuses its tool). So a check runs on the event loop
in bounded time, and the same validator is what the sync compiles to accept a schema.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs

from agent_engine.domain.mcp import escaped
from agent_engine.runtime.tools.spec import ToolError

META_USER = "agentEngine/userId"
META_AGENT = "agentEngine/agentId"
META_RUN = "agentEngine/runId"

# Arguments whose JSON is larger than this are refused before the check: a check's cost grows
# with what it reads (uniqueItems, patterns over long strings), and the model's output is not
# trusted either.
MAX_ARGUMENT_BYTES = 64_000
# The compiled regex program and its lazy DFA, bounded (the `regex` crate's defaults are 10 MB):
# `a{1000}{1000}` is refused when the schema is compiled.
REGEX_LIMIT_BYTES = 1_000_000
PATTERNS = jsonschema_rs.RegexOptions(
    size_limit=REGEX_LIMIT_BYTES, dfa_size_limit=REGEX_LIMIT_BYTES
)


class SchemaRefused(Exception):
    """The schema cannot be compiled as given (not JSON Schema, a reference outside itself, a
    pattern the non-backtracking engine refuses); the message says why."""


def validator(schema: Any) -> jsonschema_rs.Validator:
    """The schema compiled: offline (no retrieval of any URI), linear-time patterns, formats
    as annotations (as the JSON Schema drafts since 2019-09 say)."""
    try:
        return jsonschema_rs.validator_for(
            schema, offline=True, pattern_options=PATTERNS, validate_formats=False
        )
    except (ValueError, TypeError, jsonschema_rs.ReferencingError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        raise SchemaRefused(escaped(message.splitlines()[0][:200])) from exc


def check_arguments(schema: dict[str, Any], arguments: object) -> dict[str, Any]:
    """The arguments if they fit the tool's JSON Schema; else a refusal naming where they don't
    (the model may correct the call)."""
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    try:
        size = len(json.dumps(arguments).encode())
    except RecursionError as exc:
        raise ToolError("the arguments are nested too deeply") from exc
    if size > MAX_ARGUMENT_BYTES:
        raise ToolError(f"the arguments are larger than {MAX_ARGUMENT_BYTES} bytes")
    try:
        error = next(validator(schema).iter_errors(arguments), None)
    except SchemaRefused as exc:  # refused at sync; a row written otherwise gets here
        raise ToolError(f"the tool's schema is refused: {exc}") from exc
    if error is not None:
        where = "/".join(str(p) for p in error.instance_path)
        raise ToolError(
            f"arguments do not fit the schema{f' at {escaped(where)}' if where else ''}: "
            f"{escaped(error.message[:300])}"
        )
    return arguments


def call_meta(*, owner_id: int, agent_id: int, run_id: int) -> dict[str, str]:
    """Who is acting, in the request's `_meta`; ids as strings, like the API's."""
    return {META_USER: str(owner_id), META_AGENT: str(agent_id), META_RUN: str(run_id)}
