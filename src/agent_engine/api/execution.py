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

Results, errors and their paths are the same as graphql-core's and Strawberry's own
(`tests/unit/api/test_execution.py` compares them); the whole API suite runs on this executor.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, cast

from graphql import (
    GraphQLEnumType,
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLScalarType,
    GraphQLSchema,
)
from graphql.execution.executor import to_nodes
from graphql.pyutils import Path, Undefined
from graphql.type.definition import GraphQLResolveInfoHelpers
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.field import StrawberryField

from agent_engine.api.compiled import (
    LEAF,
    OBJECT,
    OBJECTS,
    SETTLED,
    Part,
    compile_selection,
    gathered,
    real_path,
)
from agent_engine.collector import weakly

# The key under which Strawberry keeps a GraphQL field's StrawberryField.
_DEFINITION = GraphQLCoreConverter.DEFINITION_BACKREF

# The directives graphql-core has applied by the time fields are collected; a field carrying any
# other (@stream, say) takes the standard path.
_COLLECTION_DIRECTIVES = frozenset({"skip", "include"})


class _Leaf(NamedTuple):
    """How to read and coerce a plain leaf field in place."""

    attribute: str
    coerce: Callable[[Any], Any]
    non_null: bool


# The shapes of a direct resolver's result that `Executor` completes in place.
_OTHER, _OBJECT, _OBJECTS, _LEAF, _LEAVES = range(5)


class _Direct(NamedTuple):
    """A synchronous resolver called directly, and the shape its result is completed in."""

    field_def: GraphQLField
    function: Callable[..., Any]
    info_name: str | None  # the resolver's `Info` parameter, if it has one
    field: StrawberryField
    info_class: type[Any]  # Strawberry's `Info`, its resolve info built on first use (`_lazy_info`)
    is_async: bool  # its result is awaited, then completed as a synchronous one's
    non_null: bool
    shape: int
    # The object type of _OBJECT/_OBJECTS; the leaf's coercion of _LEAF/_LEAVES.
    object_type: GraphQLObjectType | None
    coerce: Callable[[Any], Any] | None
    item_type: GraphQLOutputType | None  # of a list, as its errors name it
    # Synchronous, without an `Info`, of an object or a list of objects: its usual results are
    # completed inline by `_execute_steps` (a page's model, tools and runs of each agent).
    inline: bool = False
    # The Python class of `object_type`'s objects: an object of exactly this class is neither
    # an exception nor awaitable (no checks needed).
    object_class: type[Any] | None = None


FieldPlan = _Leaf | _Direct


def _plain_leaf(field_def: GraphQLField) -> _Leaf | None:
    field = field_def.extensions.get(_DEFINITION)
    if (
        not isinstance(field, StrawberryField)
        or type(field).get_result is not StrawberryField.get_result
        or not field.is_basic_field
        or field.default_resolver is not getattr
        or field_def.args
        or not getattr(field_def.resolve, "_is_default", False)
    ):
        return None
    return_type = field_def.type
    non_null = isinstance(return_type, GraphQLNonNull)
    named = return_type.of_type if isinstance(return_type, GraphQLNonNull) else return_type
    if not isinstance(named, GraphQLScalarType | GraphQLEnumType):
        return None
    return _Leaf(field.python_name, named.coerce_output_value, non_null)


# Where `streamline` leaves the plans: in the GraphQL schema's own `extensions`, by object type
# name, then field name.
FIELD_PLANS = "agent_engine.field_plans"

FieldPlans = dict[str, dict[str, FieldPlan]]


class _Step(NamedTuple):
    """One response key of a selection, as `Executor.execute_fields` takes it."""

    response_name: str
    field_details_list: Any
    plan: FieldPlan | None  # None: the standard path
    # An inline resolver's: the steps of its objects' selection once looked up (one item; steps
    # belong to one execution, and the field's object type is fixed), for the objects of every
    # source of the selection (a page's hundred agents' models).
    below: list[tuple[_Step, ...] | None]


def _probe(_source: Any, _info: Any) -> None:
    """A resolver that middleware would wrap."""


class Executor(StrawberryGraphQLCoreExecutionContext):
    """graphql-core's executor (as Strawberry sets it up), with the shortcuts above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # graphql-core keeps two of the executor's bound methods on it: a cycle that would leave
        # the executor, the request's context and its loaders to the collector.
        self.async_helpers = GraphQLResolveInfoHelpers(
            gather=weakly(self.gather_async_work), track=weakly(self.track_async_work)
        )

    _field_plans: FieldPlans | None = None
    _selection_steps: dict[tuple[str, int], tuple[Any, tuple[_Step, ...] | None]] | None = None
    _object_steps: dict[tuple[str, int], tuple[Any, tuple[_Step, ...] | None]] | None = None
    _compiled_steps: dict[int, tuple[Any, Callable[..., Any] | None]] | None = None

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
    ) -> tuple[_Step, ...] | None:
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
        steps: tuple[_Step, ...] | None = None
        if plans:
            steps = tuple(
                _Step(name, details, _plan_for(plans, details), [])
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
    ) -> tuple[_Step, ...] | None:
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
        steps: tuple[_Step, ...],
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
                if type(plan) is _Leaf:
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
                if type(plan) is _Direct:
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

    def _compiled(
        self, parent_type: GraphQLObjectType, steps: tuple[_Step, ...]
    ) -> Callable[..., Any] | None:
        """The compiled function of a selection (`api/compiled.py`), None where it does not
        compile; looked up once per selection and execution."""
        cache = self._compiled_steps
        if cache is None:
            cache = self._compiled_steps = {}
        cached = cache.get(id(steps))
        if cached is not None and cached[0] is steps:
            return cached[1]
        complete = self._compile(parent_type, steps)
        cache[id(steps)] = (steps, complete)
        return complete

    def _compile(
        self, parent_type: GraphQLObjectType, steps: tuple[_Step, ...]
    ) -> Callable[..., Any] | None:
        """The selection's function, its objects' selections compiled first (as deep as the
        document, which validation bounds); None when any step is not a leaf or inline."""
        parts: list[Part] = []
        for step in steps:
            plan = step.plan
            if type(plan) is _Leaf:
                parts.append(Part(LEAF, step.response_name, plan, None))
                continue
            if type(plan) is not _Direct or not plan.inline or plan.object_class is None:
                return None
            object_type = cast(GraphQLObjectType, plan.object_type)
            below = self._below(plan, step.field_details_list, step.below)
            nested = None if below is None else self._compiled(object_type, below)
            if nested is None:
                return None
            kind = OBJECT if plan.shape == _OBJECT else OBJECTS
            parts.append(Part(kind, step.response_name, plan, nested))
        return _compiled_selection(parent_type, parts)

    def _slow_leaf(
        self, parent_type: GraphQLObjectType, source: Any, path: Any, step: _Step
    ) -> Any:
        """A compiled selection's plain leaf that was not usual: the standard path's answer."""
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        return self.execute_field(parent_type, source, step.field_details_list, field_path, None)

    def _inline_failed(
        self, raw_error: Exception, parent_type: GraphQLObjectType, path: Any, step: _Step
    ) -> None:
        """A compiled selection's inline resolver raised: handled as the field's error."""
        plan = cast(_Direct, step.plan)
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        self.handle_field_error(raw_error, plan.field_def.type, step.field_details_list, field_path)

    def _nested_failed(
        self, raw_error: Exception, return_type: GraphQLOutputType, step: _Step, path: Any
    ) -> None:
        """An object (or list) a compiled selection completed raised: handled at `path`."""
        at = cast(Path, real_path(path))
        self.handle_field_error(raw_error, return_type, step.field_details_list, at)

    def _slow_inline(
        self, parent_type: GraphQLObjectType, path: Any, step: _Step, result: Any
    ) -> Any:
        """A compiled selection's inline resolver returned something unusual: completed as
        `_execute_steps` completes it, with the result in hand."""
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        return self._complete_inline(
            cast(_Direct, step.plan),
            parent_type,
            step.field_details_list,
            field_path,
            result,
            step.below,
            None,
        )

    def _complete_inline(
        self,
        plan: _Direct,
        parent_type: GraphQLObjectType,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[_Step, ...] | None],
        position_context: Any,
    ) -> Any:
        """An inline resolver's result completed: null where its type allows it, its usual
        objects in place, anything else as `_complete_direct` completes it."""
        if result is None and not plan.non_null:
            return None
        if position_context is not None:
            completed = Undefined
        elif plan.shape == _OBJECT:
            completed = self._inline_object(plan, details, path, result, below)
        else:
            completed = self._inline_objects(plan, details, path, result, below)
        if completed is Undefined:
            completed = self._complete_direct(
                plan, parent_type, details, path, result, position_context, None
            )
        return completed

    def _below(
        self, plan: _Direct, details: Any, below: list[tuple[_Step, ...] | None]
    ) -> tuple[_Step, ...] | None:
        """The steps of an inline resolver's objects (`_Step.below`)."""
        if below:
            return below[0]
        steps = self._object_selection(cast(GraphQLObjectType, plan.object_type), details, None)
        below.append(steps)
        return steps

    def _inline_object(
        self,
        plan: _Direct,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[_Step, ...] | None],
    ) -> Any:
        """An inline resolver's present object completed as `_execute_direct` completes it;
        Undefined where `_complete_direct` must (null, an exception, an awaitable, a selection
        graphql-core's own path takes). Its errors are handled as that resolver's."""
        if type(result) is not plan.object_class and (
            result is None or isinstance(result, Exception) or self.is_awaitable(result)
        ):
            return Undefined
        object_type = cast(GraphQLObjectType, plan.object_type)
        steps = self._below(plan, details, below)
        if steps is None:
            return Undefined
        try:
            completed = self._execute_steps(object_type, result, path, steps, None)
        except Exception as raw_error:
            self.handle_field_error(raw_error, plan.field_def.type, details, path)
            return None
        if type(completed) is not dict:  # some of its fields are awaited
            return self._await_completed(completed, plan.field_def.type, details, path)
        return completed

    def _inline_objects(
        self,
        plan: _Direct,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[_Step, ...] | None],
    ) -> Any:
        """An inline resolver's list of objects completed as `_execute_direct` completes it;
        Undefined where `_complete_direct` must."""
        try:
            completed = self._complete_objects(plan, details, path, result, None, below)
        except Exception as raw_error:
            self.handle_field_error(raw_error, plan.field_def.type, details, path)
            return None
        if completed is Undefined or type(completed) is list:
            return completed
        return self._await_completed(completed, plan.field_def.type, details, path)

    def _execute_direct(
        self,
        plan: _Direct,
        parent_type: GraphQLObjectType,
        source: Any,
        field_details_list: Any,
        path: Path,
        position_context: Any,
    ) -> Any:
        """`execute_field` for a resolver called directly, its usual results completed in place."""
        info = None
        try:
            if plan.info_name is None:
                result = plan.function(source)
            else:
                info = plan.info_class(self, plan, field_details_list, parent_type, path)
                result = plan.function(source, **{plan.info_name: info})
        except Exception as raw_error:
            self.handle_field_error(raw_error, plan.field_def.type, field_details_list, path)
            return None
        return self._complete_direct(
            plan, parent_type, field_details_list, path, result, position_context, info
        )

    def _complete_direct(
        self,
        plan: _Direct,
        parent_type: GraphQLObjectType,
        field_details_list: Any,
        path: Path,
        result: Any,
        position_context: Any,
        info: Any,
    ) -> Any:
        """A direct resolver's result completed (in place where usual), as `execute_field`
        completes a resolver's result; `info` is the `Info` it was given, if any."""
        return_type = plan.field_def.type
        try:
            if plan.is_async:
                return self._complete_awaited(
                    plan, parent_type, field_details_list, path, result, position_context
                )
            completed = self._complete_in_place(
                plan, field_details_list, path, result, position_context
            )
            if completed is Undefined:
                raw_info = (
                    info._raw_info
                    if info is not None
                    else self._resolve_info(plan, field_details_list, parent_type, path)
                )
                if self.is_awaitable(result):
                    return self.complete_awaitable_value(
                        return_type, field_details_list, raw_info, path, result, position_context
                    )
                completed = self.complete_value(
                    return_type, field_details_list, raw_info, path, result, position_context
                )
            if type(completed) not in SETTLED and self.is_awaitable(completed):
                return self._await_completed(completed, return_type, field_details_list, path)
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, field_details_list, path)
            return None
        return completed

    async def _complete_awaited(
        self,
        plan: _Direct,
        parent_type: GraphQLObjectType,
        details: Any,
        path: Path,
        result: Any,
        position_context: Any,
    ) -> Any:
        """As `complete_awaitable_value` completes an async resolver's result, its usual results
        completed in place."""
        return_type = plan.field_def.type
        try:
            resolved = await self.with_abort_signal(result)
            completed = self._complete_in_place(plan, details, path, resolved, position_context)
            if completed is Undefined:
                info = self._resolve_info(plan, details, parent_type, path)
                completed = self.complete_value(
                    return_type, details, info, path, resolved, position_context
                )
            if self.is_awaitable(completed):
                completed = await completed
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, details, path)
            completed = None
        return completed

    def _resolve_info(
        self, plan: _Direct, details: Any, parent_type: GraphQLObjectType, path: Path
    ) -> Any:
        return self.build_resolve_info(plan.field_def, to_nodes(details), parent_type, path)

    async def _await_completed(
        self, completed: Awaitable[Any], return_type: GraphQLOutputType, details: Any, path: Path
    ) -> Any:
        """As `execute_field` awaits a completion that turned out asynchronous."""
        try:
            return await completed
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, details, path)
            return None

    def _complete_in_place(
        self, plan: _Direct, details: Any, path: Path, result: Any, position_context: Any
    ) -> Any:
        """The completed result, or Undefined where `complete_value` must complete it."""
        if result is None:
            return Undefined if plan.non_null else None
        shape = plan.shape
        if shape == _OBJECT:
            if isinstance(result, Exception) or self.is_awaitable(result):
                return Undefined
            return self._execute_object(
                cast(GraphQLObjectType, plan.object_type), details, path, result, position_context
            )
        if shape == _LEAF:
            return _coerced(cast(Callable[[Any], Any], plan.coerce), result)
        if shape == _OBJECTS:
            return self._complete_objects(plan, details, path, result, position_context)
        if shape == _LEAVES and type(result) is list:
            coerce = cast(Callable[[Any], Any], plan.coerce)
            leaves = [_coerced(coerce, item) for item in result]
            return Undefined if Undefined in leaves else leaves
        return Undefined

    def _complete_objects(
        self,
        plan: _Direct,
        details: Any,
        path: Path,
        items: Any,
        position_context: Any,
        below: list[tuple[_Step, ...] | None] | None = None,
    ) -> Any:
        """A list of present objects, completed as `complete_iterable_value` completes it;
        `below` the steps of their selection, as an inline resolver's step keeps them."""
        if type(items) is not list:
            return Undefined
        is_awaitable = self.is_awaitable
        object_class = plan.object_class
        for item in items:
            if type(item) is not object_class and (
                item is None or isinstance(item, Exception) or is_awaitable(item)
            ):
                return Undefined
        object_type = cast(GraphQLObjectType, plan.object_type)
        item_type = cast(GraphQLOutputType, plan.item_type)
        # The items share their selection: its steps are looked up once for the list.
        if below is None:
            steps = self._object_selection(object_type, details, position_context)
        else:
            steps = self._below(plan, details, below)
        # A compiled selection takes each item's path as a plain tuple, made a `Path` only if
        # something needs one.
        complete = None if steps is None else self._compiled(object_type, steps)
        completed: list[Any] = []
        awaitable_indices: list[int] = []
        for index, item in enumerate(items):
            try:
                if complete is not None:
                    value = complete(self, item, (path, index, None), steps)
                elif steps is None:
                    value = self.collect_and_execute_subfields(
                        object_type, details, path.add_key(index, None), item, position_context
                    )
                else:
                    value = self._execute_steps(
                        object_type, item, path.add_key(index, None), steps, None
                    )
            except Exception as raw_error:
                self.handle_field_error(raw_error, item_type, details, path.add_key(index, None))
                value = None
            else:
                if type(value) is not dict and is_awaitable(value):
                    value = self._await_completed(
                        value, item_type, details, path.add_key(index, None)
                    )
                    awaitable_indices.append(index)
            completed.append(value)
        if not awaitable_indices:
            return completed
        return gathered(completed, awaitable_indices)


# Compiled selections by shape: the parent type, then each step's key, plan and nested function
# (by identity, each kept alive by the entry so no identity is reused while it is cached).
_COMPILED: dict[tuple[Any, ...], tuple[Callable[..., Any], tuple[Any, ...]]] = {}
_MAX_COMPILED = 512


def _compiled_selection(parent_type: GraphQLObjectType, parts: list[Part]) -> Callable[..., Any]:
    """The function of a selection of this shape: compiled once per process and shape (the
    shapes a client sends are few; past `_MAX_COMPILED` the cache starts again)."""
    kept = (parent_type, *((part.plan, part.nested) for part in parts))
    key = (id(parent_type), *((part.key, id(part.plan), id(part.nested)) for part in parts))
    cached = _COMPILED.get(key)
    if cached is not None:
        return cached[0]
    if len(_COMPILED) >= _MAX_COMPILED:
        _COMPILED.clear()
    complete = compile_selection(parent_type, parts)
    _COMPILED[key] = (complete, kept)
    return complete


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


def _coerced(coerce: Callable[[Any], Any], value: Any) -> Any:
    """A leaf value coerced for output; Undefined where the standard path must word the error."""
    if value is None or isinstance(value, Exception):
        return Undefined
    try:
        coerced = coerce(value)
    except Exception:
        return Undefined
    return Undefined if coerced is None else coerced


def streamline(schema: Any) -> None:
    """Decide, once per field of a built Strawberry schema, what `Executor` may shortcut: its
    plain leaves and the synchronous resolvers it calls directly (plans kept in the GraphQL
    schema's `extensions`; a direct resolver is also set as the field's resolver, for the
    standard path)."""
    graphql_schema: GraphQLSchema = schema._schema
    subscription = graphql_schema.subscription_type
    info_class = _lazy_info(schema.config.info_class)
    plans: FieldPlans = {}
    for graphql_type in graphql_schema.type_map.values():
        if not isinstance(graphql_type, GraphQLObjectType) or graphql_type is subscription:
            continue
        for name, field_def in graphql_type.fields.items():
            plan: FieldPlan | None = _plain_leaf(field_def)
            if plan is None and not schema.exception_handlers:
                plan = _direct_resolver(field_def, info_class)
                if plan is not None:
                    field_def.resolve = _resolve_directly(plan)
            if plan is not None:
                plans.setdefault(graphql_type.name, {})[name] = plan
    graphql_schema.extensions = {**graphql_schema.extensions, FIELD_PLANS: plans}


def _direct_resolver(field_def: GraphQLField, info_class: type[Any]) -> _Direct | None:
    field = field_def.extensions.get(_DEFINITION)
    if not isinstance(field, StrawberryField) or type(field).get_result is not (
        StrawberryField.get_result
    ):
        return None
    resolver = field.base_resolver
    if (
        resolver is None
        or field.extensions
        or field.arguments
        or field_def.args
        or resolver.root_parameter is not None
        or resolver.parent_parameter is not None
        or resolver.self_parameter is None
    ):
        return None
    info_parameter = resolver.info_parameter
    return_type = field_def.type
    non_null = isinstance(return_type, GraphQLNonNull)
    named = return_type.of_type if isinstance(return_type, GraphQLNonNull) else return_type
    shape, object_type, coerce, item_type = _OTHER, None, None, None
    if isinstance(named, GraphQLList):
        item_type = named.of_type
        item = item_type.of_type if isinstance(item_type, GraphQLNonNull) else item_type
        if isinstance(item, GraphQLObjectType) and item.is_type_of is None:
            shape, object_type = _OBJECTS, item
        elif isinstance(item, GraphQLScalarType | GraphQLEnumType):
            shape, coerce = _LEAVES, item.coerce_output_value
    elif isinstance(named, GraphQLObjectType) and named.is_type_of is None:
        shape, object_type = _OBJECT, named
    elif isinstance(named, GraphQLScalarType | GraphQLEnumType):
        shape, coerce = _LEAF, named.coerce_output_value
    return _Direct(
        field_def=field_def,
        function=cast(Callable[..., Any], resolver.wrapped_func),
        info_name=None if info_parameter is None else info_parameter.name,
        field=field,
        info_class=info_class,
        is_async=field.is_async,
        non_null=non_null,
        shape=shape,
        object_type=object_type,
        coerce=coerce,
        item_type=item_type,
        inline=info_parameter is None and not field.is_async and shape in (_OBJECT, _OBJECTS),
        object_class=_object_class(object_type),
    )


def _object_class(object_type: GraphQLObjectType | None) -> type[Any] | None:
    """The Strawberry type behind `object_type`, if it is one (else nothing matches it)."""
    definition = None if object_type is None else object_type.extensions.get(_DEFINITION)
    origin = getattr(definition, "origin", None)
    return origin if isinstance(origin, type) else None


def _resolve_directly(plan: _Direct) -> Callable[[Any, Any], Any]:
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


def field_nodes(info: Any) -> list[Any]:
    """The field nodes of a resolver's `Info`, without building graphql-core's resolve info when
    `Executor` made the `Info` lazily."""
    place = getattr(info, "_place", None)
    if place is not None:
        return to_nodes(place[1])
    return list(info._raw_info.field_nodes)


def _lazy_info(info_class: type[Any]) -> type[Any]:
    """The schema's `Info` class as `Executor` hands it to a resolver it calls directly: made from
    the field's place, graphql-core's resolve info built on first use. Most resolvers of a page
    read only the context (the loaders), and a resolve info per field costs more than the field.
    """

    class LazyInfo(info_class):  # type: ignore[misc]
        __doc__ = info_class.__doc__

        def __init__(
            self,
            executor: Executor,
            plan: _Direct,
            details: Any,
            parent_type: GraphQLObjectType,
            path: Path,
        ) -> None:
            self._executor = executor
            self._place = (plan, details, parent_type, path)
            self._field = plan.field

        @classmethod
        def made(cls, raw_info: Any, field: StrawberryField) -> Any:
            """An `Info` of a resolve info already built (the standard path)."""
            return info_class(_raw_info=raw_info, _field=field)

        @property
        def context(self) -> Any:
            return self._executor.context_value

        @functools.cached_property
        def _raw_info(self) -> Any:
            return self._executor._resolve_info(*self._place)

    LazyInfo.__name__ = LazyInfo.__qualname__ = info_class.__name__
    return LazyInfo
