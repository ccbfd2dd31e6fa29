"""A tool server is untrusted input (issue 38), against the hostile MCP server, the real API and
the real worker: remote `$ref`s never fetched, patterns that cannot stall a worker, deep and huge
schemas refused, a WRITE tool relabelled READ disallowed until an admin allows it again, NULs and
catalog-name collisions named in `lastError` -- never an INTERNAL sync."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dramatiq
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.testing.hostile_mcp import (
    PLAIN_SCHEMA,
    HostileServer,
    read_tool,
    write_tool,
)
from agent_engine.tool_sources.sync import sync_enabled_sources
from tests.integration.runs.support import FakeAgent, eventually
from tests.integration.runs.transcript.support import CANCEL, Gql
from tests.integration.tool_sources.conftest import ATTACH, Admin

SOURCE = "hostile"
CREATE = f"{SOURCE}__create_ticket"
AUDIT = """
query($actor: ID) {
  adminAuditLog(first: 100, actorId: $actor) { edges { node { action details actor { id } } } }
}
"""
PENDING = "query($id: ID!) { run(id: $id) { state pendingApproval { status tool { access } } } }"


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


@dataclass
class Scene:
    """The admin, the API, the hostile server registered as `hostile`, the fake model and the
    worker (running: the fixture asks for it)."""

    admin: Admin
    gql: Gql
    server: HostileServer
    fake_openai: FakeOpenAIServer
    fake_agent: FakeAgent
    engine: AsyncEngine

    async def register(self, name: str = SOURCE) -> dict[str, Any]:
        return await self.admin.upsert(name=name, url=self.server.url)

    async def sync(self, source: dict[str, Any]) -> dict[str, Any]:
        return await self.admin.sync(source["id"])

    async def agent_with(self, source: dict[str, Any], *names: str) -> dict[str, Any]:
        """A new agent on the fake model with the named tools allowed and attached."""
        agent = await self.fake_agent()
        ids = {tool["name"]: tool["id"] for tool in source["tools"]}
        for name in names:
            await self.admin.allow(ids[name])
            await self.gql.data(
                ATTACH, {"agent": str(agent["id"]), "tool": ids[name]}, as_user=agent["user_id"]
            )
        return agent

    async def finished(self, agent: dict[str, Any], *replies: Any) -> dict[str, Any]:
        self.fake_openai.enqueue(*replies)
        owner = int(agent["user_id"])
        return await self.gql.finished_run(
            await self.gql.start(agent["id"], as_user=owner), as_user=owner
        )

    async def audit(self) -> list[dict[str, Any]]:
        data = await self.gql.data(AUDIT, {}, as_user=self.admin.id, admin=True)
        return [edge["node"] for edge in data["adminAuditLog"]["edges"]]

    def heard(self, request: int = 1) -> list[str]:
        """What the model heard as tool results in its `request`-th call (from 0)."""
        messages = self.fake_openai.requests[request]["messages"]
        return [m["content"] for m in messages if m["role"] == "tool"]


@pytest.fixture
def scene(
    admin: Admin,
    gql: Gql,
    hostile: HostileServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    engine: AsyncEngine,
    worker: dramatiq.Worker,
) -> Scene:
    return Scene(admin, gql, hostile, fake_openai, fake_agent, engine)


def names(source: dict[str, Any]) -> set[str]:
    return {tool["name"] for tool in source["tools"]}


# --- schemas are data ---------------------------------------------------------------------------


async def test_a_remote_ref_is_refused_at_sync_naming_the_tool_and_never_fetched(
    scene: Scene,
) -> None:
    scene.server.apply("remote_ref")

    source = await scene.register()

    assert names(source) == {CREATE}
    assert source["lastError"].startswith(
        "tool 'lookup' left out: its inputSchema has a $ref that is not local ('http://127.0.0.1:"
    )
    assert scene.server.fetches == []


async def test_a_remote_ref_written_past_the_sync_is_never_fetched_at_call_time(
    scene: Scene,
) -> None:
    scene.server.state.tools = [write_tool(), read_tool("lookup", PLAIN_SCHEMA)]
    source = await scene.register()
    agent = await scene.agent_with(source, f"{SOURCE}__lookup")
    # A row from before the rule, or written straight in SQL.
    evil = {"type": "object", "properties": {"q": {"$ref": f"{scene.server.base_url}/evil.json"}}}
    async with scene.engine.begin() as conn:
        await conn.execute(
            text("UPDATE tools SET input_schema = CAST(:s AS jsonb) WHERE name = :n"),
            {"s": json.dumps(evil), "n": f"{SOURCE}__lookup"},
        )

    run = await scene.finished(
        agent,
        tool_reply(FakeToolCall(f"{SOURCE}__lookup", {"q": "x"})),
        text_reply("could not look it up"),
    )

    assert run["state"] == "SUCCEEDED"
    step = run["steps"][1]
    assert step["error"].startswith("the tool's schema is refused")
    assert "fetched from the hostile server" not in step["error"]
    assert scene.heard()[0].startswith("error: the tool's schema is refused")
    assert scene.server.fetches == [] and scene.server.calls == []


async def test_a_catastrophic_pattern_does_not_stall_the_worker(scene: Scene) -> None:
    scene.server.apply("redos")
    source = await scene.register()
    assert source["lastError"] is None  # ^(a+)+$ compiles in the linear engine
    agent = await scene.agent_with(source, f"{SOURCE}__match")

    # With a backtracking engine this check alone took minutes, on the worker's event loop.
    run = await scene.finished(
        agent,
        tool_reply(FakeToolCall(f"{SOURCE}__match", {"q": "a" * 34 + "!"})),
        text_reply("the argument was refused"),
    )

    assert run["state"] == "SUCCEEDED"
    assert "does not match" in run["steps"][1]["error"]
    assert scene.server.calls == []
    # The worker takes the next run at once: another owner's run is not held up.
    other = await scene.fake_agent()
    assert (await scene.finished(other, text_reply("fine")))["state"] == "SUCCEEDED"


async def test_deep_and_huge_schemas_are_refused_at_sync_naming_the_tool(scene: Scene) -> None:
    scene.server.apply("deep_schema")
    big = {f"p{n:04d}": {"type": "string", "description": "y" * 200} for n in range(400)}
    scene.server.state.tools.append(read_tool("huge", {"type": "object", "properties": big}))

    source = await scene.register()

    assert names(source) == {CREATE}
    error = source["lastError"]
    assert "tool 'deep' left out: its inputSchema is nested deeper than 32 levels" in error
    assert "tool 'huge' left out: its inputSchema is larger than 64000 bytes" in error


async def test_arguments_nested_past_the_parser_go_back_to_the_model(scene: Scene) -> None:
    # The model is untrusted output too: 3,000 nested arrays fit the transcript's input limit
    # and are past Python's recursion limit.
    scene.server.state.tools = [write_tool(), read_tool("lookup", PLAIN_SCHEMA)]
    source = await scene.register()
    agent = await scene.agent_with(source, f"{SOURCE}__lookup")
    nested = '{"q": ' + "[" * 3_000 + "]" * 3_000 + "}"

    run = await scene.finished(
        agent,
        tool_reply(FakeToolCall(f"{SOURCE}__lookup", nested)),
        text_reply("gave up"),
    )

    assert run["state"] == "SUCCEEDED"
    step = run["steps"][1]
    assert step["error"] == "the arguments are nested too deeply"
    assert step["input"] == nested
    assert scene.heard()[0] == "error: the arguments are nested too deeply"
    assert scene.server.calls == []


# --- labels that only get safer by themselves ---------------------------------------------------


async def test_a_write_tool_relabelled_read_is_disallowed_until_an_admin_allows_it_again(
    scene: Scene,
) -> None:
    scene.server.apply("relabel")
    source = await scene.register()
    agent = await scene.agent_with(source, CREATE)
    [tool] = source["tools"]
    scene.server.relabel_read()

    synced = await scene.sync(source)

    [relabelled] = synced["tools"]
    assert (relabelled["access"], relabelled["agentsAllowed"]) == ("READ", False)
    assert synced["lastError"] == (
        f"tool '{CREATE}' now says it is read-only: disallowed for agents until an admin "
        "allows it again"
    )
    [entry] = [e for e in await scene.audit() if e["action"] == "tool.access_changed"]
    assert entry["details"] == {
        "sourceId": source["id"],
        "toolId": tool["id"],
        "name": CREATE,
        "fields": [],
        "from": "write",
        "to": "read",
        "agentsAllowed": False,
    }
    assert entry["actor"] == {"id": str(scene.admin.id)}

    # The agent that had it is no longer offered it: a call is refused, the server hears nothing.
    run = await scene.finished(
        agent, tool_reply(FakeToolCall(CREATE, {"title": "x"})), text_reply("no tool")
    )
    assert run["state"] == "SUCCEEDED"
    assert run["steps"][1]["error"].startswith(f"unknown tool '{CREATE}'")
    assert scene.server.calls == []
    # A later sync keeps the admin's choice; once allowed again, the (now READ) tool runs.
    assert (await scene.sync(source))["lastError"] is None
    await scene.admin.allow(tool["id"])
    run = await scene.finished(
        agent, tool_reply(FakeToolCall(CREATE, {"title": "x"})), text_reply("made")
    )
    assert run["state"] == "SUCCEEDED" and len(scene.server.calls) == 1


async def test_a_read_tool_relabelled_write_asks_for_approval_from_the_next_call(
    scene: Scene,
) -> None:
    scene.server.state.tools = [write_tool(read_only=True)]
    source = await scene.register()
    agent = await scene.agent_with(source, CREATE)
    owner = int(agent["user_id"])
    run = await scene.finished(
        agent, tool_reply(FakeToolCall(CREATE, {"title": "x"})), text_reply("made")
    )
    assert run["state"] == "SUCCEEDED" and len(scene.server.calls) == 1
    scene.server.state.tools = [write_tool()]

    synced = await scene.sync(source)

    [tool] = synced["tools"]
    assert (tool["access"], tool["agentsAllowed"]) == ("WRITE", True)
    assert synced["lastError"] is None
    [entry] = [e for e in await scene.audit() if e["action"] == "tool.access_changed"]
    assert (entry["details"]["from"], entry["details"]["to"]) == ("read", "write")
    scene.fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "y"})), text_reply("ok"))
    run_id = await scene.gql.start(agent["id"], as_user=owner)

    async def parked() -> dict[str, Any] | None:
        view = (await scene.gql.data(PENDING, {"id": run_id}, as_user=owner))["run"]
        return view if view["pendingApproval"] else None

    view = await eventually(parked, what="the run to park for approval")
    assert view["pendingApproval"] == {"status": "PENDING", "tool": {"access": "WRITE"}}
    assert len(scene.server.calls) == 1  # the second call waits for the owner
    await scene.gql.data(CANCEL, {"id": run_id}, as_user=owner)


async def test_description_and_schema_changes_are_audited(scene: Scene) -> None:
    scene.server.state.tools = [write_tool()]
    source = await scene.register()
    [tool] = source["tools"]
    changed = write_tool(schema={"type": "object", "properties": {"t": {"type": "string"}}})
    scene.server.state.tools = [{**changed, "description": "Open a ticket, quietly."}]

    await scene.sync(source)

    [entry] = [e for e in await scene.audit() if e["action"] == "tool.changed"]
    assert entry["details"] == {
        "sourceId": source["id"],
        "toolId": tool["id"],
        "name": CREATE,
        "fields": ["description", "inputSchema"],
    }
    # Nothing changed: nothing more is audited.
    await scene.sync(source)
    assert len([e for e in await scene.audit() if e["action"].startswith("tool.")]) == 1


# --- NULs, odd text and collisions are named, never INTERNAL ------------------------------------


async def test_nul_text_is_refused_or_cleaned_and_the_rest_syncs(scene: Scene) -> None:
    scene.server.apply("nul_text")

    source = await scene.register()

    tools = {tool["name"]: tool for tool in source["tools"]}
    assert set(tools) == {CREATE, f"{SOURCE}__nul_description"}
    assert tools[f"{SOURCE}__nul_description"]["description"] == "looksharmless"
    error = source["lastError"]
    assert "tool 'nul\\x00name' left out: its name holds a control character" in error
    assert "tool 'nul_schema' left out: its inputSchema holds a NUL or a lone surrogate" in error
    assert "\x00" not in error


async def test_the_periodic_sync_of_nul_text_succeeds_and_names_it(
    scene: Scene, settings: Settings
) -> None:
    scene.server.state.tools = [write_tool()]
    await scene.register()
    scene.server.apply("nul_text")

    synced = await sync_enabled_sources(scene.engine, seconds=settings.tool_timeout_seconds)

    assert synced == 1
    listed = (
        await scene.gql.data(
            "{ toolSources { lastError tools { name } } }", as_user=scene.admin.id, admin=True
        )
    )["toolSources"]
    [seen] = listed
    assert "its name holds a control character" in seen["lastError"]
    assert {t["name"] for t in seen["tools"]} == {CREATE, f"{SOURCE}__nul_description"}


async def test_a_tool_renamed_to_the_same_catalog_name_replaces_the_old_one(scene: Scene) -> None:
    scene.server.state.tools = [write_tool(), read_tool("look up", PLAIN_SCHEMA)]
    source = await scene.register()
    assert f"{SOURCE}__look_up" in names(source)
    # The server renames it: the new name gives the same catalog name as the vanished one.
    scene.server.state.tools = [write_tool(), read_tool("look_up", PLAIN_SCHEMA)]

    synced = await scene.sync(source)

    assert names(synced) == {CREATE, f"{SOURCE}__look_up"}
    assert synced["lastError"] is None


async def test_a_source_rename_that_swaps_catalog_names_syncs(scene: Scene) -> None:
    # As `s`, tool "a__b" is s__a__b; renamed `s__a`, tool "b" becomes s__a__b (and "a__b"
    # becomes s__a__a__b): two rows of one source trade a name in one sync.
    scene.server.state.tools = [read_tool("b", PLAIN_SCHEMA), read_tool("a__b", PLAIN_SCHEMA)]
    source = await scene.register("s")
    assert names(source) == {"s__b", "s__a__b"}

    renamed = await scene.admin.upsert(id=source["id"], name="s__a", url=scene.server.url)

    assert names(renamed) == {"s__a__b", "s__a__a__b"}
    assert renamed["lastError"] is None


async def test_a_rename_that_collides_with_another_source_is_named(scene: Scene) -> None:
    scene.server.state.tools = [read_tool("b__c", PLAIN_SCHEMA)]
    await scene.register("a")  # a__b__c
    scene.server.state.tools = [read_tool("c", PLAIN_SCHEMA), read_tool("d", PLAIN_SCHEMA)]
    other = await scene.register("other")

    renamed = await scene.admin.upsert(id=other["id"], name="a__b", url=scene.server.url)

    assert names(renamed) == {"a__b__d"}
    assert renamed["lastError"] == "'a__b__c' is already a tool of the catalog; not synced"
