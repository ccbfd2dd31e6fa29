"""The pure rules of MCP sources: names, access, what a listing syncs, argument checks."""

from __future__ import annotations

import pytest

from agent_engine.domain.mcp import ToolAccess, access_of, catalog_name, source_name_problem
from agent_engine.runtime.loop import decline_message
from agent_engine.runtime.tools.mcp import call_meta, check_arguments
from agent_engine.runtime.tools.spec import ToolError
from agent_engine.tool_sources.client import RemoteTool
from agent_engine.tool_sources.sync import plan


@pytest.mark.parametrize("name", ["tickets", "a", "jira_2", "x" * 32])
def test_good_source_names(name: str) -> None:
    assert source_name_problem(name) is None


@pytest.mark.parametrize("name", ["", "Tickets", "2fa", "_x", "a-b", "x" * 33, "a b"])
def test_bad_source_names(name: str) -> None:
    assert source_name_problem(name) is not None


def test_only_read_only_hint_true_is_read() -> None:
    assert access_of({"readOnlyHint": True}) is ToolAccess.READ
    for hints in (
        None,
        {},
        {"readOnlyHint": False},
        {"readOnlyHint": "true"},
        {"destructiveHint": False},
    ):
        assert access_of(hints) is ToolAccess.WRITE


def test_catalog_names_are_function_names() -> None:
    assert catalog_name("tickets", "create ticket.v2") == "tickets__create_ticket_v2"


def _tool(name: str, schema: object = None) -> RemoteTool:
    return RemoteTool(
        name, "d", schema if schema is not None else {"type": "object"}, ToolAccess.READ
    )


def test_plan_leaves_out_collisions_long_names_and_bad_schemas_naming_them() -> None:
    entries, problems = plan(
        "src",
        [
            _tool("ok"),
            _tool("a.b"),
            _tool("a b"),
            _tool("n" * 60),
            _tool("arr", {"type": "array"}),
            _tool("bad", {"type": "object", "properties": {"x": {"type": 1}}}),
        ],
    )
    assert [e.name for e in entries] == ["src__ok"]
    text = " | ".join(problems)
    assert "'a.b' and 'a b' both become 'src__a_b'" in text
    assert "longer than 64 characters" in text
    assert "'arr'" in text and "'bad'" in text


def test_arguments_are_checked_against_the_full_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["n"],
    }
    assert check_arguments(schema, {"n": 2, "tags": ["a"]}) == {"n": 2, "tags": ["a"]}
    with pytest.raises(ToolError, match="at n"):
        check_arguments(schema, {"n": 0})
    with pytest.raises(ToolError, match="at tags/0"):
        check_arguments(schema, {"n": 1, "tags": [3]})
    with pytest.raises(ToolError, match='"n" is a required property'):
        check_arguments(schema, {})
    with pytest.raises(ToolError, match="JSON object"):
        check_arguments(schema, [1])


def test_meta_ids_are_strings() -> None:
    assert call_meta(owner_id=1, agent_id=2, run_id=3) == {
        "agentEngine/userId": "1",
        "agentEngine/agentId": "2",
        "agentEngine/runId": "3",
    }


def test_the_model_hears_a_decline_with_the_note() -> None:
    assert decline_message("declined", "not now") == (
        "the owner declined this call; their note: not now"
    )
    assert decline_message("declined", None) == "the owner declined this call"
    assert "expired" in decline_message("expired", None)
