"""Every operation on a WebSocket is a request of its own: its own clock, its own loaders, the
viewer checked again."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.app import create_app
from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import (
    GraphQLWs,
    Server,
    acknowledged_client,
    token,
)
from tests.integration.api.support import serving
from tests.support.factories import Factories

START = "mutation Start($id: ID!) { startRun(agentId: $id) { id state createdAt startedAt } }"
CANCEL = (
    "mutation Cancel($id: ID!) { cancelRun(runId: $id) { id state createdAt startedAt finishedAt"
    " } }"
)
AGENT = "query Agent($id: ID!) { agent(id: $id) { id name } }"


@dataclass
class LateClock:
    """Real time plus an offset the test moves: the socket opens "an hour ago"."""

    offset: timedelta = field(default=timedelta(hours=-1))

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


async def operation(client: GraphQLWs, op: str, query: str, **variables: str) -> dict[str, object]:
    await client.subscribe(op, query, variables)
    message = await client.message_for(op)
    assert message["type"] == "next", message
    assert (await client.message_for(op))["type"] == "complete"
    payload: dict[str, object] = message["payload"]
    return payload


async def database_now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        value = await conn.scalar(text("SELECT now()"))
    assert isinstance(value, datetime)
    return value


async def test_an_old_sockets_start_and_cancel_are_stamped_when_they_happen(
    settings: Settings, factories: Factories, engine: AsyncEngine
) -> None:
    agent = await factories.agent()
    clock = LateClock()
    app = create_app(settings, clock=clock)
    with serving(app) as url:
        server = Server(url=url, app=app)
        async with acknowledged_client(server, token(settings, agent["user_id"])) as client:
            clock.offset = timedelta(0)  # an hour (well, 8 s would do) after the socket opened
            before = await database_now(engine)
            started = await operation(client, "start", START, id=str(agent["id"]))
            run = started["data"]["startRun"]  # type: ignore[index]
            cancelled = await operation(client, "cancel", CANCEL, id=run["id"])
    finished = cancelled["data"]["cancelRun"]  # type: ignore[index]
    created_at = datetime.fromisoformat(finished["createdAt"])
    finished_at = datetime.fromisoformat(finished["finishedAt"])
    assert created_at >= before, (created_at, before)  # not the moment the socket opened
    stamps = [created_at, finished_at]
    if finished["startedAt"] is not None:
        stamps.insert(1, datetime.fromisoformat(finished["startedAt"]))
    assert stamps == sorted(stamps), finished


async def test_an_agent_deleted_after_a_socket_read_it_is_not_served_again(
    server: Server, settings: Settings, factories: Factories, engine: AsyncEngine
) -> None:
    agent = await factories.agent()
    async with acknowledged_client(server, token(settings, agent["user_id"])) as client:
        first = await operation(client, "1", AGENT, id=str(agent["id"]))
        assert first["data"] == {"agent": {"id": str(agent["id"]), "name": agent["name"]}}
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM agents WHERE id = :id"), {"id": agent["id"]})
        again = await operation(client, "2", AGENT, id=str(agent["id"]))
    assert again["data"] is None or again["data"] == {"agent": None}, again
    errors = again.get("errors") or []
    assert errors and errors[0]["extensions"]["code"] == "NOT_FOUND", again  # type: ignore[index]


async def test_a_user_deactivated_after_the_socket_opened_gets_no_operation(
    server: Server, settings: Settings, factories: Factories, engine: AsyncEngine
) -> None:
    agent = await factories.agent()
    async with acknowledged_client(server, token(settings, agent["user_id"])) as client:
        await operation(client, "1", AGENT, id=str(agent["id"]))
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE users SET is_active = false WHERE id = :id"), {"id": agent["user_id"]}
            )
        await client.subscribe("2", AGENT, {"id": str(agent["id"])})
        closed = None
        try:
            await client.message_for("2")
        except Exception as exc:  # the socket is closed 4403 before the operation runs
            closed = exc
    assert closed is not None and getattr(getattr(closed, "rcvd", None), "code", None) == 4403
