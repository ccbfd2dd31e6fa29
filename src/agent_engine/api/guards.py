"""Limits that keep one client from hurting the others.

Documents: size, depth, alias, token, field and cost limits (settings; the cost estimate is
`api/cost.py`), introspection and suggestions for authenticated viewers only; each distinct small
document is parsed and validated once per process (a cache bounded in size).
Transport: one operation per request (no batching); a request body size limit and JSON depth in
`api/transport.py`.
Input: page sizes and string/JSON sizes, refused as BAD_USER_INPUT naming the field.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from graphql import (
    BREAK,
    ArgumentNode,
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    GraphQLError,
    ObjectFieldNode,
    StringValueNode,
    ValidationRule,
    Visitor,
    parse,
    validate,
    visit,
)
from strawberry.extensions import MaxAliasesLimiter, QueryDepthLimiter, SchemaExtension
from strawberry.schema.validation_rules.maybe_null import MaybeNullValidationRule
from strawberry.schema.validation_rules.one_of import OneOfInputValidationRule

from agent_engine.api.cost import CostModel, KnownCosts, QueryCostLimiter
from agent_engine.api.errors import BAD_USER_INPUT, PAYLOAD_TOO_LARGE, UNAUTHENTICATED, BadUserInput
from agent_engine.api.transport import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from agent_engine.api.transport import BodySizeLimit as BodySizeLimit
from agent_engine.api.transport import UnreadableJson as UnreadableJson
from agent_engine.api.transport import decode_json_body as decode_json_body
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


# Parsed and validated documents are kept per api process, least recently used dropped first:
# dashboards and frontends send a handful of small documents over and over. Only documents up to
# DOCUMENT_CACHE_MAX_DOCUMENT_CHARS are kept, and all of them together hold at most
# DOCUMENT_CACHE_MAX_CHARS characters of text (each parsed tree keeps its text as its source), so
# what the cache holds is bounded in size, not only in entries. Anonymous callers read the cache
# but never add to it: they cannot make the process hold anything after their request.
DOCUMENT_CACHE_MAX_DOCUMENT_CHARS = 16 * 1024
DOCUMENT_CACHE_MAX_CHARS = 4 * 1024 * 1024


def document_guards(settings: Settings) -> list[Callable[[], SchemaExtension]]:
    """Extension factories (fresh instances per operation) for the configured limits."""
    rules = _GuardRules(
        max_document_bytes=settings.max_document_bytes,
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
        # Before the guards' validation: a document over the cost is not validated at all, and a
        # cached validation does not skip the cost of this request's pages.
        partial(
            QueryCostLimiter,
            max_cost=settings.max_query_cost,
            model=cost_model(settings),
            known=KnownCosts(),
        ),
        partial(DocumentGuards, rules=rules),
    ]


def cost_model(settings: Settings) -> CostModel:
    """List sizes of the cost estimate: pages up to MAX_PAGE_SIZE, `viewer.agents` at the
    agents-per-owner cap, other unpaginated lists at DEFAULT_LIST_CAP."""
    return CostModel(
        max_page_size=MAX_PAGE_SIZE,
        list_caps={("Viewer", "agents"): settings.max_agents_per_owner},
    )


def document_too_large(query: str, max_bytes: int) -> str | None:
    """Why a document is refused before it is parsed, if it is too long."""
    # Characters first: a document of more characters than bytes allowed is never encoded.
    if len(query) > max_bytes or len(query.encode()) > max_bytes:
        return (
            f"the GraphQL document is larger than {max_bytes} bytes"
            " (AGENT_ENGINE_MAX_DOCUMENT_BYTES)"
        )
    return None


class DocumentCache:
    """Least recently used first out; bounded by the total length of the documents' text."""

    def __init__(self, *, max_chars: int, max_document_chars: int) -> None:
        self.max_chars = max_chars
        self.max_document_chars = max_document_chars
        self.chars = 0
        self._entries: OrderedDict[tuple[str, Any], Any] = OrderedDict()

    def get(self, query: str, variant: Any = None) -> Any:
        key = (query, variant)
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, query: str, value: Any, variant: Any = None) -> None:
        if len(query) > self.max_document_chars or (query, variant) in self._entries:
            return
        self._entries[(query, variant)] = value
        self.chars += len(query)
        while self.chars > self.max_chars:
            (dropped, _), _ = self._entries.popitem(last=False)
            self.chars -= len(dropped)

    def __len__(self) -> int:
        return len(self._entries)


class _GuardRules:
    """The limits, and the documents that passed them (parsed, validated), shared by requests."""

    def __init__(
        self,
        *,
        max_document_bytes: int,
        max_tokens: int,
        max_fields: int,
        rules: tuple[type[ASTValidationRule], ...],
    ) -> None:
        self.max_document_bytes = max_document_bytes
        self.max_tokens = max_tokens
        self.max_fields = max_fields
        self.rules = rules
        self.parsed = DocumentCache(
            max_chars=DOCUMENT_CACHE_MAX_CHARS, max_document_chars=DOCUMENT_CACHE_MAX_DOCUMENT_CHARS
        )
        # Validation differs between anonymous and signed-in callers (introspection, hints): the
        # variant is `anonymous`; only signed-in callers' validations are kept.
        self.valid = DocumentCache(
            max_chars=DOCUMENT_CACHE_MAX_CHARS, max_document_chars=DOCUMENT_CACHE_MAX_DOCUMENT_CHARS
        )


def _is_anonymous(context: object) -> bool:
    return getattr(context, "viewer", None) is None


class DocumentGuards(SchemaExtension):
    """Document size, token, depth, alias and field limits and introspection for authenticated
    viewers only; each distinct small document is parsed and validated once (then served from a
    bounded cache). Anonymous callers get no "Did you mean …?" hints (they would map the schema).
    No text or JSON input may hold a NUL character (PostgreSQL stores none).

    Over the field limit, the only validation rule left is the one that says so: thousands of
    (duplicate) fields fit under the token limit but make graphql-core's overlapping-fields rule
    quadratic and recursive; counting first keeps validation cheap and the error clear.
    """

    def __init__(self, *, rules: _GuardRules) -> None:
        self.rules = rules
        self.refusal: GraphQLError | None = None

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        query = context.query
        if query and (problem := document_too_large(query, self.rules.max_document_bytes)):
            # Over HTTP the view refused it already (413); over a WebSocket it is this
            # operation's error. Not parsed: a stand-in carries it to validation, which reports it
            # (an exception here would end a subscription without a word).
            self.refusal = GraphQLError(problem, extensions={"code": PAYLOAD_TOO_LARGE})
            context.graphql_document = _STAND_IN
            yield
            return
        cached = self.rules.parsed.get(query) if query else None
        if cached is not None:
            context.graphql_document = cached
        else:
            context.parse_options["max_tokens"] = self.rules.max_tokens
        yield
        if (
            cached is None
            and query
            and context.graphql_document is not None
            and not _is_anonymous(context.context)
        ):
            self.rules.parsed.put(query, context.graphql_document)

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        if self.refusal is not None:
            context.pre_execution_errors = [self.refusal]
            yield
            return
        anonymous = _is_anonymous(context.context)
        if context.query and self.rules.valid.get(context.query, anonymous) is not None:
            if context.pre_execution_errors is None:
                context.pre_execution_errors = []  # validated before: graphql-core skips it
            # Its literals were looked at when it was validated: a document with a NUL character
            # in one is never cached as valid.
            self._refuse_nul_characters(literals=False)
            yield
            return
        document = context.graphql_document
        counter = _FieldCounter()
        if document is not None:
            visit(document, counter)
        if counter.count > self.rules.max_fields:
            rules: tuple[type[ASTValidationRule], ...] = (
                _too_many_fields_rule(counter.count, self.rules.max_fields),
            )
        else:
            rules = (
                *context.validation_rules,
                *self.rules.rules,
                *((_NoIntrospection,) if anonymous else ()),
                # Strawberry's own, which its validation would add.
                MaybeNullValidationRule,
                OneOfInputValidationRule,
            )
        validated = False
        if document is not None and context.pre_execution_errors is None:
            # Validated here rather than by Strawberry: graphql-core hides its suggestions only
            # when asked.
            context.pre_execution_errors = validate(
                context.schema._schema, document, rules, hide_suggestions=anonymous
            )
            validated = True
        self._refuse_nul_characters(literals=True)
        if validated and context.query and context.pre_execution_errors == [] and not anonymous:
            self.rules.valid.put(context.query, True, anonymous)
        yield

    def _refuse_nul_characters(self, *, literals: bool) -> None:
        """A valid document whose input (its variables; its literals when `literals`) holds a
        NUL character is refused before it executes."""
        context = self.execution_context
        if context.pre_execution_errors:
            return
        where = _nul_in_variables(context.variables) or (
            _nul_in_literals(context.graphql_document)
            if literals and context.graphql_document
            else None
        )
        if where is not None:
            context.pre_execution_errors = [
                GraphQLError(
                    f"{where}: must not contain a NUL character (\\u0000)",
                    extensions={"code": BAD_USER_INPUT, "field": where},
                )
            ]


# What an unparsed (refused) document is replaced with until its validation reports the refusal.
_STAND_IN = parse("{ __typename }")


def _nul_in_variables(variables: dict[str, Any] | None) -> str | None:
    """The path of the first variable value (or object key) holding a NUL character."""
    pending: list[tuple[str, Any]] = [(name, value) for name, value in (variables or {}).items()]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in key:
                    return path
                pending.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            pending.extend((path, item) for item in value)
    return None


class _NulInLiterals(Visitor):
    """Finds a NUL character in a string literal, naming its argument and input fields."""

    def __init__(self) -> None:
        super().__init__()
        self.path: list[str] = []
        self.found: str | None = None

    def enter_argument(self, node: ArgumentNode, *_args: Any) -> None:
        self.path.append(node.name.value)

    def leave_argument(self, *_args: Any) -> None:
        self.path.pop()

    def enter_object_field(self, node: ObjectFieldNode, *_args: Any) -> None:
        self.path.append(node.name.value)

    def leave_object_field(self, *_args: Any) -> None:
        self.path.pop()

    def enter_string_value(self, node: StringValueNode, *_args: Any) -> Any:
        if self.found is None and "\x00" in node.value:
            self.found = ".".join(self.path) or "document"
            return BREAK
        return None


def _nul_in_literals(document: DocumentNode) -> str | None:
    finder = _NulInLiterals()
    visit(document, finder)
    return finder.found


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


# An instant the API computes with (a budget week around it, slots after it) stays this far from
# the calendar's edges (years 1 and 9999), so the arithmetic never leaves the calendar.
INSTANT_MARGIN = timedelta(days=31)
EARLIEST_INSTANT = datetime.min.replace(tzinfo=UTC) + INSTANT_MARGIN
LATEST_INSTANT = datetime.max.replace(tzinfo=UTC) - INSTANT_MARGIN


def checked_instant(field: str, value: datetime) -> datetime:
    """A DateTime argument: with a UTC offset, and not at the calendar's edges."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise BadUserInput(field, "must carry a UTC offset, e.g. 2025-03-09T00:00:00Z")
    try:
        inside = EARLIEST_INSTANT <= value <= LATEST_INSTANT
    except OverflowError:  # an offset that pushes it past the calendar
        inside = False
    if not inside:
        raise BadUserInput(
            field,
            f"must lie between {EARLIEST_INSTANT:%Y-%m-%d} and {LATEST_INSTANT:%Y-%m-%d}",
        )
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
