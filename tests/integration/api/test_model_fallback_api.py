"""AgentModel.fallbackModel and AgentModelInput.fallbackModelId: set, kept, cleared, refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import Api, codes, error
from tests.support.factories import Factories

ADMIN = 900
UPSERT = """mutation($input: AgentModelInput!) { upsertAgentModel(input: $input) {
    id name fallbackModel { id name fallbackModel { id } } } }"""


async def upsert(api: Api, **input: Any) -> dict[str, Any]:
    body = {"provider": "builtin", "model": "digest", **input}
    return (await api.data(UPSERT, {"input": body}, as_user=ADMIN, admin=True))["upsertAgentModel"]


async def refused(api: Api, **input: Any) -> dict[str, Any]:
    body = {"provider": "builtin", "model": "digest", **input}
    answer = await api.body(UPSERT, {"input": body}, as_user=ADMIN, admin=True)
    assert codes(answer) == ["BAD_USER_INPUT"], answer
    found: dict[str, Any] = error(answer)
    assert found["extensions"]["field"] == "input.fallbackModelId"
    return found


async def test_a_fallback_is_set_shown_to_everyone_kept_when_absent_and_cleared_by_null(
    api: Api, factories: Factories
) -> None:
    backup = await upsert(api, name="Backup")
    primary = await upsert(api, name="Primary", fallbackModelId=backup["id"])
    assert primary["fallbackModel"] == {"id": backup["id"], "name": "Backup", "fallbackModel": None}

    renamed = await upsert(api, id=primary["id"], name="Primary 2")  # absent: unchanged
    assert renamed["fallbackModel"]["id"] == backup["id"]

    owner = await factories.user()
    seen = await api.data(
        "{ agentModels { name fallbackModel { name } } }", None, as_user=owner["id"]
    )
    assert {"name": "Primary 2", "fallbackModel": {"name": "Backup"}} in seen["agentModels"]

    cleared = await upsert(api, id=primary["id"], name="Primary 2", fallbackModelId=None)
    assert cleared["fallbackModel"] is None


async def test_a_fallback_must_be_another_model_of_the_list(api: Api) -> None:
    model = await upsert(api, name="Alone")
    own = await refused(api, id=model["id"], name="Alone", fallbackModelId=model["id"])
    assert "another model" in own["message"]
    gone = await refused(api, id=model["id"], name="Alone", fallbackModelId="987654")
    assert "no model 987654" in gone["message"]
    junk = await api.body(
        UPSERT,
        {"input": {"name": "x", "provider": "builtin", "model": "d", "fallbackModelId": "abc"}},
        as_user=ADMIN,
        admin=True,
    )
    assert codes(junk) == ["BAD_USER_INPUT"]


async def test_a_chain_that_comes_back_is_refused_naming_the_field(api: Api) -> None:
    a = await upsert(api, name="A")
    b = await upsert(api, name="B", fallbackModelId=a["id"])
    c = await upsert(api, name="C", fallbackModelId=b["id"])
    # A -> C would make A -> C -> B -> A.
    found = await refused(api, id=a["id"], name="A", fallbackModelId=c["id"])
    assert "comes back" in found["message"]
    after = await api.data(
        "{ agentModels { id fallbackModel { id } } }", None, as_user=ADMIN, admin=True
    )
    chain = {m["id"]: (m["fallbackModel"] or {}).get("id") for m in after["agentModels"]}
    assert chain[a["id"]] is None  # nothing was written


async def test_removing_a_model_clears_the_fallbacks_pointing_at_it(api: Api) -> None:
    backup = await upsert(api, name="Backup")
    primary = await upsert(api, name="Primary", fallbackModelId=backup["id"])
    await api.data(
        "mutation($id: ID!) { removeAgentModel(id: $id) }",
        {"id": backup["id"]},
        as_user=ADMIN,
        admin=True,
    )
    models = await api.data(
        "{ agentModels { id fallbackModel { id } } }", None, as_user=ADMIN, admin=True
    )
    assert models["agentModels"] == [{"id": primary["id"], "fallbackModel": None}]


async def test_two_writers_closing_a_loop_from_both_ends_cannot_both_win(
    engine: AsyncEngine, factories: Factories
) -> None:
    """The database settles it: the second writer waits for the first, then sees the cycle."""
    a = (await factories.model(name="A"))["id"]
    b = (await factories.model(name="B"))["id"]
    set_fallback = text("UPDATE agent_models SET fallback_model_id = :f WHERE id = :id")
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        await second.begin()
        await first.execute(set_fallback, {"id": a, "f": b})
        racing = asyncio.create_task(second.execute(set_fallback, {"id": b, "f": a}))
        await asyncio.sleep(0.3)
        assert not racing.done()  # waiting for the first writer's lock
        await first.commit()
        with pytest.raises(IntegrityError, match="comes back"):
            await racing
        await second.rollback()
    async with engine.connect() as conn:
        rows = dict(
            (await conn.execute(text("SELECT id, fallback_model_id FROM agent_models"))).all()
        )
    assert rows == {a: b, b: None}


async def test_a_changed_fallback_is_audited(api: Api) -> None:
    backup = await upsert(api, name="Backup")
    primary = await upsert(api, name="Primary")
    await upsert(api, id=primary["id"], name="Primary", fallbackModelId=backup["id"])
    await upsert(api, id=primary["id"], name="Primary")  # absent: unchanged, nothing to audit
    log = await api.data(
        "{ adminAuditLog(first: 10) { edges { node { action details } } } }",
        None,
        as_user=ADMIN,
        admin=True,
    )
    entries = [e["node"] for e in log["adminAuditLog"]["edges"]]
    assert [e["action"] for e in entries] == ["model.upserted"] * 4
    unchanged, changed = entries[0], entries[1]
    assert changed["details"]["changes"] == {"fallbackModelId": {"old": None, "new": backup["id"]}}
    assert unchanged["details"]["changes"] == {}
