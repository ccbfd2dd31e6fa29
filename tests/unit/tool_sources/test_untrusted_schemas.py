"""What a tool server sends is data (issue 38): the pure rules that refuse or clean a listing's
names, descriptions and schemas, and the argument check that never fetches and never backtracks."""

from __future__ import annotations

from typing import Any

import pytest

from agent_engine.domain.mcp import (
    MAX_SCHEMA_DEPTH,
    ToolAccess,
    access_change_note,
    cleaned_text,
    escaped,
    name_problem,
    schema_shape_problem,
)
from agent_engine.runtime.tools.mcp import MAX_ARGUMENT_BYTES, check_arguments
from agent_engine.runtime.tools.spec import ToolError
from agent_engine.tool_sources.client import RemoteTool
from agent_engine.tool_sources.sync import plan, schema_problem


def _nested(levels: int) -> dict[str, Any]:
    """An object schema whose JSON nests `levels` objects deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _with_property(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"q": schema}}


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:1/evil.json",
        "https://example.com/s.json#/x",
        "other.json",
        "//host/x",
        "urn:uuid:1",
    ],
)
@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef", "$recursiveRef"])
def test_a_reference_outside_the_schema_is_refused(keyword: str, ref: str) -> None:
    problem = schema_shape_problem(_with_property({keyword: ref}))
    assert problem is not None and keyword in problem and "not local" in problem


def test_local_references_are_kept() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#"}},
        "$defs": {"s": {"type": "string"}},
    }
    assert schema_shape_problem(schema) is None
    assert schema_problem(schema) is None
    # A property that happens to be called "$ref" is a name, not a reference.
    assert schema_problem({"type": "object", "properties": {"$ref": {"type": "string"}}}) is None


def test_a_schema_deeper_than_the_limit_is_refused() -> None:
    assert schema_shape_problem(_nested(MAX_SCHEMA_DEPTH)) is None
    problem = schema_shape_problem(_nested(MAX_SCHEMA_DEPTH + 2))
    assert problem == f"is nested deeper than {MAX_SCHEMA_DEPTH} levels"
    # Far deeper than Python's recursion limit: the walk does not recurse.
    deep: Any = "x"
    for _ in range(5_000):
        deep = [deep]
    assert schema_shape_problem({"type": "object", "default": deep}) is not None


@pytest.mark.parametrize(
    "schema",
    [
        _with_property({"type": "string", "description": "a\x00b"}),
        _with_property({"enum": ["ok", "n\x00"]}),
        {"type": "object", "properties": {"q\x00": {"type": "string"}}},
        _with_property({"type": "string", "description": "lone \ud800"}),
    ],
)
def test_text_postgresql_cannot_store_is_refused_in_a_schema(schema: dict[str, Any]) -> None:
    assert schema_shape_problem(schema) == "holds a NUL or a lone surrogate"


@pytest.mark.parametrize(
    ("pattern_schema", "why"),
    [
        (_with_property({"type": "string", "pattern": "^(a)\\1$"}), "backreference"),
        (_with_property({"type": "string", "pattern": "^(?=a)a$"}), "lookahead"),
        ({"type": "object", "patternProperties": {"(?<!x)y": {}}}, "lookbehind"),
        (_with_property({"type": "string", "pattern": "a{1000}{1000}"}), "too large"),
    ],
)
def test_patterns_the_linear_engine_cannot_run_are_refused_at_sync(
    pattern_schema: dict[str, Any], why: str
) -> None:
    problem = schema_problem(pattern_schema)
    assert problem is not None and problem.startswith("is not a JSON Schema the engine checks"), why


def test_an_unknown_metaschema_is_refused_without_fetching_it() -> None:
    problem = schema_problem({"$schema": "http://127.0.0.1:1/meta", "type": "object"})
    assert problem is not None and "meta-schema" in problem


def test_a_catastrophic_pattern_is_checked_in_linear_time() -> None:
    schema = _with_property({"type": "string", "pattern": "^(a+)+$"})
    # With a backtracking engine this takes minutes; it returns at once here.
    with pytest.raises(ToolError, match="does not match"):
        check_arguments(schema, {"q": "a" * 34 + "!"})
    assert check_arguments(schema, {"q": "a" * 10_000}) == {"q": "a" * 10_000}


def test_a_remote_reference_is_never_retrieved_at_call_time() -> None:
    # A row written past the sync (or before this rule): the check refuses, it does not fetch
    # (port 1 on loopback: a fetch would fail differently, with a connection error).
    schema = _with_property({"$ref": "http://127.0.0.1:1/evil.json"})
    with pytest.raises(ToolError, match="the tool's schema is refused") as caught:
        check_arguments(schema, {"q": "x"})
    assert "Retrieval is disabled" in str(caught.value)


def test_arguments_larger_than_the_limit_are_refused_before_the_check() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "uniqueItems": True}}}
    items = [{"n": n} for n in range(MAX_ARGUMENT_BYTES // 8)]
    with pytest.raises(ToolError, match=f"larger than {MAX_ARGUMENT_BYTES} bytes"):
        check_arguments(schema, {"items": items})
    # Under the limit, uniqueItems over thousands of objects is quick (no pairwise Python loop).
    few = [{"n": n} for n in range(4_000)]
    assert check_arguments(schema, {"items": few}) == {"items": few}


def test_a_refusal_the_model_hears_carries_no_raw_control_characters() -> None:
    # The path to the bad value is the model's own key, NUL included: stored as a step error.
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    with pytest.raises(ToolError) as caught:
        check_arguments(schema, {"a\x00b": "x"})
    assert "\x00" not in str(caught.value) and "at a\\x00b" in str(caught.value)


@pytest.mark.parametrize("name", ["nul\x00name", "bell\x07", "del\x7f", "lone\udc00", ""])
def test_tool_names_with_control_characters_are_refused(name: str) -> None:
    assert name_problem(name) is not None


def test_descriptions_are_cleaned_and_errors_escaped() -> None:
    assert cleaned_text("looks\x00harm\x1bless\n\tok\ud800") == "looksharmless\n\tok"
    assert cleaned_text("plain") == "plain"
    assert escaped("a\x00b\ud800c\nd") == "a\\x00b\\ud800c\\x0ad".replace("\\x0a", "\n")


def test_a_listing_with_odd_text_syncs_the_rest_and_names_what_it_left_out() -> None:
    def tool(name: str, schema: object, description: str = "d") -> RemoteTool:
        return RemoteTool(name, description, schema, ToolAccess.READ)

    plain = {"type": "object", "properties": {"title": {"type": "string"}}}
    entries, problems = plan(
        "src",
        [
            tool("ok", plain),
            tool("nul\x00name", plain),
            tool("nul_description", plain, "looks\x00harmless"),
            tool("nul_schema", _with_property({"type": "string", "description": "a\x00b"})),
            tool("remote", _with_property({"$ref": "http://127.0.0.1:1/evil.json"})),
        ],
    )
    assert {e.name: e.description for e in entries} == {
        "src__ok": "d",
        "src__nul_description": "looksharmless",
    }
    text = " | ".join(problems)
    assert "tool 'nul\\x00name' left out: its name holds a control character" in text
    assert "tool 'nul_schema' left out: its inputSchema holds a NUL" in text
    assert "tool 'remote' left out: its inputSchema has a $ref that is not local" in text


def test_only_a_relabel_to_read_asks_an_admin() -> None:
    note = access_change_note("s__t", ToolAccess.WRITE, ToolAccess.READ)
    assert note == (
        "tool 's__t' now says it is read-only: disallowed for agents until an admin allows it again"
    )
    assert access_change_note("s__t", ToolAccess.READ, ToolAccess.WRITE) is None
    assert access_change_note("s__t", ToolAccess.READ, ToolAccess.READ) is None
