"""The error policy as the client sees it: every error carries a code, input errors name the
field, and anything unexpected is masked behind a correlation id that the log repeats."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import strawberry

from agent_engine.api.errors import (
    AGENT_NOT_STARTABLE,
    BAD_USER_INPUT,
    FORBIDDEN,
    GRAPHQL_PARSE_FAILED,
    GRAPHQL_VALIDATION_FAILED,
    INTERNAL,
    NOT_FOUND,
    UNAUTHENTICATED,
    ApiError,
    BadUserInput,
    ErrorPolicy,
    Forbidden,
    NotFound,
    StartRefused,
    Unauthenticated,
)
from agent_engine.api.schema import build_schema
from agent_engine.domain.gate import AgentNotStartable, Lock

SECRET = "password=hunter2 at db.internal:5432"
CREATE_AGENT = "mutation($i: CreateAgentInput!) { createAgent(input: $i) { id } }"


@strawberry.type
class Query:
    @strawberry.field
    def missing(self) -> int:
        raise NotFound("agent", 7)

    @strawberry.field
    def locked(self) -> int:
        raise StartRefused(AgentNotStartable(7, Lock.ADMIN_PAUSED))

    @strawberry.field
    def broken(self) -> int:
        raise RuntimeError(SECRET)

    @strawberry.field
    def fine(self) -> int:
        return 1


TINY = strawberry.Schema(query=Query, extensions=[ErrorPolicy])


def errors_of(schema: strawberry.Schema, document: str, **variables: Any) -> list[dict[str, Any]]:
    result = schema.execute_sync(document, variable_values=variables or None)
    assert result.errors, result
    return [error.formatted for error in result.errors]


def test_an_api_error_reaches_the_client_with_its_code_and_message() -> None:
    [error] = errors_of(TINY, "{ missing }")
    assert error["message"] == "agent 7 not found"
    assert error["extensions"] == {"code": NOT_FOUND}
    assert error["path"] == ["missing"]
    [error] = errors_of(TINY, "{ locked }")
    assert (
        error["message"]
        == "agent cannot start: the agent is paused by an admin; only an admin can resume it"
    )
    assert error["extensions"] == {"code": AGENT_NOT_STARTABLE, "lock": "ADMIN_PAUSED"}


def test_an_unexpected_error_is_masked_and_logged_under_the_same_correlation_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="agent_engine.api"):
        [error] = errors_of(TINY, "{ fine broken }")
    correlation_id = error["extensions"]["correlationId"]
    assert error["extensions"] == {"code": INTERNAL, "correlationId": correlation_id}
    assert error["message"] == f"internal error (correlation id {correlation_id})"
    assert error["path"] == ["broken"]
    assert SECRET not in str(error)
    [record] = [r for r in caplog.records if r.name == "agent_engine.api"]
    assert correlation_id in record.getMessage()
    assert record.exc_info is not None and SECRET in str(record.exc_info[1])


def test_each_unexpected_error_gets_its_own_correlation_id() -> None:
    first = errors_of(TINY, "{ broken }")[0]["extensions"]["correlationId"]
    second = errors_of(TINY, "{ broken }")[0]["extensions"]["correlationId"]
    assert first != second


def test_a_document_that_does_not_parse_is_parse_failed() -> None:
    [error] = errors_of(TINY, "{ fine ")
    assert error["extensions"] == {"code": GRAPHQL_PARSE_FAILED}
    assert error["message"].startswith("Syntax Error")


def test_a_document_that_does_not_validate_is_validation_failed() -> None:
    [error] = errors_of(TINY, "{ fine nope }")
    assert error["extensions"] == {"code": GRAPHQL_VALIDATION_FAILED}
    assert "nope" in error["message"]


@pytest.fixture(scope="module")
def schema() -> strawberry.Schema:
    return build_schema()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"name": 3, "prompt": "p"}, "i.name"),
        (
            {"name": "a", "prompt": "p", "schedule": {"interval": {"everyHours": "x"}}},
            "i.schedule.interval.everyHours",
        ),
        (
            {"name": "a", "prompt": "p", "schedule": {"calendar": {"time": "09:00"}}},
            "i.schedule.calendar",
        ),
    ],
)
def test_a_variable_of_the_wrong_shape_is_bad_user_input_naming_the_field(
    schema: strawberry.Schema, value: dict[str, Any], field: str
) -> None:
    [error] = errors_of(schema, CREATE_AGENT, i=value)
    assert error["extensions"] == {"code": BAD_USER_INPUT, "field": field}


def test_a_missing_input_field_is_bad_user_input_naming_the_variable_and_the_field(
    schema: strawberry.Schema,
) -> None:
    [error] = errors_of(schema, CREATE_AGENT, i={"name": "a"})
    assert error["extensions"] == {"code": BAD_USER_INPUT, "field": "i"}
    assert "'prompt'" in error["message"]


def test_a_missing_required_variable_is_bad_user_input_naming_it(
    schema: strawberry.Schema,
) -> None:
    [error] = errors_of(
        schema, "query($n: Int!) { adminRuns(first: $n) { pageInfo { hasNextPage } } }"
    )
    assert error["extensions"] == {"code": BAD_USER_INPUT, "field": "n"}


def test_a_schedule_with_no_kind_or_two_kinds_names_the_schedule(
    schema: strawberry.Schema,
) -> None:
    literal = 'mutation { createAgent(input: {name: "a", prompt: "p", schedule: {}}) { id } }'
    [error] = errors_of(schema, literal)
    assert error["extensions"] == {"code": BAD_USER_INPUT, "field": "input.schedule"}
    both = {"interval": {"everyHours": 1}, "calendar": {"cadence": "DAILY", "time": "09:00"}}
    [error] = errors_of(schema, CREATE_AGENT, i={"name": "a", "prompt": "p", "schedule": both})
    assert error["extensions"]["code"] == BAD_USER_INPUT
    assert error["extensions"]["field"].endswith("schedule")


def test_a_null_schedule_kind_in_a_variable_names_that_kind(schema: strawberry.Schema) -> None:
    value = {"name": "a", "prompt": "p", "schedule": {"interval": None}}
    [error] = errors_of(schema, CREATE_AGENT, i=value)
    assert error["extensions"] == {"code": BAD_USER_INPUT, "field": "input.schedule.interval"}


def test_the_error_classes_carry_the_code_and_the_words_a_client_acts_on() -> None:
    assert Unauthenticated().extensions == {"code": UNAUTHENTICATED}
    assert "Authorization: Bearer" in Unauthenticated().message
    assert Forbidden("admins only").extensions == {"code": FORBIDDEN}
    bad = BadUserInput("input.name", "must not be blank")
    assert (bad.message, bad.extensions) == (
        "input.name: must not be blank",
        {"code": BAD_USER_INPUT, "field": "input.name"},
    )
    # "Not yours" reads exactly like "does not exist".
    assert str(NotFound("agent", 7)) == "agent 7 not found"
    assert ApiError("boom").extensions == {"code": INTERNAL}
