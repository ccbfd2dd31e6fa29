"""Abuse of a real `agent-engine serve` process: hostile documents and transports.

Each is refused with an error that says what was wrong, before any of it is executed (the code
says which guard refused it: size, depth, aliases, cost, validation), and the server stays
healthy: /healthz answers 200 after each, and a normal query still works. How fast a refusal is
belongs to the benchmarks, not here: the client's timeout only keeps a hang from passing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest
from websockets.exceptions import ConnectionClosed

from tests.e2e.support import (  # noqa: F401 (fixtures)
    LEGACY_WS,
    QUICK_SECONDS,
    Stack,
    codes,
    stack,
    token,
    websocket,
)
from tests.support.factories import Factories

OWNER = 51
BUDGET = "subscription { budget { usedTokens } }"


@dataclass(frozen=True)
class Abuse:
    name: str
    request: Callable[[str], dict[str, Any]]  # bearer → httpx.request kwargs
    status: int
    code: str | tuple[str, ...]
    says: str | tuple[str, ...]  # a word the message must contain (one of)


def _gql(query: str, bearer: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    return {"json": {"query": query}, "headers": headers}


DEEP = "{ viewer { agents { " + "lastRun { agent { " * 40 + "id" + " } }" * 40 + " } } }"
ALIASES = "{ " + " ".join(f"a{i}: viewer {{ isAdmin }}" for i in range(1000)) + " }"
DUPLICATES = "{ viewer { " + " ".join(["isAdmin"] * 1000) + " } }"
CIRCULAR = (
    "query { viewer { ...A } } fragment A on Viewer { agents { owner { id } } ...B }"
    " fragment B on Viewer { isAdmin ...A }"
)
# Within the depth, alias, token and field limits, but tens of thousands of objects per alias.
PAGES_OF_PAGES = (
    "{ "
    + " ".join(
        f"a{i}: viewer {{ agents {{ runs(first: 100) {{ edges {{ node {{ agent {{"
        f" runs(first: 100) {{ edges {{ node {{ id }} }} }} }} }} }} }} }} }}"
        for i in range(30)
    )
    + " }"
)
MAX_BODY_BYTES = 1_000_000

ABUSES = [
    Abuse("deep nesting", lambda b: _gql(DEEP, b), 200, "GRAPHQL_VALIDATION_FAILED", "depth"),
    Abuse(
        "1,000 aliases",
        lambda b: _gql(ALIASES, b),
        200,
        # The token limit stops the parser before the alias limit is even counted.
        ("GRAPHQL_VALIDATION_FAILED", "GRAPHQL_PARSE_FAILED"),
        ("aliases", "tokens"),
    ),
    Abuse(
        "circular fragments",
        lambda b: _gql(CIRCULAR, b),
        200,
        "GRAPHQL_VALIDATION_FAILED",
        "within itself",
    ),
    Abuse(
        "batched operations",
        lambda b: {
            "json": [{"query": "{ __typename }"}] * 50,
            "headers": {"Authorization": f"Bearer {b}"},
        },
        400,
        "BAD_REQUEST",
        "batch",
    ),
    Abuse(
        "oversized body",
        lambda b: {
            "content": b'{"query": "{ __typename }", "variables": {"x": "'
            + b"x" * (MAX_BODY_BYTES + 1)
            + b'"}}',
            "headers": {"Content-Type": "application/json", "Authorization": f"Bearer {b}"},
        },
        413,
        "PAYLOAD_TOO_LARGE",
        "larger",
    ),
    Abuse(
        "introspection without a token",
        lambda b: _gql("{ __schema { types { name fields { name } } } }"),
        200,
        "UNAUTHENTICATED",
        "introspection",
    ),
]


async def _check(http: httpx.AsyncClient, url: str, abuse: Abuse, bearer: str) -> list[str]:
    """What went wrong with one abuse, if anything."""
    problems: list[str] = []
    response = await http.post(f"{url}/graphql", **abuse.request(bearer))
    if response.status_code != abuse.status:
        problems.append(f"{abuse.name}: status {response.status_code}: {response.text[:300]}")
    else:
        body = response.json()
        accepted = abuse.code if isinstance(abuse.code, tuple) else (abuse.code,)
        words = abuse.says if isinstance(abuse.says, tuple) else (abuse.says,)
        if codes(body)[:1] not in [[c] for c in accepted] or body.get("data"):
            problems.append(f"{abuse.name}: {str(body)[:300]}")
        elif not any(w in body["errors"][0]["message"].lower() for w in words):
            problems.append(f"{abuse.name}: unclear message {body['errors'][0]['message']!r}")
    if (await http.get(f"{url}/healthz")).status_code != 200:
        problems.append(f"{abuse.name}: /healthz not 200 afterwards")
    return problems


async def test_hostile_documents_and_bodies_are_refused(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    await factories.user(id=OWNER)
    api = await stack.api()
    bearer = token(stack.settings, OWNER)
    async with httpx.AsyncClient(timeout=30.0) as http:
        problems: list[str] = []
        for abuse in ABUSES:
            problems += await _check(http, api.url or "", abuse, bearer)
        # Many at once from many clients: still refused, still healthy, still serving.
        floods = await asyncio.gather(
            *(_check(http, api.url or "", abuse, bearer) for abuse in ABUSES * 5)
        )
        problems += [p for found in floods for p in found]
        assert problems == [], "\n".join(problems)
        normal = await http.post(f"{api.url}/graphql", **_gql("{ viewer { user { id } } }", bearer))
        assert normal.json() == {"data": {"viewer": {"user": {"id": str(OWNER)}}}}
    assert api.alive()


async def test_a_thousand_duplicate_fields_are_refused(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    await factories.user(id=OWNER)
    api = await stack.api()
    abuse = Abuse(
        "1,000 duplicate fields",
        lambda b: _gql(DUPLICATES, b),
        200,
        "GRAPHQL_VALIDATION_FAILED",
        ("duplicate", "fields"),
    )
    async with httpx.AsyncClient(timeout=30.0) as http:
        assert await _check(http, api.url or "", abuse, token(stack.settings, OWNER)) == []


async def test_nested_pages_are_refused_by_their_cost(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    """Within the depth, alias, token and field limits, yet millions of objects: the estimate
    refuses it before validation and execution."""
    await factories.user(id=OWNER)
    api = await stack.api()
    abuse = Abuse(
        "30 aliases of nested pages",
        lambda b: _gql(PAGES_OF_PAGES, b),
        200,
        "GRAPHQL_VALIDATION_FAILED",
        "cost",
    )
    async with httpx.AsyncClient(timeout=30.0) as http:
        assert await _check(http, api.url or "", abuse, token(stack.settings, OWNER)) == []


async def test_legacy_graphql_ws_and_a_subscription_flood_are_refused(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    await factories.user(id=OWNER)
    api = await stack.api()
    url = api.url or ""
    bearer = token(stack.settings, OWNER)
    # The legacy `graphql-ws` subprotocol: not negotiated, and the socket is closed 4406.
    async with websocket(url, subprotocol=LEGACY_WS) as legacy:
        assert legacy.connection.subprotocol is None
        with pytest.raises(ConnectionClosed) as closed:
            await legacy.send({"type": "connection_init", "payload": {}})
            await legacy.receive()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4406

    # A flood of subscriptions on one socket: the ones over the cap are refused one by one.
    cap = stack.settings.max_subscriptions_per_connection
    flood = cap * 5
    async with websocket(url) as ws:
        assert (await ws.init(bearer=bearer))["type"] == "connection_ack"
        for number in range(flood):
            await ws.subscribe(str(number), BUDGET)
        # One refusal per subscription over the cap (each within the client's event timeout),
        # then whatever else arrives: none of it may be another refusal.
        replies: list[dict[str, Any]] = []
        while sum(m["type"] == "error" for m in replies) < flood - cap:
            replies.append(await ws.receive())
        replies += await ws.messages_for(QUICK_SECONDS)
        refused = [m for m in replies if m["type"] == "error"]
        assert {m["id"] for m in refused} == {str(n) for n in range(cap, flood)}, replies[:3]
        assert all("limit" in m["payload"][0]["message"].lower() for m in refused)
        # The socket itself still works for the subscriptions within the cap.
        await ws.send({"type": "ping"})
        while (reply := await ws.receive())["type"] == "next":
            pass  # a subscription within the cap may still be sending its first value
        assert reply["type"] == "pong", reply
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/healthz")).status_code == 200
        metrics = (await http.get(f"{url}/metrics")).text
    assert api.alive()
    # The closed socket's subscriptions are gone from the process.
    gauge = [line for line in metrics.splitlines() if line.startswith("agent_engine_active_sub")]
    assert gauge and gauge[0].endswith(" 0.0"), gauge


ATTACK_REQUESTS = 150
ATTACK_PADDING_CHARS = 900_000
RSS_GROWTH_ALLOWED_BYTES = 100 * 1024 * 1024


async def test_anonymous_documents_cannot_make_the_api_hold_memory(
    stack: Stack,  # noqa: F811
) -> None:
    """The review's attack: 150 anonymous requests, each a unique document of ~1 MB (a tiny query
    and a comment). Each is refused before parsing with a 413 naming the limit, and the api's
    resident memory stays within RSS_GROWTH_ALLOWED_BYTES of where it started."""
    api = await stack.api()
    server = psutil.Process(api.pid)
    async with httpx.AsyncClient(timeout=30.0) as http:
        # Warm up the paths a normal anonymous request takes before measuring.
        for _ in range(3):
            await http.post(f"{api.url}/graphql", json={"query": "{ __typename }"})
        started = server.memory_info().rss
        refused: list[str] = []
        for number in range(ATTACK_REQUESTS):
            document = "{__typename} #" + f"{number}😀" + "x" * ATTACK_PADDING_CHARS
            response = await http.post(f"{api.url}/graphql", json={"query": document})
            body = response.json()
            message = body["errors"][0]["message"] if body.get("errors") else ""
            if response.status_code != 413 or "document is larger than" not in message:
                refused.append(f"{response.status_code}: {response.text[:200]}")
        grown = server.memory_info().rss - started
        assert refused == [], refused[:3]
        assert grown < RSS_GROWTH_ALLOWED_BYTES, f"the api grew by {grown / 2**20:.0f} MiB"
        assert (await http.post(f"{api.url}/graphql", json={"query": "{ __typename }"})).json() == {
            "data": {"__typename": "Query"}
        }
    assert api.alive()


async def test_websocket_messages_are_held_to_the_request_limits(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    """A socket's document over the document limit is refused like a request's; a message over
    the body limit closes the socket (1009, uvicorn's ws_max_size); unreadable JSON closes it
    4400. The api stays healthy."""
    await factories.user(id=OWNER)
    api = await stack.api()
    url = api.url or ""
    bearer = token(stack.settings, OWNER)
    limit = stack.settings.max_document_bytes
    async with websocket(url) as ws:
        assert (await ws.init(bearer=bearer))["type"] == "connection_ack"
        await ws.subscribe("big", BUDGET + " #" + "x" * limit)
        refused = await ws.receive()
        assert refused["type"] == "error", refused
        assert refused["payload"][0]["extensions"]["code"] == "PAYLOAD_TOO_LARGE", refused
        assert str(limit) in refused["payload"][0]["message"]
        # The socket still serves documents within the limit.
        await ws.subscribe("small", "{ viewer { isAdmin } }")
        answer = await ws.receive()
        assert answer == {
            "id": "small",
            "type": "next",
            "payload": {"data": {"viewer": {"isAdmin": False}}},
        }
    async with websocket(url) as ws:
        assert (await ws.init(bearer=bearer))["type"] == "connection_ack"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.subscribe("huge", "{ __typename } #" + "x" * stack.settings.max_body_bytes)
            await ws.receive()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with websocket(url) as ws:
        assert (await ws.init(bearer=bearer))["type"] == "connection_ack"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.connection.send("[" * 100_000 + "]" * 100_000)
            await ws.receive()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/healthz")).status_code == 200
    assert api.alive()
