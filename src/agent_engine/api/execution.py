"""GraphQL execution: graphql-core's executor, its per-field work cut where it has nothing to do.

A page of 100 agents completes about a thousand fields, and graphql-core plus Strawberry spend more
on the machinery of each field than on the field itself (bench/README, "CPU per unit of work").
What each schema field may skip is decided once, when the schema is built (`streamline`); which
fields of a selection take the short way is decided once per selection and execution. Anything
else takes the standard path:

- **A plain leaf** — no resolver, no arguments, no field extensions, a scalar or enum type, not a
  list — is read off its source and coerced in place: no response path, no resolve info, no
  resolver call chain. Anything unusual (null where the type is non-null, a coercion that fails,
  an exception) runs the field again on the standard path, which is side-effect free for such a
  field and produces the standard error with its path.
- **A resolver** with no GraphQL arguments, no field extensions and no exception handlers is
  called directly — the source as `self`, Strawberry's `Info` when it asks for one — instead of
  through Strawberry's per-call argument conversion and extension chain, which have nothing to do
  for it. The `Info` it gets builds graphql-core's resolve info on first use: most resolvers read
  only the context. An async resolver's result is awaited as graphql-core awaits it. Usual
  results are completed in place: null where the type allows it, an object of a concrete type
  without `is_type_of` (its selection's steps looked up once per object, then executed as
  graphql-core would), a list of such objects or of leaves with no null, exception or awaitable
  among them, a leaf that coerces. Any other result — an exception, an awaitable, null where the
  type is non-null, an item that is not plain — is completed by graphql-core's own
  `complete_value` with the same resolve info, and the resolver is not called again. An
  exception is handled as graphql-core handles it.

- **A compiled selection** — every field a plain leaf or an inline resolver (synchronous, no
  `Info`, an object or a list of objects), the selections below alike — runs as one generated
  function per shape (`api/compiled.py`): the usual case in straight-line code, anything else
  handed back to the methods here for that one field.

Where each part lives: the leaf path in `api/leaf_path.py`; the field plans (decided by
`streamline`) in `api/field_plans.py`; the resolver path's completion in `api/resolver_path.py`; the
compiled selections' executor side in `api/compiled_path.py` (their code in `api/compiled.py`).
`Executor` here walks a selection's steps and inherits the other paths' methods.

Results, errors and their paths are the same as graphql-core's and Strawberry's own
(`tests/unit/api/test_execution.py` compares them); the whole API suite runs on this executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphql import GraphQLObjectType, GraphQLSchema
from graphql.pyutils import Path, Undefined
from graphql.type.definition import GraphQLResolveInfoHelpers

from agent_engine.api.compiled import SETTLED, gathered
from agent_engine.api.compiled_path import COMPILED as _COMPILED
from agent_engine.api.compiled_path import CompiledPath
from agent_engine.api.field_plans import (
    FIELD_PLANS,
    DirectPlan,
    FieldPlan,
    FieldPlans,
    FieldStep,
    direct_resolver,
)
from agent_engine.api.leaf_path import LeafPlan, plain_leaf
from agent_engine.api.resolver_path import field_nodes as field_nodes
from agent_engine.api.resolver_path import lazy_info
from agent_engine.collector import weakly

__all__ = ["FIELD_PLANS", "_COMPILED", "Executor", "field_nodes", "streamline"]

# The directives graphql-core has applied by the time fields are collected; a field carrying any
# other (@stream, say) takes the standard path.
_COLLECTION_DIRECTIVES = frozenset({"skip", "include"})


def _probe(_source: Any, _info: Any) -> None:
    """A resolver that middleware would wrap."""


class Executor(CompiledPath):
    """graphql-core's executor (as Strawberry sets it up), with the shortcuts above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # graphql-core keeps two of the executor's bound methods on it: a cycle that would leave
        # the executor, the request's context and its loaders to the collector.
        self.async_helpers = GraphQLResolveInfoHelpers(
            gather=weakly(self.gather_async_work), track=weakly(self.track_async_work)
        )

    _field_plans: FieldPlans | None = None
    _selection_steps: dict[tuple[str, int], tuple[Any, tuple[FieldStep, ...] | None]] | None = None
    _object_steps: dict[tuple[str, int], tuple[Any, tuple[FieldStep, ...] | None]] | None = None

    def _plans(self) -> FieldPlans:
        """The schema's field plans; none when an extension wraps the resolvers (then every
        field takes the standard path) or the schema was not `streamline`d."""
        if self._field_plans is None:
            manager = self.middleware_manager
            wrapped = manager is not None and manager.get_field_resolver(_probe) is not _probe
            self._field_plans = {} if wrapped else self.schema.extensions.get(FIELD_PLANS, {})
        return self._field_plans

    def _steps(
        self, parent_type: GraphQLObjectType, grouped_field_set: Any
    ) -> tuple[FieldStep, ...] | None:
        """How to take each key of a selection; None when no key has a shortcut. Decided once per
        selection and execution (a list's items share their selection)."""
        cache = self._selection_steps
        if cache is None:
            cache = self._selection_steps = {}
        key = (parent_type.name, id(grouped_field_set))
        cached = cache.get(key)
        # The selection is kept with its steps, so its id cannot be reused while cached.
        if cached is not None and cached[0] is grouped_field_set:
            return cached[1]
        plans = self._plans().get(parent_type.name)
        steps: tuple[FieldStep, ...] | None = None
        if plans:
            steps = tuple(
                FieldStep(name, details, _plan_for(plans, details), [])
                for name, details in grouped_field_set.items()
            )
            if all(step.plan is None for step in steps):
                steps = None
        cache[key] = (grouped_field_set, steps)
        return steps

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: Any,
        position_context: Any,
    ) -> Any:
        steps = self._steps(parent_type, grouped_field_set)
        if steps is None:
            return super().execute_fields(
                parent_type, source_value, path, grouped_field_set, position_context
            )
        return self._execute_steps(parent_type, source_value, path, steps, position_context)

    def _execute_object(
        self,
        object_type: GraphQLObjectType,
        details: Any,
        path: Path,
        source: Any,
        position_context: Any,
    ) -> Any:
        """`collect_and_execute_subfields` for an object a direct resolver returned: its
        selection's steps looked up once per object, not collected, executed and stepped."""
        steps = self._object_selection(object_type, details, position_context)
        if steps is None:
            return self.collect_and_execute_subfields(
                object_type, details, path, source, position_context
            )
        return self._execute_steps(object_type, source, path, steps, None)

    def _object_selection(
        self, object_type: GraphQLObjectType, details: Any, position_context: Any
    ) -> tuple[FieldStep, ...] | None:
        """The steps of the selection `details` on an object of `object_type`; None where
        graphql-core's own path must take it (deferred fragments, no shortcut)."""
        if position_context is not None:
            return None
        cache = self._object_steps
        if cache is None:
            cache = self._object_steps = {}
        key = (object_type.name, id(details))
        cached = cache.get(key)
        if cached is None or cached[0] is not details:
            grouped, new_defer_usages, _ = self.collect_subfields(object_type, details)
            # Deferred fragments take graphql-core's incremental path.
            steps = None if new_defer_usages else self._steps(object_type, grouped)
            cached = cache[key] = (details, steps)
        return cached[1]

    def _execute_steps(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        steps: tuple[FieldStep, ...],
        position_context: Any,
    ) -> Any:
        """`execute_fields` for a selection whose steps are known.

        Its plain leaves (read and coerced) and the usual results of its inline resolvers (an object
        or a list of objects, as `_execute_direct` completes them) are completed here, without
        the calls between: a page's thousand fields spent more on those calls than on the
        fields. Anything else takes `_execute_direct` or graphql-core's `execute_field`.
        """
        if position_context is None:
            complete = self._compiled(parent_type, steps)
            if complete is not None:
                return complete(self, source_value, path, steps)
        results: dict[str, Any] = {}
        is_awaitable = self.is_awaitable
        awaitable_fields: list[str] = []
        try:
            for response_name, field_details_list, plan, below in steps:
                if type(plan) is LeafPlan:
                    try:
                        value = getattr(source_value, plan.attribute)
                        if value is None:
                            if not plan.non_null:
                                results[response_name] = None
                                continue
                        elif not isinstance(value, Exception):
                            value = plan.coerce(value)
                            if value is not None:
                                results[response_name] = value
                                continue
                    except Exception:
                        pass
                    # Null in a non-null field, an exception, a coercion that fails: the
                    # standard path words the error (and reads the field again, harmlessly).
                field_path = Path(path, response_name, parent_type.name)
                if type(plan) is DirectPlan:
                    if plan.inline:
                        try:
                            result = plan.function(source_value)
                        except Exception as raw_error:
                            self.handle_field_error(
                                raw_error, plan.field_def.type, field_details_list, field_path
                            )
                            results[response_name] = None
                            continue
                        completed = self._complete_inline(
                            plan,
                            parent_type,
                            field_details_list,
                            field_path,
                            result,
                            below,
                            position_context,
                        )
                        results[response_name] = completed
                        if type(completed) not in SETTLED and is_awaitable(completed):
                            awaitable_fields.append(response_name)
                        continue
                    result = self._execute_direct(
                        plan,
                        parent_type,
                        source_value,
                        field_details_list,
                        field_path,
                        position_context,
                    )
                else:
                    result = self.execute_field(
                        parent_type,
                        source_value,
                        field_details_list,
                        field_path,
                        position_context,
                    )
                if result is not Undefined:
                    results[response_name] = result
                    if type(result) not in SETTLED and is_awaitable(result):
                        awaitable_fields.append(response_name)
        except Exception:
            if awaitable_fields:
                self.settle_in_background([results[name] for name in awaitable_fields])
            raise
        if not awaitable_fields:
            return results
        return gathered(results, awaitable_fields)


def _plan_for(plans: dict[str, FieldPlan], field_details_list: Any) -> FieldPlan | None:
    node = field_details_list[0].node
    plan = plans.get(node.name.value)
    if plan is None:
        return None
    for details in field_details_list:
        directives = details.node.directives
        if directives and any(d.name.value not in _COLLECTION_DIRECTIVES for d in directives):
            return None
    return plan


def streamline(schema: Any) -> None:
    """Decide, once per field of a built Strawberry schema, what `Executor` may shortcut: its
    plain leaves and the synchronous resolvers it calls directly (plans kept in the GraphQL
    schema's `extensions`; a direct resolver is also set as the field's resolver, for the
    standard path)."""
    graphql_schema: GraphQLSchema = schema._schema
    subscription = graphql_schema.subscription_type
    info_class = lazy_info(schema.config.info_class)
    plans: FieldPlans = {}
    for graphql_type in graphql_schema.type_map.values():
        if not isinstance(graphql_type, GraphQLObjectType) or graphql_type is subscription:
            continue
        for name, field_def in graphql_type.fields.items():
            plan: FieldPlan | None = plain_leaf(field_def)
            if plan is None and not schema.exception_handlers:
                plan = direct_resolver(field_def, info_class)
                if plan is not None:
                    field_def.resolve = _resolve_directly(plan)
            if plan is not None:
                plans.setdefault(graphql_type.name, {})[name] = plan
    graphql_schema.extensions = {**graphql_schema.extensions, FIELD_PLANS: plans}


def _resolve_directly(plan: DirectPlan) -> Callable[[Any, Any], Any]:
    """The field's resolver for the standard path: the function called as `Executor` calls it."""
    function, info_name = plan.function, plan.info_name
    if info_name is None:

        def resolve_plain(source: Any, _info: Any) -> Any:
            return function(source)

        resolve: Callable[[Any, Any], Any] = resolve_plain
    else:

        def resolve_with_info(source: Any, info: Any) -> Any:
            return function(source, **{info_name: plan.info_class.made(info, plan.field)})

        resolve = resolve_with_info
    resolve._is_default = False  # type: ignore[attr-defined]  # as Strawberry marks its own
    return resolve
