"""The executor's resolver path at execution: a resolver called directly, and its result
completed in place where it is usual.

An async resolver's result is awaited as graphql-core awaits it. Usual results are completed in
place: null where the type allows it, an object of a concrete type without `is_type_of` (its
selection's steps looked up once per object, then executed as graphql-core would), a list of such
objects or of leaves with no null, exception or awaitable among them, a leaf that coerces. Any
other result — an exception, an awaitable, null where the type is non-null, an item that is not
plain — is completed by graphql-core's own `complete_value` with the same resolve info, and the
resolver is not called again. An exception is handled as graphql-core handles it.

Which resolvers take this path is decided when the schema is built (`api/field_plans.py`);
`Executor` (`api/execution.py`) takes these methods from `ResolverPath`. The `Info` such a
resolver is handed is made here too (`lazy_info`): its resolve info built on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from graphql import GraphQLObjectType, GraphQLOutputType
from graphql.execution.executor import to_nodes
from graphql.pyutils import Path, Undefined
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.types.field import StrawberryField

from agent_engine.api.compiled import SETTLED, gathered
from agent_engine.api.field_plans import (
    SHAPE_LEAF,
    SHAPE_LEAVES,
    SHAPE_OBJECT,
    SHAPE_OBJECTS,
    DirectPlan,
)
from agent_engine.api.leaf_path import coerced_output

if TYPE_CHECKING:
    from agent_engine.api.field_plans import FieldStep


class ResolverPath(StrawberryGraphQLCoreExecutionContext):
    """graphql-core's executor (as Strawberry sets it up) with the methods for the resolvers it
    calls directly; `Executor` is the class that runs (this one only holds its resolver path)."""

    if TYPE_CHECKING:
        # Defined by the subclasses: `CompiledPath` (api/compiled_path.py) and `Executor`.

        def _compiled(
            self, parent_type: GraphQLObjectType, steps: tuple[FieldStep, ...]
        ) -> Callable[..., Any] | None: ...

        def _execute_object(
            self,
            object_type: GraphQLObjectType,
            details: Any,
            path: Path,
            source: Any,
            position_context: Any,
        ) -> Any: ...

        def _object_selection(
            self, object_type: GraphQLObjectType, details: Any, position_context: Any
        ) -> tuple[FieldStep, ...] | None: ...

        def _execute_steps(
            self,
            parent_type: GraphQLObjectType,
            source_value: Any,
            path: Path | None,
            steps: tuple[FieldStep, ...],
            position_context: Any,
        ) -> Any: ...

    def _complete_inline(
        self,
        plan: DirectPlan,
        parent_type: GraphQLObjectType,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[FieldStep, ...] | None],
        position_context: Any,
    ) -> Any:
        """An inline resolver's result completed: null where its type allows it, its usual
        objects in place, anything else as `_complete_direct` completes it."""
        if result is None and not plan.non_null:
            return None
        if position_context is not None:
            completed = Undefined
        elif plan.shape == SHAPE_OBJECT:
            completed = self._inline_object(plan, details, path, result, below)
        else:
            completed = self._inline_objects(plan, details, path, result, below)
        if completed is Undefined:
            completed = self._complete_direct(
                plan, parent_type, details, path, result, position_context, None
            )
        return completed

    def _below(
        self, plan: DirectPlan, details: Any, below: list[tuple[FieldStep, ...] | None]
    ) -> tuple[FieldStep, ...] | None:
        """The steps of an inline resolver's objects (`FieldStep.below`)."""
        if below:
            return below[0]
        steps = self._object_selection(cast(GraphQLObjectType, plan.object_type), details, None)
        below.append(steps)
        return steps

    def _inline_object(
        self,
        plan: DirectPlan,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[FieldStep, ...] | None],
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
        plan: DirectPlan,
        details: Any,
        path: Path,
        result: Any,
        below: list[tuple[FieldStep, ...] | None],
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
        plan: DirectPlan,
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
        plan: DirectPlan,
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
        plan: DirectPlan,
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
        self, plan: DirectPlan, details: Any, parent_type: GraphQLObjectType, path: Path
    ) -> Any:
        return self.build_resolve_info(plan.field_def, to_nodes(details), parent_type, path)

    async def _await_completed(
        self,
        completed: Awaitable[Any],
        return_type: GraphQLOutputType,
        details: Any,
        path: Path,
    ) -> Any:
        """As `execute_field` awaits a completion that turned out asynchronous."""
        try:
            return await completed
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, details, path)
            return None

    def _complete_in_place(
        self,
        plan: DirectPlan,
        details: Any,
        path: Path,
        result: Any,
        position_context: Any,
    ) -> Any:
        """The completed result, or Undefined where `complete_value` must complete it."""
        if result is None:
            return Undefined if plan.non_null else None
        shape = plan.shape
        if shape == SHAPE_OBJECT:
            if isinstance(result, Exception) or self.is_awaitable(result):
                return Undefined
            return self._execute_object(
                cast(GraphQLObjectType, plan.object_type), details, path, result, position_context
            )
        if shape == SHAPE_LEAF:
            return coerced_output(cast(Callable[[Any], Any], plan.coerce), result)
        if shape == SHAPE_OBJECTS:
            return self._complete_objects(plan, details, path, result, position_context)
        if shape == SHAPE_LEAVES and type(result) is list:
            coerce = cast(Callable[[Any], Any], plan.coerce)
            leaves = [coerced_output(coerce, item) for item in result]
            return Undefined if Undefined in leaves else leaves
        return Undefined

    def _complete_objects(
        self,
        plan: DirectPlan,
        details: Any,
        path: Path,
        items: Any,
        position_context: Any,
        below: list[tuple[FieldStep, ...] | None] | None = None,
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


def field_nodes(info: Any) -> list[Any]:
    """The field nodes of a resolver's `Info`, without building graphql-core's resolve info when
    `Executor` made the `Info` lazily."""
    place = getattr(info, "_place", None)
    if place is not None:
        return to_nodes(place[1])
    return list(info._raw_info.field_nodes)


def lazy_info(info_class: type[Any]) -> type[Any]:
    """The schema's `Info` class as `Executor` hands it to a resolver it calls directly: made from
    the field's place, graphql-core's resolve info built on first use. Most resolvers of a page
    read only the context (the loaders), and a resolve info per field costs more than the field.
    """

    class LazyInfo(info_class):  # type: ignore[misc]
        __doc__ = info_class.__doc__

        def __init__(
            self,
            executor: ResolverPath,
            plan: DirectPlan,
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
