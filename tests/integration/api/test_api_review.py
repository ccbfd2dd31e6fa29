"""Writes keep the database's time, and an admin's pause holds against its owner's delete."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunState
from agent_engine.runs.claim import claim_run, utc_now
from tests.integration.api.support import FIXED_NOW, Api, codes, error
from tests.support.factories import Factories

ADMIN = 71
START = "mutation($id: ID!) { startRun(agentId: $id) { id state createdAt } }"
CANCEL = "mutation($id: ID!) { cancelRun(runId: $id) { state createdAt startedAt finishedAt } }"
DELETE = "mutation($id: ID!) { deleteAgent(id: $id) }"
PAUSE = (
    "mutation($id: ID!, $note: String) {"
    " setAdminPaused(agentId: $id, paused: true, note: $note) { status } }"
)


async def _database_now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        value: datetime = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
    return value


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_a_run_started_and_cancelled_on_an_old_clock_is_stamped_by_the_database(
    api: Api, engine: AsyncEngine, factories: Factories
) -> None:
    # The request's clock is more than a year behind the database (a socket opened long ago).
    assert api.clock.now == FIXED_NOW
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"])
    before = await _database_now(engine)
    run = (await api.data(START, {"id": str(agent["id"])}, as_user=owner["id"]))["startRun"]
    assert run["state"] == "QUEUED"
    claim = await claim_run(engine, int(run["id"]), now=utc_now())
    assert claim.state == RunState.RUNNING
    cancelled = (await api.data(CANCEL, {"id": run["id"]}, as_user=owner["id"]))["cancelRun"]
    after = await _database_now(engine)
    created, started, finished = (
        _instant(cancelled[key]) for key in ("createdAt", "startedAt", "finishedAt")
    )
    assert before <= created <= started <= finished <= after, cancelled
    assert created > FIXED_NOW + timedelta(days=1)


async def test_an_owner_cannot_delete_an_agent_under_review_and_the_admin_can(
    api: Api, engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    await factories.user(ADMIN)
    agent = await factories.agent(user_id=owner["id"], name="Scraper")
    ident = str(agent["id"])
    await api.data(
        PAUSE, {"id": ident, "note": "policy review, ticket 42"}, as_user=ADMIN, admin=True
    )

    refused = await api.body(DELETE, {"id": ident}, as_user=owner["id"])
    assert codes(refused) == ["FORBIDDEN"]
    message = error(refused)["message"]
    assert "paused by an admin" in message and "policy review, ticket 42" in message
    kept = await api.data("{ viewer { agents { id status } } }", None, as_user=owner["id"])
    assert kept["viewer"]["agents"] == [{"id": ident, "status": "ADMIN_PAUSED"}]

    assert (await api.data(DELETE, {"id": ident}, as_user=ADMIN, admin=True))[
        "deleteAgent"
    ] == ident
    gone = await api.data("{ viewer { agents { id } } }", None, as_user=owner["id"])
    assert gone["viewer"]["agents"] == []
    log = await api.data(
        "query($a: ID!) { adminAuditLog(agentId: $a) { edges { node { action actor { id } } } } }",
        {"a": ident},
        as_user=ADMIN,
        admin=True,
    )
    actions = [edge["node"] for edge in log["adminAuditLog"]["edges"]]
    assert actions[0] == {"action": "agent.deleted", "actor": {"id": str(ADMIN)}}, actions


async def test_an_owner_still_deletes_an_agent_that_is_not_paused(
    api: Api, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"])
    ident = str(agent["id"])
    await api.data(
        "mutation($id: ID!) { setAdminPaused(agentId: $id, paused: false) { status } }",
        {"id": ident},
        as_user=ADMIN,
        admin=True,
    )
    assert (await api.data(DELETE, {"id": ident}, as_user=owner["id"]))["deleteAgent"] == ident
