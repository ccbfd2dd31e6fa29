"""Limits that keep one client from hurting the others.

Documents: depth, alias, token, field and cost limits (settings; the cost estimate is
`api/cost.py`), introspection for authenticated viewers only; each distinct document is parsed
and validated once per process.
Transport: one operation per request (no batching), a request body size limit.
Input: page sizes and string/JSON sizes, refused as BAD_USER_INPUT naming the field.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    GraphQLError,
    ValidationRule,
    Visitor,
    visit,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from strawberry.extensions import MaxAliasesLimiter, QueryDepthLimiter, SchemaExtension

from agent_engine.api.cost import CostModel, QueryCostLimiter
from agent_engine.api.errors import UNAUTHENTICATED, BadUserInput
from agent_engine.settings import Settings

MAX_PAGE_SIZE = 100
MAX_UPCOMING_RUN_TIMES = 50
NAME_MAX_CHARS = 200
DESCRIPTION_MAX_CHARS = 2_000
PROMPT_MAX_CHARS = 20_000
META_MAX_BYTES = 16 * 1024
MAX_TOOL_IDS = 100
MODEL_FIELD_MAX_CHARS = 200
BASE_URL_MAX_CHARS = 2_000
PLATFORM_PROMPT_MAX_CHARS = 20_000

INTROSPECTION_FIELDS = frozenset({"__schema", "__type"})


# Distinct documents whose parse and validation are kept (per api process, least recently used
# dropped first). Dashboards and frontends send a handful of documents over and over.
DOCUMENT_CACHE_ENTRIES = 1_000


def document_guards(settings: Settings) -> list[Callable[[], SchemaExtension]]:
    """Extension factories (fresh instances per operation) for the configured limits."""
    rules = _GuardRules(
        max_tokens=settings.max_query_tokens,
        max_fields=settings.max_query_fields,
        # Strawberry's limiters build their rule classes in __init__: built once here instead of
        # once per request.
        rules=(
            *QueryDepthLimiter(max_depth=settings.max_query_depth).validation_rules,
            *MaxAliasesLimiter(max_alias_count=settings.max_aliases).validation_rules,
        ),
    )
    return [
        partial(DocumentGuards, rules=rules),
        # After the guards: a cached validation does not skip the cost of this request's pages.
        partial(QueryCostLimiter, max_cost=settings.max_query_cost, model=cost_model(settings)),
    ]


def cost_model(settings: Settings) -> CostModel:
    """List sizes of the cost estimate: pages up to MAX_PAGE_SIZE, `viewer.agents` at the
    agents-per-owner cap, other unpaginated lists at DEFAULT_LIST_CAP."""
    return CostModel(
        max_page_size=MAX_PAGE_SIZE,
        list_caps={("Viewer", "agents"): settings.max_agents_per_owner},
    )


class _GuardRules:
    """The limits, and the documents that passed them (parsed, validated), shared by requests."""

    def __init__(
        self, *, max_tokens: int, max_fields: int, rules: tuple[type[ASTValidationRule], ...]
    ) -> None:
        self.max_tokens = max_tokens
        self.max_fields = max_fields
        self.rules = rules
        self.parsed: OrderedDict[str, DocumentNode] = OrderedDict()
        # (document text, anonymous caller): validation differs only in the introspection rule.
        self.valid: OrderedDict[tuple[str, bool], None] = OrderedDict()

    def remember(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        cache[key] = value
        if len(cache) > DOCUMENT_CACHE_ENTRIES:
            cache.popitem(last=False)


class DocumentGuards(SchemaExtension):
    """Token, depth, alias and field limits and introspection for authenticated viewers only;
    each distinct document is parsed and validated once (then served from a bounded cache).

    Over the field limit, the only validation rule left is the one that says so: thousands of
    (duplicate) fields fit under the token limit but make graphql-core's overlapping-fields rule
    quadratic and recursive; counting first keeps validation cheap and the error clear.
    """

    def __init__(self, *, rules: _GuardRules) -> None:
        self.rules = rules

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        query = context.query
        cached = self.rules.parsed.get(query) if query else None
        if cached is not None:
            self.rules.parsed.move_to_end(query)  # type: ignore[arg-type]
            context.graphql_document = cached
        else:
            context.parse_options["max_tokens"] = self.rules.max_tokens
        yield
        if cached is None and query and context.graphql_document is not None:
            self.rules.remember(self.rules.parsed, query, context.graphql_document)

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        anonymous = getattr(context.context, "viewer", None) is None
        key = (context.query or "", anonymous)
        if context.query and key in self.rules.valid:
            self.rules.valid.move_to_end(key)
            if context.pre_execution_errors is None:
                context.pre_execution_errors = []  # validated before: graphql-core skips it
            yield
            return
        document = context.graphql_document
        counter = _FieldCounter()
        if document is not None:
            visit(document, counter)
        if counter.count > self.rules.max_fields:
            context.validation_rules = (
                _too_many_fields_rule(counter.count, self.rules.max_fields),
            )
        else:
            context.validation_rules = (
                *context.validation_rules,
                *self.rules.rules,
                *((_NoIntrospection,) if anonymous else ()),
            )
        yield
        if context.query and context.pre_execution_errors == []:
            self.rules.remember(self.rules.valid, key, None)


class _FieldCounter(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def enter_field(self, *_args: Any) -> None:
        self.count += 1


def _too_many_fields_rule(count: int, limit: int) -> type[ValidationRule]:
    class TooManyFields(ValidationRule):
        def enter_document(self, node: DocumentNode, *_args: Any) -> None:
            self.report_error(
                GraphQLError(
                    f"the document selects {count} fields; at most {limit} are allowed",
                    node,
                    extensions={"code": "GRAPHQL_VALIDATION_FAILED"},
                )
            )

    return TooManyFields


class _NoIntrospection(ValidationRule):
    """Anonymous callers may not introspect the schema (`__typename` stays allowed)."""

    def enter_field(self, node: FieldNode, *_args: Any) -> None:
        if node.name.value in INTROSPECTION_FIELDS:
            self.report_error(
                GraphQLError(
                    "introspection requires authentication: send Authorization: Bearer <JWT>",
                    node,
                    extensions={"code": UNAUTHENTICATED},
                )
            )


# --- input sizes --------------------------------------------------------------------------------


def page_size(first: int, field: str = "first") -> int:
    if not 1 <= first <= MAX_PAGE_SIZE:
        raise BadUserInput(field, f"must be between 1 and {MAX_PAGE_SIZE}")
    return first


def checked_text(field: str, value: str, max_chars: int, *, allow_blank: bool = False) -> str:
    if len(value) > max_chars:
        raise BadUserInput(field, f"at most {max_chars} characters (got {len(value)})")
    if not allow_blank and not value.strip():
        raise BadUserInput(field, "must not be blank")
    return value


def checked_meta(field: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadUserInput(field, "must be a JSON object or null")
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > META_MAX_BYTES:
        raise BadUserInput(field, f"at most {META_MAX_BYTES} bytes of JSON (got {size})")
    return value


# --- transport ----------------------------------------------------------------------------------


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with 413, before the GraphQL layer reads them."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        # Chunked bodies have no length up front: read up to the limit, then replay.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        await self.app(
            scope,
            _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
            send,
        )

    async def _too_large(self, send: Send) -> None:
        payload = json.dumps(
            {
                "errors": [
                    {
                        "message": f"request body larger than {self.max_bytes} bytes",
                        "extensions": {"code": "PAYLOAD_TOO_LARGE"},
                    }
                ]
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
