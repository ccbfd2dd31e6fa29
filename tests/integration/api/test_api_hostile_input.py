"""What a caller without a token (or with one) can send that the API must refuse clearly: documents
over the size limit, JSON nested past any parser, ids and cursors of any length, NUL characters,
dates at the calendar's edges. Each is a 4xx or BAD_USER_INPUT naming the limit or the field,
never INTERNAL, and none changes what is stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.support import Api, codes, error
from tests.support.factories import Factories

OWNER = 61
ADMIN = 62
CREATE = "mutation($input: CreateAgentInput!) { createAgent(input: $input) { id } }"


def bad_input_field(body: dict[str, Any]) -> str:
    """The field a single BAD_USER_INPUT error names (and nothing was answered)."""
    first = error(body)
    assert first["extensions"]["code"] == "BAD_USER_INPUT", body
    assert all(value is None for value in (body.get("data") or {}).values()), body
    field: str = first["extensions"]["field"]
    return field


async def test_a_document_over_the_limit_is_refused_before_parsing(api: Api) -> None:
    limit = api.settings.max_document_bytes
    # The attack of the review: a tiny query and a comment that makes the document unique and big.
    document = "{__typename} #unique😀" + "x" * limit
    for token in (None, api.token(OWNER)):
        response = await api.post(document, token=token)
        assert response.status_code == 413, response.text
        first = response.json()["errors"][0]
        assert first["extensions"]["code"] == "PAYLOAD_TOO_LARGE"
        assert str(limit) in first["message"] and "document" in first["message"]
    # Just under the limit is a document like any other.
    fits = "{__typename} #" + "x" * (limit - 100)
    assert (await api.body(fits)) == {"data": {"__typename": "Query"}}


@pytest.mark.parametrize("depth", [100_000, 5_000, 900])
async def test_json_nested_deeper_than_the_parser_goes_is_a_400(api: Api, depth: int) -> None:
    for body in (
        "[" * depth + "]" * depth,
        '{"query": "{ __typename }", "variables": {"x": ' + "[" * depth + "]" * depth + "}}",
    ):
        response = await api.http.post(
            f"{api.url}/graphql",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 400, response.text[:300]
        assert "nested deeper" in response.json()["errors"][0]["message"]
    if depth <= 5_000:  # within the URL lengths clients send
        response = await api.http.get(
            f"{api.url}/graphql",
            params={"query": "{ __typename }", "variables": "[" * depth + "]" * depth},
        )
        assert response.status_code == 400, response.text[:300]


async def test_suggestions_are_for_signed_in_callers_only(api: Api) -> None:
    anonymous = await api.body("{ agnt(id: 1) { id } }")
    assert codes(anonymous) == ["GRAPHQL_VALIDATION_FAILED"]
    assert "Did you mean" not in str(anonymous), anonymous
    assert "agnt" in anonymous["errors"][0]["message"]
    signed_in = await api.body("{ agnt(id: 1) { id } }", as_user=OWNER)
    assert "Did you mean 'agent'" in signed_in["errors"][0]["message"], signed_in
    # Variable coercion hints (an enum value) too.
    query = 'mutation($c: Cadence!) { createAgent(input: {name: "n", prompt: "p",'
    query += ' schedule: {calendar: {cadence: $c, time: "09:00"}}}) { id } }'
    anonymous = await api.body(query, {"c": "WEEKLYY"})
    assert anonymous["errors"] and "Did you mean" not in str(anonymous), anonymous
    signed_in = await api.body(query, {"c": "WEEKLYY"}, as_user=OWNER)
    assert "Did you mean" in str(signed_in), signed_in


async def test_ids_and_cursors_of_any_length_are_bad_user_input(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    token = api.token(OWNER)
    nines = "9" * 5_000
    body = await api.body(f'{{ run(id: "{nines}") {{ id }} }}', token=token)
    assert bad_input_field(body) == "id"
    body = await api.body("query($id: ID!) { agent(id: $id) { id } }", {"id": nines}, token=token)
    assert bad_input_field(body) == "id"
    body = await api.body(
        "mutation($id: ID!) { startRun(agentId: $id) { id } }", {"id": "1" + "0" * 40}, token=token
    )
    assert bad_input_field(body) == "agentId"
    agent = await factories.agent(user_id=OWNER)
    for cursor in ("A" * 10_000, "%%%garbage%%%", "cnVuOjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5"):
        body = await api.body(
            "query($id: ID!, $after: String) {"
            " agent(id: $id) { runs(after: $after) { edges { cursor } } } }",
            {"id": str(agent["id"]), "after": cursor},
            token=token,
        )
        assert bad_input_field(body) == "after", cursor[:20]
        body = await api.body(
            "query($after: String) { adminAuditLog(after: $after) { edges { cursor } } }",
            {"after": cursor},
            as_user=ADMIN,
            admin=True,
        )
        assert bad_input_field(body) == "after", cursor[:20]
    # An integer literal far past 32 bits is the document's error, not the server's.
    body = await api.body("{ adminRuns(first: " + nines + ") { edges { cursor } } }", token=token)
    assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"], body
    response = await api.http.post(
        f"{api.url}/graphql",
        content='{"query": "query($n: Int!) { adminRuns(first: $n) { edges { cursor } } }",'
        ' "variables": {"n": ' + nines + "}}",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 400, response.text[:300]


NUL_INPUTS = [
    ({"name": "a\x00b", "prompt": "p"}, "input.name"),
    ({"name": "n", "prompt": "u\x00" * 3}, "input.prompt"),
    ({"name": "n", "prompt": "p", "description": "\x00"}, "input.description"),
    ({"name": "n", "prompt": "p", "meta": {"k": "v\x00"}}, "input.meta.k"),
    ({"name": "n", "prompt": "p", "meta": {"deep": [{"k\x00": 1}]}}, "input.meta.deep"),
]


@pytest.mark.parametrize(("fields", "field"), NUL_INPUTS)
async def test_a_nul_character_in_any_text_is_bad_user_input_naming_the_field(
    api: Api, factories: Factories, fields: dict[str, Any], field: str
) -> None:
    await factories.user(id=OWNER)
    body = await api.body(CREATE, {"input": fields}, as_user=OWNER)
    assert bad_input_field(body) == field
    assert "NUL" in body["errors"][0]["message"]
    # The same in a literal of the document.
    literal = 'mutation { createAgent(input: {name: "n", prompt: "u\\u0000x"}) { id } }'
    for _ in range(2):  # the second time too (a document refused is never cached as valid)
        assert bad_input_field(await api.body(literal, as_user=OWNER)) == "input.prompt"
    assert (await api.data("{ viewer { agents { id } } }", as_user=OWNER)) == {
        "viewer": {"agents": []}
    }


async def test_a_nul_in_an_admin_note_is_bad_user_input(api: Api, factories: Factories) -> None:
    await factories.user(id=OWNER)
    agent = await factories.agent(user_id=OWNER)
    body = await api.body(
        "mutation($id: ID!, $note: String) {"
        " setAdminPaused(agentId: $id, paused: true, note: $note) { id } }",
        {"id": str(agent["id"]), "note": "see\x00ticket"},
        as_user=ADMIN,
        admin=True,
    )
    assert bad_input_field(body) == "note"


@pytest.mark.parametrize(
    "instant",
    [
        "0001-01-01T00:00:01Z",
        "0001-01-01T00:00:00+14:00",
        "0001-01-03T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-14:00",
        "9999-12-20T00:00:00Z",
    ],
)
async def test_dates_at_the_calendars_edges_are_bad_user_input(api: Api, instant: str) -> None:
    body = await api.body(
        "query($at: DateTime) { adminSpend(windowStart: $at) { tokens } }",
        {"at": instant},
        as_user=ADMIN,
        admin=True,
    )
    assert bad_input_field(body) == "windowStart", body
    assert "between" in body["errors"][0]["message"]
    literal = await api.body(
        f'{{ adminSpend(windowStart: "{instant}") {{ tokens }} }}',
        as_user=ADMIN,
        admin=True,
    )
    assert bad_input_field(literal) == "windowStart", literal


@pytest.mark.parametrize("claim", ["email", "name"])
async def test_a_nul_in_a_signed_claim_is_unauthenticated_not_internal(
    api: Api, factories: Factories, claim: str
) -> None:
    """A token signed by whoever holds the key (or an identity provider's user who typed one)
    whose text claim holds NUL: the users row could not store it, so the token is refused."""
    await factories.user(id=OWNER, email="kim@example.com")
    bearer = api.token(OWNER, **{claim: "kim\x00@example.com"})
    body = await api.body("{ viewer { user { id email } } }", token=bearer)
    assert codes(body) == ["UNAUTHENTICATED"], body
    message = body["errors"][0]["message"]
    assert f"`{claim}`" in message and "NUL" in message
    # Nothing stored changed, and the same user with a clean token is served.
    fine = await api.data("{ viewer { user { id email } } }", as_user=OWNER)
    assert fine == {"viewer": {"user": {"id": str(OWNER), "email": "kim@example.com"}}}
