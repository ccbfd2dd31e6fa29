"""Document and transport guards, token checks and error masking, over HTTP."""

from __future__ import annotations

import logging
import time

import jwt
import pytest

from tests.integration.api.support import Api, codes, error
from tests.support.factories import Factories

USER = 41


async def test_depth_alias_and_token_limits(api: Api) -> None:
    levels = api.settings.max_query_depth + 2
    deep = (
        "{ viewer { agents { " + "lastRun { agent { " * levels + "id" + " } }" * levels + " } } }"
    )
    body = await api.body(deep, None, as_user=USER)
    assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"]
    assert "depth" in body["errors"][0]["message"]
    aliases = "{ " + " ".join(f"a{i}: viewer {{ isAdmin }}" for i in range(31)) + " }"
    body = await api.body(aliases, None, as_user=USER)
    assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"]
    assert "aliases" in body["errors"][0]["message"]
    many_tokens = "{ viewer { " + " ".join(["isAdmin"] * 2100) + " } }"
    body = await api.body(many_tokens, None, as_user=USER)
    assert body["errors"]
    assert "token" in body["errors"][0]["message"].lower()


async def test_batching_is_refused_with_a_clear_error(api: Api) -> None:
    response = await api.http.post(
        f"{api.url}/graphql",
        json=[{"query": "{ __typename }"}, {"query": "{ __typename }"}],
        headers={"Authorization": f"Bearer {api.token(USER)}"},
    )
    assert response.status_code == 400
    assert "batch" in response.json()["errors"][0]["message"]


async def test_get_variables_that_are_not_an_object_are_refused_naming_them(api: Api) -> None:
    response = await api.http.get(
        f"{api.url}/graphql",
        params={"query": "{ __typename }", "variables": "[1, 2]"},
        headers={"Authorization": f"Bearer {api.token(USER)}"},
    )
    assert response.status_code == 400
    message = response.json()["errors"][0]["message"]
    assert "variables" in message and "batch" not in message


async def test_body_size_limit(api: Api) -> None:
    big = "x" * (api.settings.max_body_bytes + 1)
    response = await api.http.post(
        f"{api.url}/graphql",
        content=b'{"query": "{ __typename }", "variables": {"x": "' + big.encode() + b'"}}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(3):
            yield b" " * (api.settings.max_body_bytes // 2)

    response = await api.http.post(
        f"{api.url}/graphql", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413


async def test_introspection_only_for_authenticated_viewers(api: Api) -> None:
    query = "{ __schema { queryType { name } } }"
    body = await api.body(query)
    assert codes(body) == ["UNAUTHENTICATED"]
    assert body.get("data") is None
    data = await api.data(query, None, as_user=USER)
    assert data["__schema"]["queryType"]["name"] == "Query"
    assert (await api.data("{ __typename }"))["__typename"] == "Query"


async def test_a_document_validated_once_is_still_guarded_for_every_caller(api: Api) -> None:
    # Parse and validation are cached per document: an authenticated caller's introspection
    # must not open it to anonymous ones, and a refused document stays refused.
    query = "{ __schema { queryType { name } } }"
    for _ in range(2):
        data = await api.data(query, None, as_user=USER)
        assert data["__schema"]["queryType"]["name"] == "Query"
        body = await api.body(query)
        assert codes(body) == ["UNAUTHENTICATED"]
    aliases = "{ " + " ".join(f"a{i}: viewer {{ isAdmin }}" for i in range(31)) + " }"
    for _ in range(2):
        assert codes(await api.body(aliases, None, as_user=USER)) == ["GRAPHQL_VALIDATION_FAILED"]
    for _ in range(2):
        body = await api.body("{ viewer { isAdmin nope } }", None, as_user=USER)
        assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"]


@pytest.mark.parametrize(
    "make_token, fragment",
    [
        (
            lambda s: jwt.encode({"sub": "1", "exp": int(time.time()) - 120}, s, algorithm="HS256"),
            "expired",
        ),
        (lambda s: jwt.encode({"sub": "1"}, s, algorithm="HS256"), "exp"),
        (
            lambda s: jwt.encode(
                {"sub": "1", "exp": int(time.time()) + 60}, None, algorithm="none"
            ),
            "alg",
        ),
        (
            lambda s: jwt.encode(
                {"sub": "abc", "exp": int(time.time()) + 60}, s, algorithm="HS256"
            ),
            "sub",
        ),
        (
            lambda s: jwt.encode(
                {"sub": "1", "exp": int(time.time()) + 60},
                "another-secret-another-secret-xx",
                algorithm="HS256",
            ),
            "signature",
        ),
        (lambda s: "not-a-jwt", "invalid"),
        # A token good for a year: a leak would be good for a year too.
        (
            lambda s: jwt.encode(
                {"sub": "1", "exp": int(time.time()) + 365 * 86400}, s, algorithm="HS256"
            ),
            "lives too long",
        ),
        (
            lambda s: jwt.encode(
                {"sub": "1", "exp": int(time.time()) + 86400 + 120}, s, algorithm="HS256"
            ),
            "more than 24 h away",
        ),
    ],
)
async def test_bad_tokens_are_unauthenticated(api: Api, make_token, fragment: str) -> None:  # type: ignore[no-untyped-def]
    import warnings

    from jwt.warnings import InsecureKeyLengthWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        token = make_token(api.settings.jwt_secret)
    body = await api.body("{ viewer { isAdmin } }", None, token=token)
    assert codes(body) == ["UNAUTHENTICATED"]
    assert fragment in body["errors"][0]["message"].lower()


async def test_a_token_within_the_lifetime_limit_and_the_leeway_is_accepted(api: Api) -> None:
    now = int(time.time())
    # Just under the 24 h limit, and expired 10 s ago (within the 30 s clock-skew leeway).
    for exp in (now + 86400 - 60, now - 10):
        token = jwt.encode({"sub": "1", "exp": exp}, api.settings.jwt_secret, algorithm="HS256")
        body = await api.body("{ viewer { isAdmin } }", None, token=token)
        assert body.get("errors") is None, body


async def test_malformed_authorization_header(api: Api) -> None:
    response = await api.http.post(
        f"{api.url}/graphql",
        json={"query": "{ viewer { isAdmin } }"},
        headers={"Authorization": "Basic dXNlcjpwYXNz"},
    )
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_roles_claim_grants_admin(api: Api) -> None:
    data = await api.data("{ viewer { isAdmin } }", None, as_user=USER, admin=True)
    assert data["viewer"]["isAdmin"] is True


async def test_unexpected_errors_are_masked_and_logged_with_a_correlation_id(
    api: Api, factories: Factories, caplog: pytest.LogCaptureFixture
) -> None:
    await factories.user(id=USER)
    # A row the code cannot read (not a valid schedule) stands in for a bug.
    agent = await factories.agent(user_id=USER, schedule={"type": "calendar"})
    with caplog.at_level(logging.ERROR, logger="agent_engine.api"):
        body = await api.body(
            "query($id: ID!) { agent(id: $id) { schedule { __typename } } }",
            {"id": str(agent["id"])},
            as_user=USER,
        )
    failure = error(body)
    assert failure["extensions"]["code"] == "INTERNAL"
    correlation_id = failure["extensions"]["correlationId"]
    assert "KeyError" not in failure["message"]
    assert any(correlation_id in record.getMessage() for record in caplog.records)


async def test_unknown_field_is_a_validation_error(api: Api) -> None:
    body = await api.body("{ viewer { nope } }", None, as_user=USER)
    assert codes(body) == ["GRAPHQL_VALIDATION_FAILED"]
    body = await api.body("{ viewer { ", None, as_user=USER)
    assert codes(body) == ["GRAPHQL_PARSE_FAILED"]
