"""graphql-transport-ws conformance with an independent client library (`gql`), on the grouped
delivery path (api/live/): the frames the groups write are what a stock client expects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from gql import Client, GraphQLRequest
from gql.client import AsyncClientSession
from gql.transport.exceptions import TransportQueryError
from gql.transport.websockets import WebsocketsTransport

from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import RUN_EVENTS, Server, token
from tests.support.factories import Factories

EVENT_TIMEOUT_SECONDS = 20.0


@asynccontextmanager
async def gql_session(server: Server, bearer: str) -> AsyncIterator[AsyncClientSession]:
    transport = WebsocketsTransport(
        url=server.ws_url,
        init_payload={"Authorization": f"Bearer {bearer}"},
        subprotocols=[WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL],
        connect_args={"proxy": None},
    )
    async with Client(transport=transport, fetch_schema_from_transport=False) as session:
        assert transport.subprotocol == "graphql-transport-ws"
        yield session


async def first_events(
    session: AsyncClientSession, request: GraphQLRequest, count: int, started: asyncio.Event
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    stream = session.subscribe(request)
    started.set()
    async with asyncio.timeout(EVENT_TIMEOUT_SECONDS):
        async for result in stream:
            events.append(result["runEvents"])
            if len(events) == count:
                break
    return events


async def test_a_stock_client_receives_grouped_events_and_completes(
    server: Server, settings: Settings, factories: Factories
) -> None:
    agent = await factories.agent(name="Digest")
    bearer = token(settings, agent["user_id"])
    request = GraphQLRequest(RUN_EVENTS, variable_values={"agentId": str(agent["id"])})
    async with gql_session(server, bearer) as first, gql_session(server, bearer) as second:
        started = [asyncio.Event(), asyncio.Event()]
        readers = [
            asyncio.create_task(first_events(session, request, 2, ready))
            for session, ready in zip((first, second), started, strict=True)
        ]
        for ready in started:
            await ready.wait()
        await server.wait_subscribers(2)
        # Both sockets share one group: one execution per event for the two of them.
        assert server.broadcaster.group_count == 1
        runs = [
            await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
            for _ in range(2)
        ]
        seen = await asyncio.gather(*readers)
        # Leaving the `async for` made gql send `complete`: the server forgets both.
        await server.wait_subscribers(0)
    expected = [str(run["id"]) for run in runs]
    for events in seen:
        assert [e["run"]["id"] for e in events] == expected
        assert events[0]["run"]["agent"] == {"id": str(agent["id"]), "name": "Digest"}
        assert [e["run"]["state"] for e in events] == ["SKIPPED", "SKIPPED"]
    assert server.broadcaster.group_count == 0


async def test_a_stock_client_gets_the_protocol_error_for_someone_elses_agent(
    server: Server, settings: Settings, factories: Factories
) -> None:
    agent = await factories.agent()
    stranger = await factories.user()
    request = GraphQLRequest(RUN_EVENTS, variable_values={"agentId": str(agent["id"])})
    async with gql_session(server, token(settings, stranger["id"])) as session:
        with pytest.raises(TransportQueryError) as refused:
            async with asyncio.timeout(EVENT_TIMEOUT_SECONDS):
                async for _ in session.subscribe(request):
                    pass
    assert refused.value.errors is not None
    assert refused.value.errors[0]["extensions"]["code"] == "NOT_FOUND"
    assert server.subscriber_count == 0
