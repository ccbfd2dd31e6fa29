"""Hardening, through real `agent-engine serve` and `worker` processes: the budget
cannot be refunded by deleting an agent, admins oversee without acting as the owner, model
endpoints and run outputs stay with who may see them, hostile documents are refused by their
cost, a zone change moves calendar slots, owners can be reactivated, and the smaller holes.

WebSocket sessions (deactivation, token expiry, per-operation checks) are in test_sessions.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    text_reply,
    tool_reply,
)
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    Stack,
    all_terminal,
    codes,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    stack,
    subscriptions_open,
    token,
    websocket,
)
from tests.support.factories import Factories

START = "mutation($a: ID!) { startRun(agentId: $a) { id state reason } }"
DELETE = "mutation($a: ID!) { deleteAgent(id: $a) }"
CREATE = 'mutation($n: String!) { createAgent(input: {name: $n, prompt: "p"}) { id } }'
BUDGET = "{ viewer { budget { usedTokens capTokens exceeded } } }"
AGENTS = "{ viewer { agents { id } } }"
AGENT = "query($a: ID!) { agent(id: $a) { id } }"
RUN = "query($r: ID!) { run(id: $r) { id state output } }"
ADMIN_AGENTS = "{ adminAgents(first: 100) { edges { node { id } } } }"
ADMIN_RUNS = "{ adminRuns(first: 100) { edges { node { id output } } } }"


def _finished_event(message: dict[str, Any]) -> bool:
    return (
        message["type"] == "next"
        and message["payload"]["data"]["runEvents"]["run"]["state"] == "SUCCEEDED"
    )


async def _run_state(engine: AsyncEngine, run_id: int) -> str | None:
    rows = await fetch(engine, "SELECT state FROM agent_runs WHERE id = :r", r=run_id)
    return str(rows[0]["state"]) if rows else None


async def _wait_state(engine: AsyncEngine, run_id: int, *states: str) -> str:
    async def probe() -> str | None:
        state = await _run_state(engine, run_id)
        return state if state in states else None

    found: str = await eventually(probe, within=30, what=f"run {run_id} in {states}")
    return found


# --- 1. deleting an agent does not refund the week ----------------------------------------------


async def test_deleting_an_agent_never_lowers_the_weeks_spend(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    model = await fake_model(factories, fake_openai, is_default=True)
    spent = await factories.agent(user_id=owner, model_id=model["id"], name="spent")
    running = await factories.agent(user_id=owner, model_id=model["id"], name="running")
    api = await stack.api()
    stack.worker(threads=2)
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    overseer = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    try:
        # A run that spends 120 tokens, then the agent is deleted.
        fake_openai.script(lambda _: text_reply("done", prompt_tokens=100, completion_tokens=20))
        first = (await client.data(START, {"a": str(spent["id"])}))["startRun"]
        assert await _wait_state(engine, int(first["id"]), "succeeded") == "succeeded"
        await factories.setting("agent_weekly_token_cap", 100)
        before = (await client.data(BUDGET))["viewer"]["budget"]
        assert before == {"usedTokens": 120, "capTokens": 100, "exceeded": True}
        assert (await client.data(DELETE, {"a": str(spent["id"])}))["deleteAgent"] == str(
            spent["id"]
        )
        # The spend stays; a new agent does not run on a refunded week.
        assert (await client.data(BUDGET))["viewer"]["budget"] == before
        fresh = (await client.data(CREATE, {"n": "fresh"}))["createAgent"]["id"]
        refused = (await client.data(START, {"a": fresh}))["startRun"]
        assert (refused["state"], refused["reason"]) == ("SKIPPED", "BUDGET_EXCEEDED")
        # The deleted agent is gone from every view and never runs again.
        ids = {a["id"] for a in (await client.data(AGENTS))["viewer"]["agents"]}
        assert str(spent["id"]) not in ids and {str(running["id"]), fresh} <= ids
        assert codes(await client.body(AGENT, {"a": str(spent["id"])})) == ["NOT_FOUND"]
        assert codes(await client.body(RUN, {"r": first["id"]})) == ["NOT_FOUND"]
        assert codes(await client.body(START, {"a": str(spent["id"])})) == ["NOT_FOUND"]
        assert codes(await client.body(DELETE, {"a": str(spent["id"])})) == ["NOT_FOUND"]
        listed = json.dumps(await overseer.data(ADMIN_AGENTS)) + json.dumps(
            await overseer.data(ADMIN_RUNS)
        )
        assert f'"{spent["id"]}"' not in listed and f'"{first["id"]}"' not in listed

        # A run still going when its agent is deleted finishes and counts.
        await factories.setting("agent_weekly_token_cap", None)
        fake_openai.script(
            lambda _: text_reply("late", prompt_tokens=100, completion_tokens=20, delay_seconds=2)
        )
        late = (await client.data(START, {"a": str(running["id"])}))["startRun"]
        await _wait_state(engine, int(late["id"]), "running")
        await client.data(DELETE, {"a": str(running["id"])})
        assert await _wait_state(engine, int(late["id"]), "succeeded") == "succeeded"
        after = (await client.data(BUDGET))["viewer"]["budget"]
        assert after["usedTokens"] == 240
        assert str(running["id"]) not in json.dumps(await client.data(AGENTS))
    finally:
        await client.aclose()
        await overseer.aclose()


# --- 3. admins oversee, they do not act as the owner --------------------------------------------

OWNER_ACTS = {
    "updateAgent": 'mutation($a: ID!) { updateAgent(id: $a, input: {prompt: "leak"}) { id } }',
    "startRun": START,
    "setAgentTools": "mutation($a: ID!) { setAgentTools(agentId: $a, toolIds: []) { id } }",
    "attachTool": "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }",
    "detachTool": "mutation($a: ID!, $t: ID!) { detachTool(agentId: $a, toolId: $t) { id } }",
    "setAgentEnabled": "mutation($a: ID!) { setAgentEnabled(id: $a, enabled: false) { id } }",
}
RUN_EVENTS = "subscription { runEvents { run { id state output } } }"


async def test_admins_oversee_but_never_act_as_the_owner_or_read_outputs(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    model = await fake_model(factories, fake_openai)
    agent = await factories.agent(user_id=owner, model_id=model["id"], prompt="mine")
    tool = await factories.tool("hardening_tool")
    fake_openai.script(lambda _: text_reply("PRIVATE-DIGEST"))
    api = await stack.api()
    stack.worker(threads=2)
    url = api.url or ""
    client = Client(url, bearer=token(stack.settings, owner))
    overseer = Client(url, bearer=token(stack.settings, admin, admin=True))
    try:
        for name, mutation in OWNER_ACTS.items():
            variables = {"a": str(agent["id"]), "t": str(tool["id"])}
            if "$t" not in mutation:
                del variables["t"]
            body = await overseer.body(mutation, variables)
            assert codes(body) == ["FORBIDDEN"], (name, body)
        rows = await fetch(engine, "SELECT prompt FROM agents WHERE id = :a", a=agent["id"])
        assert rows == [{"prompt": "mine"}]
        assert await fetch(engine, "SELECT id FROM agent_runs") == []

        async with websocket(url) as owner_ws, websocket(url) as admin_ws:
            assert (await owner_ws.init(bearer=client.bearer))["type"] == "connection_ack"
            assert (await admin_ws.init(bearer=overseer.bearer))["type"] == "connection_ack"
            await owner_ws.subscribe("o", RUN_EVENTS)
            await admin_ws.subscribe("a", RUN_EVENTS)
            await subscriptions_open(url, 2)
            run = (await client.data(START, {"a": str(agent["id"])}))["startRun"]
            await _wait_state(engine, int(run["id"]), "succeeded")
            seen = {
                "owner": await owner_ws.messages_until(_finished_event),
                "admin": await admin_ws.messages_until(_finished_event),
            }
        for who, messages in seen.items():
            finished = [
                m["payload"]["data"]["runEvents"]["run"]
                for m in messages
                if m["type"] == "next"
                and m["payload"]["data"]["runEvents"]["run"]["state"] == "SUCCEEDED"
            ]
            assert len(finished) == 1, (who, messages)
            expected = "PRIVATE-DIGEST" if who == "owner" else None
            assert finished[0]["output"] == expected, (who, finished)

        # Over HTTP: the journal's metadata, never the output.
        mine = (await client.data(RUN, {"r": run["id"]}))["run"]
        theirs = (await overseer.data(RUN, {"r": run["id"]}))["run"]
        assert mine == {"id": run["id"], "state": "SUCCEEDED", "output": "PRIVATE-DIGEST"}
        assert theirs == {"id": run["id"], "state": "SUCCEEDED", "output": None}
        page = (await overseer.data(ADMIN_RUNS))["adminRuns"]["edges"]
        assert [e["node"] for e in page] == [{"id": run["id"], "output": None}]
        last = await overseer.data(
            "query($a: ID!) { agent(id: $a) { prompt lastRun { output } } }",
            {"a": str(agent["id"])},
        )
        assert last == {"agent": {"prompt": "mine", "lastRun": {"output": None}}}
        # Oversight itself still works: pause, then delete.
        paused = await overseer.data(
            "mutation($a: ID!) { setAdminPaused(agentId: $a, paused: true) { status } }",
            {"a": str(agent["id"])},
        )
        assert paused["setAdminPaused"]["status"] == "ADMIN_PAUSED"
        assert (await overseer.data(DELETE, {"a": str(agent["id"])}))["deleteAgent"]
    finally:
        await client.aclose()
        await overseer.aclose()


# --- 4. model endpoints are the admin's ---------------------------------------------------------

MODELS = "{ agentModels { name baseUrl apiKeyEnv } }"
UPSERT_MODEL = """mutation($url: String) {
  upsertAgentModel(input: {name: "m", provider: "openai", model: "x", baseUrl: $url,
                           apiKeyEnv: "OPENAI_API_KEY"}) { id baseUrl apiKeyEnv } }"""


async def test_model_endpoints_are_admin_only_and_never_carry_credentials(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    await factories.model(
        name="internal", provider="openai", base_url="https://llm.internal/v1", api_key_env="K"
    )
    api = await stack.api()
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    overseer = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    try:
        assert (await client.data(MODELS))["agentModels"] == [
            {"name": "internal", "baseUrl": None, "apiKeyEnv": None}
        ]
        assert (await overseer.data(MODELS))["agentModels"] == [
            {"name": "internal", "baseUrl": "https://llm.internal/v1", "apiKeyEnv": "K"}
        ]
        before = await fetch(engine, "SELECT count(*) AS n FROM agent_models")
        for url in (
            "https://user:secret@llm.example/v1",
            "https://:secret@llm.example/v1",
            "https://llm.example/v1?api_key=secret",
        ):
            body = await overseer.body(UPSERT_MODEL, {"url": url})
            assert codes(body) == ["BAD_USER_INPUT"], (url, body)
            assert body["errors"][0]["extensions"]["field"] == "input.baseUrl"
            assert "secret" not in body["errors"][0]["message"]
        assert await fetch(engine, "SELECT count(*) AS n FROM agent_models") == before
        saved = (await overseer.data(UPSERT_MODEL, {"url": "https://llm.example/v1"}))[
            "upsertAgentModel"
        ]
        assert saved["baseUrl"] == "https://llm.example/v1"
    finally:
        await client.aclose()
        await overseer.aclose()


# --- 5. one query cannot exhaust the pool; agents per owner are capped --------------------------

NESTED = (
    "viewer { agents { runs(first: 100) { edges { node { id agent {"
    " runs(first: 100) { edges { node { id } } } } } } } } }"
)
HOSTILE = "{ " + " ".join(f"a{i}: {NESTED}" for i in range(30)) + " }"
PAGES = (
    "runs(first: 100) { edges { node { agent { runs(first: 100) { edges { node { id } } } } } } }"
)
# Over the limit per event (about 61,000): three pages of pages under each event's agent.
COSTLY_SUBSCRIPTION = (
    "subscription { runEvents { run { agent { "
    + " ".join(f"{alias}: {PAGES}" for alias in "abc")
    + " } } } }"
)


async def test_a_costly_document_is_refused_before_it_runs_and_agents_are_capped(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    model = await factories.model(is_default=True)
    for i in range(3):
        agent = await factories.agent(user_id=owner, model_id=model["id"], name=f"a{i}")
        await factories.run(agent_id=agent["id"], state="succeeded")
    stack.settings = stack.settings.model_copy(update={"max_agents_per_owner": 5})
    api = await stack.api()
    url = api.url or ""
    client = Client(url, bearer=token(stack.settings, owner))
    try:
        body = await client.body(HOSTILE)
        assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"] and body.get("data") is None
        message = body["errors"][0]["message"]
        assert "estimated cost" in message and "50,000" in message, message
        # Within the limit: served.
        served = await client.data(
            "{ viewer { agents { runs(first: 5) { edges { node { id } } } } } }"
        )
        assert len(served["viewer"]["agents"]) == 3
        # The same estimate for subscription documents.
        async with websocket(url) as ws:
            assert (await ws.init(bearer=client.bearer))["type"] == "connection_ack"
            await ws.subscribe("s", COSTLY_SUBSCRIPTION)
            refused = await ws.receive()
        assert refused["type"] == "error", refused
        assert refused["payload"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"
        assert "estimated cost" in refused["payload"][0]["message"]

        # Agents per owner: concurrent creations cannot pass the cap together.
        results = await asyncio.gather(*(client.body(CREATE, {"n": f"new{i}"}) for i in range(6)))
        created = [r for r in results if not r.get("errors")]
        refusals = [r["errors"][0] for r in results if r.get("errors")]
        assert len(created) == 2, results
        assert all(
            e["extensions"] == {"code": "BAD_USER_INPUT", "field": "input"} and "5" in e["message"]
            for e in refusals
        ), refusals
        live = await fetch(engine, "SELECT count(*) AS n FROM agents WHERE user_id = :o", o=owner)
        assert live == [{"n": 5}]
    finally:
        await client.aclose()


# --- 6. a zone change moves calendar slots ------------------------------------------------------

NEXT = "query($a: ID!) { agent(id: $a) { nextRunAt } }"
CREATE_DAILY = """mutation { createAgent(input: {name: "daily", prompt: "p",
  schedule: {calendar: {cadence: DAILY, time: "09:00"}}}) { id nextRunAt } }"""


async def test_a_zone_change_moves_calendar_slots_in_the_same_request(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user(timezone="Europe/Berlin"))["id"]
    await factories.model(is_default=True)
    api = await stack.api()
    url = api.url or ""
    berlin = Client(url, bearer=token(stack.settings, owner, timezone="Europe/Berlin"))
    new_york = Client(url, bearer=token(stack.settings, owner, timezone="America/New_York"))
    try:
        agent = (await berlin.data(CREATE_DAILY))["createAgent"]
        slot = datetime.fromisoformat(agent["nextRunAt"])
        assert slot.astimezone(_zone("Europe/Berlin")).strftime("%H:%M") == "09:00"
        # The first request with the new zone answers with the slot already moved.
        moved = datetime.fromisoformat(
            (await new_york.data(NEXT, {"a": agent["id"]}))["agent"]["nextRunAt"]
        )
        assert moved.astimezone(_zone("America/New_York")).strftime("%H:%M") == "09:00"
        assert datetime.now(UTC) < moved <= datetime.now(UTC) + timedelta(days=1)
    finally:
        await berlin.aclose()
        await new_york.aclose()


def _zone(name: str) -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


# --- 7. deactivation is not one-way -------------------------------------------------------------


async def test_an_admin_reactivates_an_owner_whose_agents_stay_off(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    model = await factories.model(is_default=True)
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    api = await stack.api()
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    overseer = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    status = "query($a: ID!) { agent(id: $a) { status enabled owner { active } } }"
    try:
        off = await overseer.data(f"mutation {{ deactivateOwner(userId: {owner}) }}")
        assert off == {"deactivateOwner": 1}
        assert codes(await client.body(AGENTS)) == ["FORBIDDEN"]
        assert (await overseer.data(status, {"a": str(agent["id"])}))["agent"]["owner"] == {
            "active": False
        }
        back = await overseer.data(
            f"mutation {{ reactivateOwner(userId: {owner}) {{ id active }} }}"
        )
        assert back == {"reactivateOwner": {"id": str(owner), "active": True}}
        # Signed in again, the agents still switched off until the owner switches them on.
        seen = (await client.data(status, {"a": str(agent["id"])}))["agent"]
        assert seen == {"status": "DISABLED", "enabled": False, "owner": {"active": True}}
        on = await client.data(
            "mutation($a: ID!) { setAgentEnabled(id: $a, enabled: true) { status } }",
            {"a": str(agent["id"])},
        )
        assert on["setAgentEnabled"]["status"] == "MANUAL"
        # Owners cannot reactivate anyone; a missing user is NOT_FOUND.
        assert codes(
            await client.body(f"mutation {{ reactivateOwner(userId: {owner}) {{ id }} }}")
        ) == ["FORBIDDEN"]
        assert codes(
            await overseer.body("mutation { reactivateOwner(userId: 987654321) { id } }")
        ) == ["NOT_FOUND"]
    finally:
        await client.aclose()
        await overseer.aclose()


# --- 8. the smaller ones ------------------------------------------------------------------------

# Widens the window between the start gate's check and the journal insert, so the race with a
# delete is decided the same way every time (a trigger on the real table; nothing is mocked).
SLOW_INSERT = """
CREATE FUNCTION test_slow_run_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$;
CREATE TRIGGER test_slow_run_insert BEFORE INSERT ON agent_runs
FOR EACH ROW EXECUTE FUNCTION test_slow_run_insert();
"""


async def test_start_run_racing_delete_agent_is_never_internal(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    model = await factories.model()
    agents = [await factories.agent(user_id=owner, model_id=model["id"]) for _ in range(3)]
    async with engine.begin() as conn:
        for statement in SLOW_INSERT.split(";\n"):
            if statement.strip():
                await conn.execute(text(statement))
    api = await stack.api()
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    try:
        for agent in agents:
            variables = {"a": str(agent["id"])}
            start = asyncio.ensure_future(client.post(START, variables))

            async def inserting() -> bool:
                rows = await fetch(
                    engine,
                    # The journal insert: alone, or inside the one-statement request's WITH.
                    "SELECT count(*) AS n FROM pg_stat_activity"
                    " WHERE query LIKE '%INSERT INTO agent_runs%' AND state = 'active'"
                    " AND pid <> pg_backend_pid()",
                )
                return int(rows[0]["n"]) > 0

            await eventually(inserting, within=10, what="the start inside its journal insert")
            deleted = await client.post(DELETE, variables)
            started = await start
            for response in (started, deleted):
                assert response.status_code == 200, response.text
                assert "INTERNAL" not in codes(response.json()), response.json()
            body = started.json()
            assert codes(body) == ["NOT_FOUND"] or body["data"]["startRun"]["state"] in (
                "QUEUED",
                "SKIPPED",
            ), body
            assert deleted.json()["data"]["deleteAgent"] == str(agent["id"])
            # Whatever won, the agent is gone and nothing of it is left unfinished.
            assert codes(await client.body(AGENT, variables)) == ["NOT_FOUND"]
            unfinished = await fetch(
                engine,
                "SELECT id FROM agent_runs WHERE agent_id = :a AND state IN ('queued', 'running')",
                a=agent["id"],
            )
            assert unfinished == []
    finally:
        await client.aclose()


SET_TOOLS = (
    "mutation($a: ID!, $t: [ID!]!) { setAgentTools(agentId: $a, toolIds: $t) { tools { name } } }"
)


async def test_set_agent_tools_refuses_a_tool_an_admin_has_since_disallowed(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner)
    kept = await factories.tool("kept_tool")
    other = await factories.tool("other_tool")
    api = await stack.api()
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    overseer = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    try:
        variables: dict[str, Any] = {"a": str(agent["id"]), "t": [str(kept["id"])]}
        assert (await client.data(SET_TOOLS, variables))["setAgentTools"]["tools"] == [
            {"name": "kept_tool"}
        ]
        await overseer.data(
            f"mutation {{ setToolAllowed(toolId: {kept['id']}, allowed: false) {{ id }} }}"
        )
        # Saving the selection again with the disallowed tool in it is refused, and changes nothing.
        variables["t"] = [str(kept["id"]), str(other["id"])]
        body = await client.body(SET_TOOLS, variables)
        assert codes(body) == ["BAD_USER_INPUT"], body
        assert body["errors"][0]["extensions"]["field"] == "toolIds"
        assert str(kept["id"]) in body["errors"][0]["message"]
        links = await fetch(
            engine, "SELECT tool_id FROM agent_tools WHERE agent_id = :a", a=agent["id"]
        )
        assert links == [{"tool_id": kept["id"]}]
        # Left out, the selection is saved; the disallowed tool is gone from it.
        variables["t"] = [str(other["id"])]
        assert (await client.data(SET_TOOLS, variables))["setAgentTools"]["tools"] == [
            {"name": "other_tool"}
        ]
    finally:
        await client.aclose()
        await overseer.aclose()


async def test_a_tool_infrastructure_failure_fails_the_run_naming_the_tool(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    model = await fake_model(factories, fake_openai)
    agent = await factories.agent(user_id=owner, model_id=model["id"])

    def model_script(request: dict[str, Any]) -> Any:
        if any(m.get("role") == "tool" for m in request["messages"]):
            return text_reply("an answer built on nothing")
        return tool_reply(FakeToolCall("search_knowledge", {"query": "on-call"}))

    api = await stack.api()
    stack.worker(threads=2)
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    try:
        # A tool's own refusal goes back to the model, and the run goes on.
        fake_openai.script(
            lambda request: (
                text_reply("corrected")
                if any(m.get("role") == "tool" for m in request["messages"])
                else tool_reply(FakeToolCall("read_document", {"document_id": 424242}))
            )
        )
        refused = (await client.data(START, {"a": str(agent["id"])}))["startRun"]
        assert await _wait_state(engine, int(refused["id"]), "succeeded", "failed") == "succeeded"
        tool_results = [
            m["content"]
            for body in fake_openai.requests
            for m in body["messages"]
            if m.get("role") == "tool"
        ]
        assert tool_results == ["error: document 424242 not found"]

        # The Knowledge Store is broken: the run fails, naming the tool, and answers nothing.
        fake_openai.reset()
        fake_openai.script(model_script)
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE kb_documents RENAME TO kb_documents_away"))
        run = (await client.data(START, {"a": str(agent["id"])}))["startRun"]
        assert await _wait_state(engine, int(run["id"]), "succeeded", "failed") == "failed"
        seen = (
            await client.data(
                "query($r: ID!) { run(id: $r) { state reason error output } }", {"r": run["id"]}
            )
        )["run"]
        assert (seen["state"], seen["reason"]) == ("FAILED", "ERROR")
        assert "search_knowledge" in seen["error"]
        assert seen["output"] is None
    finally:
        await client.aclose()


# A TCP server that accepts connections and never answers: a broker that hangs.
@contextmanager
def _silent_server() -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
async def test_a_broker_that_never_answers_does_not_hang_start_run(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
    scheme: str,
) -> None:
    owner = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner)
    with _silent_server() as port:
        url = f"{scheme}://127.0.0.1:{port}" + ("/0" if scheme == "redis" else "/")
        broker = {"redis_url": url} if scheme == "redis" else {"broker_url": url}
        stack.settings = stack.settings.model_copy(update={**broker, "broker_timeout_seconds": 1.0})
        api = await stack.api()
        # A liveness bound ten times the broker timeout (and below the client libraries' own
        # defaults, 5 s per Redis attempt and 15 s per AMQP one): a hung start fails here.
        client = Client(
            api.url or "", bearer=token(stack.settings, owner), http=httpx.AsyncClient(timeout=10)
        )
        try:
            started = (await client.data(START, {"a": str(agent["id"])}))["startRun"]
        finally:
            await client.aclose()
    assert started["state"] == "QUEUED"
    # Journaled: the reaper re-sends its message once a broker answers.
    assert await _run_state(engine, int(started["id"])) == "queued"
