"""The executor's compiled path: a selection of plain leaves and inline resolvers run as one
generated function per shape.

A selection whose every field is a plain leaf or an inline resolver (synchronous, no `Info`, an
object or a list of objects), the selections below alike, is compiled by `api/compiled.py` once
per process and shape; the usual case runs in straight-line code, anything else is handed back to
the methods here (and `Executor`'s) for that one field. `Executor` (`api/execution.py`) takes
these methods from `CompiledPath`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from graphql import GraphQLObjectType, GraphQLOutputType
from graphql.pyutils import Path

from agent_engine.api.compiled import LEAF, OBJECT, OBJECTS, Part, compile_selection, real_path
from agent_engine.api.field_plans import SHAPE_OBJECT, DirectPlan
from agent_engine.api.leaf_path import LeafPlan
from agent_engine.api.resolver_path import ResolverPath

if TYPE_CHECKING:
    from agent_engine.api.field_plans import FieldStep


class CompiledPath(ResolverPath):
    """The resolver path's executor with the methods for compiled selections; `Executor` is the
    class that runs (this one only holds its compiled path)."""

    _compiled_steps: dict[int, tuple[Any, Callable[..., Any] | None]] | None = None

    def _compiled(
        self, parent_type: GraphQLObjectType, steps: tuple[FieldStep, ...]
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
        self, parent_type: GraphQLObjectType, steps: tuple[FieldStep, ...]
    ) -> Callable[..., Any] | None:
        """The selection's function, its objects' selections compiled first (as deep as the
        document, which validation bounds); None when any step is not a leaf or inline."""
        parts: list[Part] = []
        for step in steps:
            plan = step.plan
            if type(plan) is LeafPlan:
                parts.append(Part(LEAF, step.response_name, plan, None))
                continue
            if type(plan) is not DirectPlan or not plan.inline or plan.object_class is None:
                return None
            object_type = cast(GraphQLObjectType, plan.object_type)
            below = self._below(plan, step.field_details_list, step.below)
            nested = None if below is None else self._compiled(object_type, below)
            if nested is None:
                return None
            kind = OBJECT if plan.shape == SHAPE_OBJECT else OBJECTS
            parts.append(Part(kind, step.response_name, plan, nested))
        return compiled_selection(parent_type, parts)

    def _slow_leaf(
        self, parent_type: GraphQLObjectType, source: Any, path: Any, step: FieldStep
    ) -> Any:
        """A compiled selection's plain leaf that was not usual: the standard path's answer."""
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        return self.execute_field(parent_type, source, step.field_details_list, field_path, None)

    def _inline_failed(
        self,
        raw_error: Exception,
        parent_type: GraphQLObjectType,
        path: Any,
        step: FieldStep,
    ) -> None:
        """A compiled selection's inline resolver raised: handled as the field's error."""
        plan = cast(DirectPlan, step.plan)
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        self.handle_field_error(raw_error, plan.field_def.type, step.field_details_list, field_path)

    def _nested_failed(
        self,
        raw_error: Exception,
        return_type: GraphQLOutputType,
        step: FieldStep,
        path: Any,
    ) -> None:
        """An object (or list) a compiled selection completed raised: handled at `path`."""
        at = cast(Path, real_path(path))
        self.handle_field_error(raw_error, return_type, step.field_details_list, at)

    def _slow_inline(
        self, parent_type: GraphQLObjectType, path: Any, step: FieldStep, result: Any
    ) -> Any:
        """A compiled selection's inline resolver returned something unusual: completed as
        `_execute_steps` completes it, with the result in hand."""
        field_path = Path(real_path(path), step.response_name, parent_type.name)
        return self._complete_inline(
            cast(DirectPlan, step.plan),
            parent_type,
            step.field_details_list,
            field_path,
            result,
            step.below,
            None,
        )


# Compiled selections by shape: the parent type, then each step's key, plan and nested function
# (by identity, each kept alive by the entry so no identity is reused while it is cached).
COMPILED: dict[tuple[Any, ...], tuple[Callable[..., Any], tuple[Any, ...]]] = {}
MAX_COMPILED = 512


def compiled_selection(parent_type: GraphQLObjectType, parts: list[Part]) -> Callable[..., Any]:
    """The function of a selection of this shape: compiled once per process and shape (the
    shapes a client sends are few; past `MAX_COMPILED` the cache starts again)."""
    kept = (parent_type, *((part.plan, part.nested) for part in parts))
    key = (id(parent_type), *((part.key, id(part.plan), id(part.nested)) for part in parts))
    cached = COMPILED.get(key)
    if cached is not None:
        return cached[0]
    if len(COMPILED) >= MAX_COMPILED:
        COMPILED.clear()
    complete = compile_selection(parent_type, parts)
    COMPILED[key] = (complete, kept)
    return complete
