"""The GraphQL-over-HTTP spec's media type, `application/graphql-response+json`.

A client that accepts it (and prefers it to `application/json`) gets it back, and with it the
status codes the spec ties to it: a *request error* — the document does not parse, does not
validate, its variables cannot be coerced, or (Strawberry's own 400s) there is no document or no
such operation — is a 4xx (400) whose body has `errors` and no `data` entry; once execution has
started the answer is 200, `data` included, whatever went wrong in the resolvers. A client that
asks for `application/json` (or sends no Accept header, or `*/*`) keeps the legacy behaviour the
spec allows for that type: 200 with `data: null` for a request error.
"""

from __future__ import annotations

from strawberry.types import ExecutionResult
from strawberry.types.execution import PreExecutionError

GRAPHQL_RESPONSE_JSON = "application/graphql-response+json"
APPLICATION_JSON = "application/json"
CONTENT_TYPE = f"{GRAPHQL_RESPONSE_JSON}; charset=utf-8"


def _media_ranges(accept: str) -> dict[str, float]:
    """`type/subtype` → its best quality in an Accept header (parameters other than q ignored)."""
    ranges: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        if not media:
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0
        media = media.lower()
        ranges[media] = max(quality, ranges.get(media, 0.0))
    return ranges


def prefers_graphql_response_json(accept: str | None) -> bool:
    """Whether the response is `application/graphql-response+json`: the client lists it, and
    ranks it at least as high as `application/json` (no Accept header, or only `*/*`, means
    `application/json`, as the spec says for the transition period)."""
    if not accept:
        return False
    ranges = _media_ranges(accept)
    wanted = ranges.get(GRAPHQL_RESPONSE_JSON, 0.0)
    return wanted > 0.0 and wanted >= ranges.get(APPLICATION_JSON, 0.0)


def is_request_error(result: ExecutionResult) -> bool:
    """Whether the operation failed before execution: parsing and validation (Strawberry's
    `PreExecutionError`, our document guards included) or variable coercion (graphql-core returns
    those with no data and errors without a path; an error raised by a resolver has a path)."""
    if isinstance(result, PreExecutionError):
        return True
    return (
        result.data is None
        and bool(result.errors)
        and all(error.path is None for error in result.errors or ())
    )
