"""The static cost of a GraphQL document, checked before anything executes.

The cost is how many objects the answer can hold, read from the document alone: every field of an
object type counts once per parent object; a list multiplies what it holds by its size -- a page
(`first`, also on a connection, whose `edges` hold the page) counts its `first` (the argument's
default when it is absent, at most `MAX_PAGE_SIZE`), an unpaginated list counts its cap
(`viewer.agents` the agents-per-owner cap, any other `DEFAULT_LIST_CAP`). Scalars are free.

  { viewer { agents { runs(first: 100) { edges { node { agent { id } } } } } } }
  = 1 viewer + 200 agents + 200 connections + 200 x 100 edges + 20,000 nodes + 20,000 agents

A document over the limit is refused with GRAPHQL_VALIDATION_FAILED naming its cost and the
limit. The same applies to subscription documents (per event). The estimate is linear in the
document's size: a fragment's cost is computed once per page size and scaled, so fragments
spread many times cannot make the estimate itself expensive.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLField,
    GraphQLNamedType,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_composite_type,
    is_list_type,
)
from graphql.pyutils import Undefined
from strawberry.extensions import SchemaExtension

from agent_engine.api.errors import GRAPHQL_VALIDATION_FAILED

PAGE_ARGUMENT = "first"
DEFAULT_LIST_CAP = 100


@dataclass(frozen=True)
class CostModel:
    """Sizes the estimate assumes: pages up to `max_page_size`, unpaginated lists at their cap."""

    max_page_size: int
    list_caps: Mapping[tuple[str, str], int] = field(default_factory=dict)
    default_list_cap: int = DEFAULT_LIST_CAP

    def cap(self, parent: str, name: str) -> int:
        return self.list_caps.get((parent, name), self.default_list_cap)


def estimate_cost(
    schema: GraphQLSchema,
    document: DocumentNode,
    model: CostModel,
    *,
    operation_name: str | None = None,
    variables: Mapping[str, Any] | None = None,
) -> int:
    """The cost of the operation the request runs (the most expensive one when the document
    does not say which; graphql-core refuses such a document anyway)."""
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is not None:
        operations = [o for o in operations if o.name and o.name.value == operation_name]
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    costs = [
        _Estimate(schema, model, fragments, operation, variables or {}).total()
        for operation in operations
    ]
    return max(costs, default=0)


class _Estimate:
    def __init__(
        self,
        schema: GraphQLSchema,
        model: CostModel,
        fragments: Mapping[str, FragmentDefinitionNode],
        operation: OperationDefinitionNode,
        variables: Mapping[str, Any],
    ) -> None:
        self.schema = schema
        self.model = model
        self.fragments = fragments
        self.operation = operation
        self.variables = variables
        # Unit cost (one parent object) of a fragment, by (name, page size of its parent).
        self.fragment_costs: dict[tuple[str, int | None], int] = {}

    def total(self) -> int:
        root = self.schema.get_root_type(self.operation.operation)
        if root is None:
            return 0
        return self.selections(root, self.operation.selection_set, None, frozenset())

    def selections(
        self,
        parent: GraphQLNamedType,
        selection_set: SelectionSetNode,
        page: int | None,
        visiting: frozenset[str],
    ) -> int:
        """The cost of `selection_set` for one `parent` object; `page` is the page size when the
        parent is a connection (its lists hold a page)."""
        total = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                total += self.field(parent, selection, page, visiting)
            elif isinstance(selection, InlineFragmentNode):
                condition = (
                    self.schema.get_type(selection.type_condition.name.value)
                    if selection.type_condition
                    else parent
                )
                if condition is not None:
                    total += self.selections(condition, selection.selection_set, page, visiting)
            elif isinstance(selection, FragmentSpreadNode):
                total += self.spread(selection.name.value, page, visiting)
        return total

    def spread(self, name: str, page: int | None, visiting: frozenset[str]) -> int:
        fragment = self.fragments.get(name)
        if fragment is None or name in visiting:  # unknown or cyclic: validation says so
            return 0
        key = (name, page)
        if key not in self.fragment_costs:
            condition = self.schema.get_type(fragment.type_condition.name.value)
            self.fragment_costs[key] = (
                self.selections(condition, fragment.selection_set, page, visiting | {name})
                if condition is not None
                else 0
            )
        return self.fragment_costs[key]

    def field(
        self, parent: GraphQLNamedType, node: FieldNode, page: int | None, visiting: frozenset[str]
    ) -> int:
        definition = _field_definition(parent, node.name.value)
        if definition is None:  # introspection, __typename or an unknown field
            return 0
        named = get_named_type(definition.type)
        if not is_composite_type(named):
            return 0
        size = self.page_size(node, definition)
        if is_list_type(get_nullable_type(definition.type)):
            if size is not None:
                count = size
            elif page is not None:
                count = page
            else:
                count = self.model.cap(parent.name, node.name.value)
            inner_page = None
        else:
            count = 1
            inner_page = size  # a connection: its edges hold the page
        if node.selection_set is None:
            return count
        return count * (1 + self.selections(named, node.selection_set, inner_page, visiting))

    def page_size(self, node: FieldNode, definition: GraphQLField) -> int | None:
        """The field's `first`, from the document, the variables or the argument's default."""
        argument = definition.args.get(PAGE_ARGUMENT)
        if argument is None:
            return None
        value: Any = Undefined
        for given in node.arguments or ():
            if given.name.value != PAGE_ARGUMENT:
                continue
            if isinstance(given.value, IntValueNode):
                value = _int_literal(given.value)
            elif isinstance(given.value, VariableNode):
                value = self.variable(given.value.name.value)
        if value is Undefined or value is None:
            value = argument.default_value
            # A schema built from SDL keeps the default as a literal only.
            literal = argument.ast_node.default_value if argument.ast_node else None
            if value is Undefined and isinstance(literal, IntValueNode):
                value = _int_literal(literal)
        if not isinstance(value, int) or isinstance(value, bool):
            return self.model.max_page_size
        return max(0, min(value, self.model.max_page_size))

    def variable(self, name: str) -> Any:
        if name in self.variables:
            return self.variables[name]
        for definition in self.operation.variable_definitions or ():
            if definition.variable.name.value == name and isinstance(
                definition.default_value, IntValueNode
            ):
                return _int_literal(definition.default_value)
        return Undefined


INT_LITERAL_MAX_CHARS = 20


def _int_literal(node: IntValueNode) -> int | None:
    """An integer literal's value; None past 64 bits (validation refuses it, and Python would
    not convert a literal of thousands of digits)."""
    return int(node.value) if len(node.value) <= INT_LITERAL_MAX_CHARS else None


def _field_definition(parent: GraphQLNamedType, name: str) -> GraphQLField | None:
    fields: dict[str, GraphQLField] | None = getattr(parent, "fields", None)
    if fields is None:  # a union: its fields are selected through fragments
        return None
    return fields.get(name)


# --- the guard ----------------------------------------------------------------------------------


class KnownCosts:
    """Estimates already made, by document (the parsed documents the guards cache are the same
    objects request after request), operation and variables: a page sent again is not estimated
    again. Only variables of plain values are remembered, at most `PER_DOCUMENT` sets per
    document; a document's estimates go with it. Documents are told apart by identity: a node
    hashes its whole tree (by value) on every call."""

    PER_DOCUMENT = 16

    def __init__(self) -> None:
        self._costs: dict[int, tuple[weakref.ref[DocumentNode], dict[Any, int]]] = {}

    @staticmethod
    def _key(operation_name: str | None, variables: Mapping[str, Any]) -> Any:
        if any(type(value) not in _PLAIN for value in variables.values()):
            return None
        # By type too: 1 and True are equal keys, not the same variables.
        return (operation_name, *sorted((k, type(v).__name__, v) for k, v in variables.items()))

    def get(
        self, document: DocumentNode, operation_name: str | None, variables: Mapping[str, Any]
    ) -> int | None:
        entry = self._costs.get(id(document))
        if entry is None or entry[0]() is not document:
            return None
        key = self._key(operation_name, variables)
        return None if key is None else entry[1].get(key)

    def put(
        self,
        document: DocumentNode,
        operation_name: str | None,
        variables: Mapping[str, Any],
        cost: int,
    ) -> None:
        key = self._key(operation_name, variables)
        if key is None:
            return
        entry = self._costs.get(id(document))
        if entry is None or entry[0]() is not document:
            # Forgotten when the document is collected (before its id can be reused).
            at, every = id(document), self._costs

            def forget(_: weakref.ref[DocumentNode]) -> None:
                every.pop(at, None)

            entry = self._costs[at] = (weakref.ref(document, forget), {})
        costs = entry[1]
        if len(costs) >= self.PER_DOCUMENT:
            costs.clear()
        costs[key] = cost


# Variable values an estimate is remembered for (hashable, compared by value).
_PLAIN = frozenset({str, int, float, bool, type(None)})


class QueryCostLimiter(SchemaExtension):
    """Refuses a document whose estimated cost exceeds `max_cost`, before it executes.

    The estimate runs before graphql-core's own validation, and a document over the limit is not
    validated at all (Strawberry skips validation when an extension already has the errors):
    validating 30 aliases of nested pages costs a tenth of a second or more, which a refusal
    should not.
    """

    def __init__(self, *, max_cost: int, model: CostModel, known: KnownCosts | None = None) -> None:
        self.max_cost = max_cost
        self.model = model
        self.known = known

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document = context.graphql_document
        # Strawberry's own ValidationCache extension reads the GraphQL schema here too.
        schema = getattr(context.schema, "_schema", None)
        if document is not None and isinstance(schema, GraphQLSchema):
            variables = context.variables or {}
            known = self.known
            cost = None if known is None else known.get(document, context.operation_name, variables)
            if cost is None:
                cost = estimate_cost(
                    schema,
                    document,
                    self.model,
                    operation_name=context.operation_name,
                    variables=variables,
                )
                if known is not None:
                    known.put(document, context.operation_name, variables, cost)
            if cost > self.max_cost:
                # Set as the validation's result: graphql-core's rules are skipped (and so is a
                # cached validation of the same document with smaller pages).
                context.pre_execution_errors = [cost_error(cost, self.max_cost, document)]
        yield


def cost_error(cost: int, max_cost: int, node: DocumentNode | None = None) -> GraphQLError:
    return GraphQLError(
        f"the query's estimated cost is {cost:,}, over the limit of {max_cost:,}: "
        "ask for smaller pages (first) or fewer nested lists",
        node,
        extensions={"code": GRAPHQL_VALIDATION_FAILED, "cost": cost, "maxCost": max_cost},
    )
