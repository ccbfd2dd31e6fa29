"""GraphQL over HTTP: `application/graphql-response+json` with the spec's status codes, and
`application/json` unchanged for the clients that ask for it (or send no Accept header)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agent_engine.api.graphql_http import prefers_graphql_response_json
from tests.integration.api.support import Api

USER = 43
GRJ = "application/graphql-response+json"

PARSE_ERROR = "{ viewer { "
VALIDATION_ERROR = "{ viewer { noSuchField } }"
COERCION = "query ($id: ID!) { agent(id: $id) { id } }"


async def _post(
    api: Api, body: dict[str, Any], accept: str | None, *, token: bool = True
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api.token(USER)}"} if token else {}
    if accept is not None:
        headers["Accept"] = accept
    return await api.http.post(f"{api.url}/graphql", json=body, headers=headers)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": PARSE_ERROR}, "Syntax Error"),
        ({"query": VALIDATION_ERROR}, "noSuchField"),
        ({"query": COERCION, "variables": {"id": None}}, "$id"),
        ({"query": COERCION}, "$id"),
    ],
    ids=["parse", "validation", "null-variable", "missing-variable"],
)
async def test_a_request_error_is_400_without_data_in_the_spec_media_type(
    api: Api, body: dict[str, Any], message: str
) -> None:
    response = await _post(api, body, GRJ)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith(GRJ)
    payload = response.json()
    assert "data" not in payload
    assert message in payload["errors"][0]["message"]


@pytest.mark.parametrize(
    "accept", [None, "application/json", "*/*", f"application/json, {GRJ};q=0.5"]
)
async def test_application_json_keeps_200_with_data_null(api: Api, accept: str | None) -> None:
    response = await _post(api, {"query": VALIDATION_ERROR}, accept)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    payload = response.json()
    assert payload["data"] is None and "noSuchField" in payload["errors"][0]["message"]


async def test_a_successful_operation_in_the_spec_media_type(api: Api) -> None:
    response = await _post(api, {"query": "{ viewer { user { id } } }"}, f"{GRJ}, application/json")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == f"{GRJ}; charset=utf-8"
    assert response.json() == {"data": {"viewer": {"user": {"id": str(USER)}}}}


async def test_an_error_during_execution_is_200_with_data(api: Api) -> None:
    """Execution started: a resolver's error (here: no token) is a field error, not a request
    error, so the answer keeps `data` and 200."""
    response = await _post(api, {"query": "{ viewer { user { id } } }"}, GRJ, token=False)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(GRJ)
    payload = response.json()
    assert "data" in payload
    assert payload["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_no_document_is_400_in_either_media_type(api: Api) -> None:
    for accept in (GRJ, "application/json"):
        response = await _post(api, {"variables": {}}, accept)
        assert response.status_code == 400, (accept, response.text)
        assert response.headers["content-type"].startswith(accept)
        assert "data" not in response.json()


def test_accept_negotiation() -> None:
    assert prefers_graphql_response_json(GRJ)
    assert prefers_graphql_response_json(f"{GRJ}, application/json;q=0.9")
    assert prefers_graphql_response_json(f"application/json, {GRJ}")  # equal rank: the spec's
    assert not prefers_graphql_response_json(f"application/json, {GRJ};q=0.5")
    assert not prefers_graphql_response_json(f"{GRJ};q=0")
    assert not prefers_graphql_response_json(None)
    assert not prefers_graphql_response_json("*/*")
    assert not prefers_graphql_response_json("application/json")
