"""Pause notes, the audit log of admin actions, and the retention setting, over HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api.support import FIXED_NOW, Api, codes, error
from tests.support.factories import Factories

ADMIN = 910
OTHER_ADMIN = 911

PAUSE = """mutation($a: ID!, $p: Boolean!, $n: String) {
  setAdminPaused(agentId: $a, paused: $p, note: $n) { status adminPauseNote } }"""
AUDIT = """query($first: Int!, $after: String, $agent: ID, $user: ID, $actor: ID) {
  adminAuditLog(first: $first, after: $after, agentId: $agent, userId: $user, actorId: $actor) {
    edges { cursor node { id at action agentId userId details actor { id displayName } } }
    pageInfo { hasNextPage endCursor } } }"""
SETTINGS = """mutation($input: PlatformSettingsInput!) { updatePlatformSettings(input: $input) {
  weeklyTokenCap timezone runRetentionDays } }"""


async def audit_log(api: Api, token: str, **variables: Any) -> list[dict[str, Any]]:
    data = await api.data(AUDIT, {"first": 100, **variables}, token=token)
    return [edge["node"] for edge in data["adminAuditLog"]["edges"]]


async def test_the_pause_note_is_shown_to_the_owner_until_unpaused(
    api: Api, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"])
    ident = str(agent["id"])
    read = "query($a: ID!) { agent(id: $a) { status adminPauseNote } }"

    note = "policy review, see ticket 42"
    await api.data(PAUSE, {"a": ident, "p": True, "n": note}, as_user=ADMIN, admin=True)
    assert (await api.data(read, {"a": ident}, as_user=owner["id"]))["agent"] == {
        "status": "ADMIN_PAUSED",
        "adminPauseNote": note,
    }
    # Paused again without a note: the old note does not linger.
    await api.data(PAUSE, {"a": ident, "p": True}, as_user=ADMIN, admin=True)
    assert (await api.data(read, {"a": ident}, as_user=owner["id"]))["agent"][
        "adminPauseNote"
    ] is None
    await api.data(
        PAUSE, {"a": ident, "p": True, "n": "  second look  "}, as_user=ADMIN, admin=True
    )
    assert (await api.data(read, {"a": ident}, as_user=owner["id"]))["agent"][
        "adminPauseNote"
    ] == "second look"

    unpaused = (await api.data(PAUSE, {"a": ident, "p": False}, as_user=ADMIN, admin=True))[
        "setAdminPaused"
    ]
    assert unpaused == {"status": "MANUAL", "adminPauseNote": None}

    too_long = await api.body(
        PAUSE, {"a": ident, "p": True, "n": "x" * 501}, as_user=ADMIN, admin=True
    )
    assert codes(too_long) == ["BAD_USER_INPUT"]
    assert error(too_long)["extensions"]["field"] == "note"
    assert (await api.data(read, {"a": ident}, as_user=owner["id"]))["agent"]["status"] == "MANUAL"
    exactly = await api.data(
        PAUSE, {"a": ident, "p": True, "n": "y" * 500}, as_user=ADMIN, admin=True
    )
    assert exactly["setAdminPaused"]["adminPauseNote"] == "y" * 500
    # Owners cannot touch the lock, note or not.
    refused = await api.body(PAUSE, {"a": ident, "p": False, "n": "mine"}, as_user=owner["id"])
    assert codes(refused) == ["FORBIDDEN"]


async def test_every_admin_action_is_recorded_with_actor_time_and_details(
    api: Api, factories: Factories
) -> None:
    owner = await factories.user(display_name="Olive Owner")
    await factories.user(ADMIN, display_name="Ada Admin")
    agent = await factories.agent(user_id=owner["id"], name="Digest")
    doomed = await factories.agent(user_id=owner["id"], name="Old digest")
    tool = await factories.tool("stock_prices", agents_allowed=False)
    admin = api.token(ADMIN, admin=True, name="Ada Admin")

    await api.data(PAUSE, {"a": str(agent["id"]), "p": True, "n": "ticket 42"}, token=admin)
    await api.data(PAUSE, {"a": str(agent["id"]), "p": False, "n": "resolved"}, token=admin)
    await api.data(
        "mutation($a: ID!) { deleteAgent(id: $a) }", {"a": str(doomed["id"])}, token=admin
    )
    upsert = "mutation($i: AgentModelInput!) { upsertAgentModel(input: $i) { id } }"
    model_id = (
        await api.data(
            upsert,
            {
                "i": {
                    "name": "GPT",
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "baseUrl": "https://llm.example.com/v1",
                    "apiKeyEnv": "OPENAI_API_KEY",
                }
            },
            token=admin,
        )
    )["upsertAgentModel"]["id"]
    await api.data(
        upsert,
        {"i": {"id": model_id, "name": "GPT mini", "provider": "openai", "model": "gpt-4o-mini"}},
        token=admin,
    )
    await api.data("mutation($m: ID!) { removeAgentModel(id: $m) }", {"m": model_id}, token=admin)
    toggle = "mutation($t: ID!, $on: Boolean!) { setToolAllowed(toolId: $t, allowed: $on) { id } }"
    await api.data(toggle, {"t": str(tool["id"]), "on": True}, token=admin)
    await api.data(toggle, {"t": str(tool["id"]), "on": False}, token=admin)
    await api.data(
        SETTINGS, {"input": {"weeklyTokenCap": 5000, "runRetentionDays": 90}}, token=admin
    )
    await api.data(
        "mutation($u: ID!) { deactivateOwner(userId: $u) }", {"u": str(owner["id"])}, token=admin
    )

    entries = await audit_log(api, admin)
    assert [e["action"] for e in entries] == [
        "user.deactivated",
        "settings.updated",
        "tool.disallowed",
        "tool.allowed",
        "model.removed",
        "model.upserted",
        "model.upserted",
        "agent.deleted",
        "agent.admin_unpaused",
        "agent.admin_paused",
    ]
    assert {e["actor"]["id"] for e in entries} == {str(ADMIN)}
    assert {e["actor"]["displayName"] for e in entries} == {"Ada Admin"}
    times = [datetime.fromisoformat(e["at"]) for e in entries]
    assert all(t.tzinfo is not None for t in times)
    assert times == sorted(times, reverse=True)
    by_action = {e["action"]: e for e in reversed(entries)}  # the last of each action wins

    paused = entries[-1]
    assert paused["agentId"] == str(agent["id"]) and paused["userId"] == str(owner["id"])
    assert paused["details"]["note"] == "ticket 42"
    unpaused = by_action["agent.admin_unpaused"]
    assert unpaused["details"]["previousNote"] == "ticket 42"
    assert unpaused["details"]["note"] == "resolved"
    deleted = by_action["agent.deleted"]
    assert deleted["agentId"] == str(doomed["id"])
    assert deleted["details"]["agentName"] == "Old digest"
    created, updated = entries[6], entries[5]
    assert created["details"]["created"] is True
    assert created["details"]["model"]["baseUrl"] == "https://llm.example.com/v1"
    assert updated["details"]["changes"]["name"] == {"old": "GPT", "new": "GPT mini"}
    assert by_action["tool.disallowed"]["details"]["name"] == "stock_prices"
    assert by_action["settings.updated"]["details"] == {
        "weeklyTokenCap": {"old": None, "new": 5000},
        "runRetentionDays": {"old": None, "new": 90},
    }
    deactivated = by_action["user.deactivated"]
    assert deactivated["userId"] == str(owner["id"])
    assert deactivated["details"]["agentsSwitchedOff"] == [agent["id"]]


async def test_owners_own_actions_are_not_audited(api: Api, factories: Factories) -> None:
    owner = await factories.user()
    await factories.model(is_default=True)
    created = await api.data(
        'mutation { createAgent(input: { name: "Mine", prompt: "p" }) { id } }',
        None,
        as_user=owner["id"],
    )
    ident = created["createAgent"]["id"]
    await api.data(
        'mutation($a: ID!) { updateAgent(id: $a, input: { name: "Renamed" }) { id } }',
        {"a": ident},
        as_user=owner["id"],
    )
    await api.data("mutation($a: ID!) { deleteAgent(id: $a) }", {"a": ident}, as_user=owner["id"])
    # An admin deleting their own agent is an owner's action too.
    admin = api.token(ADMIN, admin=True)
    admin_agent = await api.data(
        'mutation { createAgent(input: { name: "Admin own", prompt: "p" }) { id } }',
        None,
        token=admin,
    )
    await api.data(
        "mutation($a: ID!) { deleteAgent(id: $a) }",
        {"a": admin_agent["createAgent"]["id"]},
        token=admin,
    )
    assert await audit_log(api, admin) == []


async def test_refused_and_rolled_back_actions_leave_no_entry(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    admin = api.token(ADMIN, admin=True)
    # Refused before anything was written.
    assert codes(await api.body(PAUSE, {"a": "424242", "p": True}, token=admin)) == ["NOT_FOUND"]
    assert codes(await api.body(SETTINGS, {"input": {"runRetentionDays": 0}}, token=admin)) == [
        "BAD_USER_INPUT"
    ]
    # Written, then rolled back: a new organisation zone re-slots the calendar agents of owners
    # without a zone of their own in the same transaction; a database that refuses that write
    # (here a trigger) fails it after the settings and their audit entry were written.
    zoneless = await factories.user(timezone=None)
    await factories.agent(
        user_id=zoneless["id"],
        schedule={"type": "calendar", "cadence": "daily", "time": "09:00"},
        next_run_at=FIXED_NOW + timedelta(hours=1),
    )
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse_reslot() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_reslot BEFORE UPDATE OF next_run_at ON agents"
                " FOR EACH ROW EXECUTE FUNCTION refuse_reslot()"
            )
        )
    failed = await api.body(SETTINGS, {"input": {"timezone": "Europe/Berlin"}}, token=admin)
    assert codes(failed) == ["INTERNAL"]
    current = await api.data("{ platformSettings { timezone } }", None, token=admin)
    assert current["platformSettings"]["timezone"] == "UTC"
    assert await audit_log(api, admin) == []
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM audit_log"))).scalar_one() == 0
    # The same change once the database accepts it: applied, and recorded.
    async with engine.begin() as conn:
        await conn.execute(text("DROP TRIGGER refuse_reslot ON agents"))
    await api.data(SETTINGS, {"input": {"timezone": "Europe/Berlin"}}, token=admin)
    [entry] = await audit_log(api, admin)
    assert entry["details"] == {"timezone": {"old": "UTC", "new": "Europe/Berlin"}}


async def test_the_log_filters_by_agent_user_and_actor_and_pages_newest_first(
    api: Api, factories: Factories
) -> None:
    first_owner, second_owner = await factories.user(), await factories.user()
    a1 = await factories.agent(user_id=first_owner["id"])
    a2 = await factories.agent(user_id=second_owner["id"])
    admin, other_admin = api.token(ADMIN, admin=True), api.token(OTHER_ADMIN, admin=True)
    for agent, token in ((a1, admin), (a2, admin), (a1, other_admin), (a2, other_admin)):
        await api.data(
            PAUSE, {"a": str(agent["id"]), "p": True, "n": f"by {token[-6:]}"}, token=token
        )

    everything = await audit_log(api, admin)
    assert len(everything) == 4
    assert [int(e["id"]) for e in everything] == sorted(
        (int(e["id"]) for e in everything), reverse=True
    )
    on_a1 = await audit_log(api, admin, agent=str(a1["id"]))
    assert {e["agentId"] for e in on_a1} == {str(a1["id"])} and len(on_a1) == 2
    for_second = await audit_log(api, admin, user=str(second_owner["id"]))
    assert {e["agentId"] for e in for_second} == {str(a2["id"])} and len(for_second) == 2
    by_other = await audit_log(api, admin, actor=str(OTHER_ADMIN))
    assert [e["id"] for e in by_other] == [e["id"] for e in everything[:2]]

    page = (await api.data(AUDIT, {"first": 3}, token=admin))["adminAuditLog"]
    assert page["pageInfo"]["hasNextPage"] is True
    rest = (
        await api.data(AUDIT, {"first": 3, "after": page["pageInfo"]["endCursor"]}, token=admin)
    )["adminAuditLog"]
    assert rest["pageInfo"]["hasNextPage"] is False
    assert [e["node"]["id"] for e in page["edges"] + rest["edges"]] == [e["id"] for e in everything]
    bad_cursor = await api.body(AUDIT, {"first": 3, "after": "not-a-cursor"}, token=admin)
    assert error(bad_cursor)["extensions"]["field"] == "after"


async def test_the_log_is_for_admins_only(api: Api, factories: Factories) -> None:
    owner = await factories.user()
    body = await api.body(AUDIT, {"first": 5}, as_user=owner["id"])
    assert codes(body) == ["FORBIDDEN"]


async def test_the_log_is_append_only(api: Api, factories: Factories, engine: AsyncEngine) -> None:
    agent = await factories.agent()
    await api.data(PAUSE, {"a": str(agent["id"]), "p": True}, as_user=ADMIN, admin=True)
    for statement in (
        "UPDATE audit_log SET action = 'nothing.happened'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            async with engine.begin() as conn:
                await conn.execute(text(statement))
    async with engine.connect() as conn:
        actions = (await conn.execute(text("SELECT action FROM audit_log"))).scalars().all()
    assert actions == ["agent.admin_paused"]


@pytest.mark.parametrize("days", [0, -3, 3651])
async def test_run_retention_days_out_of_range_is_bad_input(api: Api, days: int) -> None:
    body = await api.body(
        SETTINGS, {"input": {"runRetentionDays": days}}, as_user=ADMIN, admin=True
    )
    assert codes(body) == ["BAD_USER_INPUT"]
    assert error(body)["extensions"]["field"] == "input.runRetentionDays"


async def test_run_retention_days_is_set_kept_and_cleared(api: Api) -> None:
    assert (
        await api.data(SETTINGS, {"input": {"runRetentionDays": 1}}, as_user=ADMIN, admin=True)
    )["updatePlatformSettings"]["runRetentionDays"] == 1
    kept = await api.data(SETTINGS, {"input": {"weeklyTokenCap": 10}}, as_user=ADMIN, admin=True)
    assert kept["updatePlatformSettings"]["runRetentionDays"] == 1
    read = await api.data(
        "{ platformSettings { runRetentionDays } }", None, as_user=ADMIN, admin=True
    )
    assert read["platformSettings"]["runRetentionDays"] == 1
    cleared = await api.data(
        SETTINGS, {"input": {"runRetentionDays": None}}, as_user=ADMIN, admin=True
    )
    assert cleared["updatePlatformSettings"]["runRetentionDays"] is None
    top = await api.data(SETTINGS, {"input": {"runRetentionDays": 3650}}, as_user=ADMIN, admin=True)
    assert top["updatePlatformSettings"]["runRetentionDays"] == 3650


async def test_reactivation_cancels_and_delivery_targets_are_audited_but_owners_own_cancel_is_not(
    api: Api, factories: Factories
) -> None:
    owner = await factories.user()
    await factories.user(ADMIN)
    agent = await factories.agent(user_id=owner["id"])
    admin = api.token(ADMIN, admin=True)
    cancel = "mutation($r: ID!) { cancelRun(runId: $r) { state reason } }"
    by_admin = await factories.run(agent["id"], state="queued")
    await api.data(cancel, {"r": str(by_admin["id"])}, token=admin)
    by_owner = await factories.run(agent["id"], state="queued")
    await api.data(cancel, {"r": str(by_owner["id"])}, as_user=owner["id"])
    await api.data(
        "mutation($u: ID!) { deactivateOwner(userId: $u) }", {"u": str(owner["id"])}, token=admin
    )
    await api.data(
        "mutation($u: ID!) { reactivateOwner(userId: $u) { active } }",
        {"u": str(owner["id"])},
        token=admin,
    )
    target = (
        await api.data(
            """mutation($i: DeliveryTargetInput!) { upsertDeliveryTarget(input: $i) { id } }""",
            {
                "i": {
                    "name": "Digest inbox",
                    "url": "https://hooks.example.com/agent",
                    "secretEnv": "DIGEST_WEBHOOK_SECRET",
                }
            },
            token=admin,
        )
    )["upsertDeliveryTarget"]["id"]
    await api.data("mutation($t: ID!) { removeDeliveryTarget(id: $t) }", {"t": target}, token=admin)

    entries = await audit_log(api, admin)
    actions = [e["action"] for e in entries]
    assert actions[:5] == [
        "delivery_target.removed",
        "delivery_target.upserted",
        "user.reactivated",
        "user.deactivated",
        "run.cancelled",
    ]
    assert actions.count("run.cancelled") == 1  # the owner's own cancel is not an admin action
    cancelled = entries[4]
    assert cancelled["details"]["runId"] == str(by_admin["id"])
    assert (cancelled["agentId"], cancelled["userId"]) == (str(agent["id"]), str(owner["id"]))
    upserted = entries[1]["details"]
    assert upserted["secretEnv"] == "DIGEST_WEBHOOK_SECRET"
    assert upserted["url"] == "https://hooks.example.com/agent"
    assert entries[0]["details"] == {"targetId": target}
