"""Errors the client can act on, and the policy that masks everything else.

A resolver raises an `ApiError`; graphql-core copies its `extensions` onto the GraphQL error, so the
client reads `extensions.code`. Anything else that escapes a resolver is a bug or an outage: the
client sees `INTERNAL` with a correlation id, and the log has the traceback under the same id.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from agent_engine.domain.gate import AgentNotStartable
from agent_engine.observability.metrics import GRAPHQL_REQUESTS

logger = logging.getLogger("agent_engine.api")

UNAUTHENTICATED = "UNAUTHENTICATED"
FORBIDDEN = "FORBIDDEN"
NOT_FOUND = "NOT_FOUND"
BAD_USER_INPUT = "BAD_USER_INPUT"
AGENT_NOT_STARTABLE = "AGENT_NOT_STARTABLE"
CONFLICT = "CONFLICT"
# A request body or document over its size limit (HTTP 413).
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
INTERNAL = "INTERNAL"
# Errors of the document itself (syntax, unknown fields, guards); nothing was executed.
GRAPHQL_PARSE_FAILED = "GRAPHQL_PARSE_FAILED"
GRAPHQL_VALIDATION_FAILED = "GRAPHQL_VALIDATION_FAILED"


class ApiError(Exception):
    code: str = INTERNAL

    def __init__(self, message: str, **extensions: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extensions: dict[str, Any] = {"code": self.code, **extensions}


class Unauthenticated(ApiError):
    code = UNAUTHENTICATED

    def __init__(self, message: str = "authentication required: send Authorization: Bearer <JWT>"):
        super().__init__(message)


class Forbidden(ApiError):
    code = FORBIDDEN


class NotFound(ApiError):
    code = NOT_FOUND

    def __init__(self, what: str, ident: object) -> None:
        # The same message for "does not exist" and "not yours": existence is not leaked.
        super().__init__(f"{what} {ident} not found")


class BadUserInput(ApiError):
    code = BAD_USER_INPUT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)
        self.field = field


class StartRefused(ApiError):
    """The start gate's refusal, worded by the domain; `extensions.lock` names the closed lock."""

    code = AGENT_NOT_STARTABLE

    def __init__(self, refusal: AgentNotStartable) -> None:
        super().__init__(f"agent cannot start: {refusal.reason}", lock=refusal.lock.value)
        self.lock = refusal.lock


class Conflict(ApiError):
    code = CONFLICT


# graphql-core's words for a literal or variable its scalar refused (the scalar's exception, e.g.
# Python's refusal of an integer of 5,000 digits, is kept as the original error).
_COERCION = ("Expected value of type ", "Variable '$")


def _is_client_error(error: GraphQLError) -> bool:
    # graphql-core's own errors (syntax, validation, variable coercion) wrap GraphQLErrors.
    return (
        error.original_error is None
        or isinstance(error.original_error, ApiError | GraphQLError)
        or (error.path is None and error.message.startswith(_COERCION))
    )


# The contract's only @oneOf input, and where it sits in the mutation inputs.
_ONE_OF_FIELDS = {"ScheduleInput": "input.schedule"}
_ONE_OF_KEYS = re.compile(r"OneOf Input Object '(\w+)' must specify exactly one key")
_ONE_OF_NULL = re.compile(r"Value for member field '(\w+)' must be non-null")
# Variable coercion: wrong types or missing values in `variables` -- the client's input.
_VARIABLE_VALUE = re.compile(
    r"Variable '\$(\w+)' (?:has invalid value(?: at \.?([\w.\[\]]+))?|got invalid value"
    r"|of (?:required|non-null) type .* (?:was not provided|must not be null))"
)


def _document_error_extensions(error: GraphQLError) -> dict[str, Any]:
    """Code (and the field, for input errors) of an error graphql-core raised for a document."""
    message = error.message
    if message.startswith("Syntax Error"):
        return {"code": GRAPHQL_PARSE_FAILED}
    if found := _ONE_OF_KEYS.search(message):
        return {"code": BAD_USER_INPUT, "field": _ONE_OF_FIELDS.get(found.group(1), "input")}
    if found := _ONE_OF_NULL.search(message):
        return {"code": BAD_USER_INPUT, "field": f"input.schedule.{found.group(1)}"}
    if found := _VARIABLE_VALUE.match(message):
        path = found.group(2)
        return {
            "code": BAD_USER_INPUT,
            "field": f"{found.group(1)}.{path}" if path else found.group(1),
        }
    return {"code": GRAPHQL_VALIDATION_FAILED}


def client_error(error: GraphQLError) -> GraphQLError:
    """The error as the client sees it: a code on every error, unexpected ones masked and logged
    with a correlation id."""
    if _is_client_error(error):
        if not (error.extensions or {}).get("code"):
            error.extensions = {**(error.extensions or {}), **_document_error_extensions(error)}
        return error
    correlation_id = uuid.uuid4().hex
    logger.error(
        "unexpected error %s at %s",
        correlation_id,
        ".".join(str(p) for p in error.path or ()),
        exc_info=error.original_error,
        extra={"correlation_id": correlation_id},
    )
    return GraphQLError(
        f"internal error (correlation id {correlation_id})",
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        extensions={"code": INTERNAL, "correlationId": correlation_id},
    )


def stray_cancellation(error: BaseException) -> dict[str, Any]:
    """The answer to an operation that a `CancelledError` ended although its request was not
    cancelled (a shared awaitable cancelled by another consumer): an INTERNAL error with a
    correlation id, in a GraphQL body, never a plain-text HTTP 500."""
    correlation_id = uuid.uuid4().hex
    logger.error(
        "operation ended by a stray cancellation %s",
        correlation_id,
        exc_info=error,
        extra={"correlation_id": correlation_id},
    )
    message = f"internal error (correlation id {correlation_id})"
    extensions = {"code": INTERNAL, "correlationId": correlation_id}
    return {"data": None, "errors": [{"message": message, "extensions": extensions}]}


# graphql-core's hints ("Did you mean 'agent'?") map the schema field by field: signed-in
# callers keep them (GraphiQL), anonymous ones do not (validation hides them; this catches those
# of variable coercion, which graphql-core adds at execution).
_SUGGESTION = re.compile(r" Did you mean .*\?$", re.DOTALL)


def without_suggestions(error: GraphQLError) -> GraphQLError:
    if (hint := _SUGGESTION.search(error.message)) is None:
        return error
    return GraphQLError(
        error.message[: hint.start()],
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=error.original_error,
        extensions=error.extensions,
    )


class ErrorPolicy(SchemaExtension):
    """Gives every error a code; masks unexpected ones and logs them with a correlation id."""

    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        errors = getattr(result, "errors", None)
        GRAPHQL_REQUESTS.labels(outcome="error" if errors else "ok").inc()
        if result is None or not errors:
            return
        anonymous = getattr(self.execution_context.context, "viewer", None) is None
        result.errors = [
            client_error(without_suggestions(error) if anonymous else error) for error in errors
        ]

    def on_stream_result(self, result: Any) -> Iterator[None]:
        # Over WebSocket each subscription event (and each query) is a result of its own; the
        # operation hook above only sees the stream end.
        errors = getattr(result, "errors", None)
        if errors:
            result.errors = [client_error(error) for error in errors]
        yield
