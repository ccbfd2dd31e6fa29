"""Access: bad tokens are refused, and an owner never reads or changes another owner's agent, run,
tools or knowledge — over HTTP, over WebSocket, and through an agent's own knowledge tools.

Everything goes through a real `agent-engine serve` process (and a real worker for the runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from jwt.warnings import InsecureKeyLengthWarning
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from websockets.exceptions import ConnectionClosed

from agent_engine.knowledge.postgres import put_document
from agent_engine.settings import Settings
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

ALICE = 61
BOB = 62
GONE = 63
SECRET = "BLUEFIN-7"

AGENT = "query($id: ID!) { agent(id: $id) { id name prompt } }"
RUN = "query($id: ID!) { run(id: $id) { id output } }"
VIEWER = "{ viewer { agents { id } } }"
RUN_EVENTS = "subscription($a: ID) { runEvents(agentId: $a) { run { id state agent { id } } } }"
START = "mutation($a: ID!) { startRun(agentId: $a) { id state } }"
# Every way to change someone else's agent.
MUTATIONS: dict[str, str] = {
    "updateAgent": 'mutation($a: ID!) { updateAgent(id: $a, input: {prompt: "mine"}) { id } }',
    "deleteAgent": "mutation($a: ID!) { deleteAgent(id: $a) }",
    "setAgentEnabled": "mutation($a: ID!) { setAgentEnabled(id: $a, enabled: false) { id } }",
    "setAgentTools": "mutation($a: ID!) { setAgentTools(agentId: $a, toolIds: []) { id } }",
    "attachTool": "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }",
    "detachTool": "mutation($a: ID!, $t: ID!) { detachTool(agentId: $a, toolId: $t) { id } }",
    "startRun": "mutation($a: ID!) { startRun(agentId: $a) { id } }",
}


def _now() -> int:
    return int(time.time())


def _encode(claims: dict[str, Any], key: str | None, algorithm: str) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        return jwt.encode(claims, key, algorithm=algorithm)


BAD_TOKENS: dict[str, Callable[[Settings], str]] = {
    "wrong key": lambda s: _encode(
        {"sub": str(ALICE), "exp": _now() + 600}, "not-the-secret-" * 3, "HS256"
    ),
    "expired": lambda s: _encode({"sub": str(ALICE), "exp": _now() - 120}, s.jwt_secret, "HS256"),
    "alg none": lambda s: _encode({"sub": str(ALICE), "exp": _now() + 600}, None, "none"),
    "non-numeric sub": lambda s: _encode(
        {"sub": "alice", "exp": _now() + 600}, s.jwt_secret, "HS256"
    ),
    "deactivated user": lambda s: token(s, GONE),
}


async def test_bad_tokens_are_refused_over_http_and_websocket(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    await factories.user(id=ALICE)
    await factories.user(id=GONE, is_active=False)
    api = await stack.api()
    url = api.url or ""
    for name, make in BAD_TOKENS.items():
        bearer = make(stack.settings)
        client = Client(url, bearer=bearer)
        try:
            body = await client.body(VIEWER)
        finally:
            await client.aclose()
        expected = "FORBIDDEN" if name == "deactivated user" else "UNAUTHENTICATED"
        assert codes(body) == [expected], (name, body)
        assert body.get("data") is None, (name, body)
        async with websocket(url) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.init(bearer=bearer)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403, name
    # The deactivated user stayed deactivated: the token did not revive the account.
    async with factories.engine.connect() as conn:
        active = (
            await conn.execute(text("SELECT is_active FROM users WHERE id = :i"), {"i": GONE})
        ).scalar_one()
    assert active is False


_SNAPSHOT = (
    "SELECT (SELECT json_agg(a ORDER BY a.id) FROM agents a),"
    " (SELECT json_agg(r ORDER BY r.id) FROM agent_runs r),"
    " (SELECT coalesce(json_agg(t ORDER BY t.agent_id, t.tool_id), '[]') FROM agent_tools t)"
)


async def _snapshot(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        row = (await conn.execute(text(_SNAPSHOT))).one()
    return json.dumps(list(row), sort_keys=True, default=str)


async def test_an_owner_never_reads_or_changes_another_owners_things(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    """Over HTTP and WebSocket, and through Bob's agent's knowledge tools."""
    await factories.user(id=ALICE)
    await factories.user(id=BOB)
    model = await fake_model(factories, fake_openai)
    tool = await factories.tool("e2e_access_tool")
    alices = await factories.agent(
        user_id=ALICE, model_id=model["id"], prompt=f"Alice's private prompt {SECRET}"
    )
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
            {"a": alices["id"], "t": tool["id"]},
        )
        secret_doc = await put_document(
            conn, title="Alice's payroll", body=f"Salaries: {SECRET} table.", grant_to=[ALICE]
        )
    alices_run = await factories.run(
        agent_id=alices["id"], state="succeeded", output=f"report {SECRET}"
    )
    bobs = await factories.agent(user_id=BOB, model_id=model["id"], prompt="Bob's agent")
    api = await stack.api()
    stack.worker(threads=2)
    url = api.url or ""
    alice = Client(url, bearer=token(stack.settings, ALICE))
    bob = Client(url, bearer=token(stack.settings, BOB))
    try:
        # --- HTTP: reads ----------------------------------------------------------------------
        before = await _snapshot(engine)
        for query, ident in ((AGENT, alices["id"]), (RUN, alices_run["id"])):
            body = await bob.body(query, {"id": str(ident)})
            assert SECRET not in json.dumps(body)
            assert all(v is None for v in (body.get("data") or {}).values()), body
            assert codes(body) in ([], ["NOT_FOUND"]), body
        assert (await bob.data(VIEWER))["viewer"]["agents"] == [{"id": str(bobs["id"])}]
        # --- HTTP: changes --------------------------------------------------------------------
        for name, mutation in MUTATIONS.items():
            variables = {"a": str(alices["id"])}
            if "$t" in mutation:
                variables["t"] = str(tool["id"])
            body = await bob.body(mutation, variables)
            assert codes(body) == ["NOT_FOUND"], (name, body)
        assert await _snapshot(engine) == before

        # --- WebSocket ------------------------------------------------------------------------
        async with websocket(url) as bob_ws, websocket(url) as alice_ws:
            assert (await bob_ws.init(bearer=bob.bearer))["type"] == "connection_ack"
            assert (await alice_ws.init(bearer=alice.bearer))["type"] == "connection_ack"
            await bob_ws.subscribe("theirs", RUN_EVENTS, {"a": str(alices["id"])})
            refused = await bob_ws.receive()
            assert refused["type"] == "error", refused
            assert refused["payload"][0]["extensions"]["code"] == "NOT_FOUND"
            assert SECRET not in json.dumps(refused)
            await bob_ws.subscribe("mine", RUN_EVENTS, {"a": None})
            await alice_ws.subscribe("mine", RUN_EVENTS, {"a": None})
            await subscriptions_open(url, 2)
            started = (await alice.data(START, {"a": str(alices["id"])}))["startRun"]
            await eventually(lambda: all_terminal(engine, [int(started["id"])]), within=20)
            seen_by_alice = await alice_ws.messages_until(
                lambda m: (
                    m["type"] == "next"
                    and m["payload"]["data"]["runEvents"]["run"]["id"] == started["id"]
                )
            )
            assert seen_by_alice
            assert await bob_ws.messages_for(0.5) == []

        # --- Knowledge, through Bob's own agent ----------------------------------------------
        fake_openai.reset()

        def model_script(request: dict[str, Any]) -> Any:
            if any(m.get("role") == "tool" for m in request["messages"]):
                return text_reply("done")
            return tool_reply(
                FakeToolCall("search_knowledge", {"query": "payroll salaries"}),
                FakeToolCall("read_document", {"document_id": secret_doc}),
                FakeToolCall("related_documents", {"document_id": secret_doc}),
            )

        fake_openai.script(model_script)
        bobs_run = (await bob.data(START, {"a": str(bobs["id"])}))["startRun"]
        await eventually(lambda: all_terminal(engine, [int(bobs_run["id"])]), within=20)
        finished = await fetch(
            engine, "SELECT state FROM agent_runs WHERE id = :i", i=int(bobs_run["id"])
        )
        assert finished == [{"state": "succeeded"}]
        tool_results = [
            m["content"]
            for body in fake_openai.requests
            for m in body["messages"]
            if m.get("role") == "tool"
        ]
        assert len(tool_results) == 3
        assert all(SECRET not in r and "Alice's payroll" not in r for r in tool_results)
    finally:
        await alice.aclose()
        await bob.aclose()
