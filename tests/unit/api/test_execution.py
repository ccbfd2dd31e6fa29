"""The executor's shortcuts (plain leaves in place, resolvers called directly) answer exactly as
graphql-core and Strawberry do on their own path: data, errors, messages and paths."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest
import strawberry
from strawberry.types import Info

from agent_engine.api.execution import Executor, streamline


@strawberry.enum
class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Item:
    id: strawberry.ID
    name: str
    size: int | None
    colour: Colour
    tags: list[str]
    mandatory: str  # set to None by some items: a non-null field returning null

    @strawberry.field
    def double(self) -> int | None:
        return None if self.size is None else self.size * 2

    @strawberry.field
    def where(self, info: Info) -> str:
        return f"{info.field_name}@{info.path.prev.key if info.path.prev else '-'}"

    @strawberry.field
    def broken(self) -> str | None:
        raise ValueError(f"item {self.id} cannot say")

    @strawberry.field
    def later(self) -> str:
        async def value() -> str:
            await asyncio.sleep(0)
            return f"later {self.id}"

        return value()  # type: ignore[return-value]

    @strawberry.field
    def child(self) -> Item | None:
        return None if self.size is None else _item(int(self.id) + 100, size=None)

    @strawberry.field
    def times(self, by: int = 2) -> int:
        return (self.size or 0) * by

    # Resolved objects and lists, in every shape the executor completes in place and every one
    # it hands back to graphql-core.
    @strawberry.field
    def kids(self, info: Info) -> list[Item]:
        number = int(self.id)
        if number == 3:
            return [_item(31), None]  # type: ignore[list-item]  # null in a non-null list
        return [
            _item(number * 10 + 1),
            _item(number * 10 + 2, mandatory=None if number == 2 else "m"),
        ]

    @strawberry.field
    def maybe_kids(self) -> list[Item | None] | None:
        number = int(self.id)
        if number == 1:
            return [None, _item(12)]
        if number == 4:
            return None
        if number == 3:
            return [_item(31), ValueError("no kid 32")]  # type: ignore[list-item]
        return [_item(21, size="bad")]

    @strawberry.field
    def must(self) -> Item:
        return None if self.size is None else _item(int(self.id) + 200)  # type: ignore[return-value]

    @strawberry.field
    def fails(self) -> Item:
        raise RuntimeError(f"no must for {self.id}")

    @strawberry.field
    def scores(self) -> list[int]:
        return [1, 2] if int(self.id) != 4 else [1, "x"]  # type: ignore[list-item]

    @strawberry.field
    def later_kid(self) -> Item | None:
        async def kid() -> Item:
            await asyncio.sleep(0)
            return _item(int(self.id) + 300)

        return kid()  # type: ignore[return-value]

    @strawberry.field
    def later_kids(self) -> list[Item]:
        async def kid() -> Item:
            await asyncio.sleep(0)
            return _item(int(self.id) + 400)

        return [_item(int(self.id) + 500), kid()]  # type: ignore[list-item]

    # Async resolvers: awaited, then completed in place as a synchronous one's result.
    @strawberry.field
    async def soon(self, info: Info) -> Item | None:
        await asyncio.sleep(0)
        number = int(self.id)
        if number == 2:
            raise LookupError(f"no soon item for {number}")
        if number == 4:
            return None
        return _item(number + 600, mandatory=None if number == 3 else "m")

    @strawberry.field
    async def soon_kids(self) -> list[Item]:
        await asyncio.sleep(0)
        number = int(self.id)
        if number == 3:
            return [_item(71), None]  # type: ignore[list-item]  # null in a non-null list
        return [_item(number * 10 + 7), _item(number * 10 + 8)]

    @strawberry.field
    async def soon_where(self, info: Info) -> str:
        selected = [field.name for field in info.selected_fields]
        return f"{info.field_name}@{info.path.as_list()} {selected} {info.operation.operation}"

    @strawberry.field
    def shape(self) -> Shape:
        return Square(side=int(self.id)) if int(self.id) % 2 else Circle(radius=int(self.id))

    @strawberry.field
    def square(self) -> Square | None:
        return Square(side=int(self.id))


@strawberry.interface
class Shape:
    @strawberry.field
    def name(self) -> str:
        return type(self).__name__.lower()


@strawberry.type
class Square(Shape):  # implements an interface: Strawberry gives it an is_type_of
    side: int


@strawberry.type
class Circle(Shape):
    radius: int


def _item(number: int, *, size: int | None = 1, mandatory: Any = "m", **fields: Any) -> Item:
    values: dict[str, Any] = {
        "id": strawberry.ID(str(number)),
        "name": f"item {number}",
        "size": size,
        "colour": Colour.RED if number % 2 else Colour.BLUE,
        "tags": ["a", "b"],
        "mandatory": mandatory,
    }
    return Item(**{**values, **fields})


ITEMS = [
    _item(1),
    _item(2, size=None),
    _item(3, mandatory=None),  # non-null field is null: the item nulls, the list fails
    _item(4, size="seven"),  # an Int that cannot be coerced: a field error
]


@strawberry.type
class Query:
    @strawberry.field
    def items(self) -> list[Item | None]:
        return list(ITEMS)

    @strawberry.field
    async def one(self) -> Item:
        return ITEMS[0]


def _schemas() -> tuple[strawberry.Schema, strawberry.Schema]:
    standard = strawberry.Schema(query=Query, types=[Square, Circle])
    fast = strawberry.Schema(query=Query, types=[Square, Circle], execution_context_class=Executor)
    streamline(fast)
    return standard, fast


QUERIES = [
    "{ items { id name size colour tags double where later child { id name size where } } }",
    "{ items { id mandatory } }",
    "{ items { id broken } }",
    "{ items { n: name, n2: name, times(by: 3) } }",
    "{ one { id name later } }",
    "{ items { ...F } } fragment F on Item { id colour @include(if: false) size @skip(if: true) }",
    "{ items { id kids { id name kids { id where } } } }",
    "{ items { id kids { id mandatory } } }",
    "{ items { id maybeKids { id size where } } }",
    "{ items { id must { id where } } }",
    "{ items { id fails { id } } }",
    "{ items { id scores } }",
    "{ items { id laterKid { id later } laterKids { id later } } }",
    "{ items { id shape { name ... on Square { side } ... on Circle { radius } }"
    " square { side } } }",
    "{ items { id a: kids { id } b: kids { name } kids @include(if: true) { where } } }",
    "{ one { kids { id kids { id kids { id mandatory } } } must { id } } }",
    "{ items { id soon { id mandatory where } soonKids { id where } soonWhere } }",
    "{ one { id soon { id soonKids { id soon { id } } } soonWhere } }",
    # Objects whose selection is plain leaves only, some failing to coerce or null where not.
    "{ items { id maybeKids { id size } must { id size colour } child { size tags } } }",
    "{ items { kids { id mandatory size colour } laterKids { id } } }",
    # Compiled selections (every field a plain leaf or an inline resolver, nested alike): usual
    # objects, an awaitable object and list item, null in a non-null field below, a resolver
    # that raises, a coercion that fails, aliases.
    "{ items { id child { id size child { id size } } maybeKids { id child { size } }"
    " laterKid { id } laterKids { id } must { id mandatory } } }",
    "{ items { c: child { mandatory size } fails { id } square { side } maybeKids { id } } }",
    "{ items { id maybeKids { id must { id size } } } }",
]


def _answer(result: Any) -> dict[str, Any]:
    return {
        "data": result.data,
        "errors": sorted(
            ((e.message, tuple(e.path or ())) for e in result.errors or []),
            key=repr,
        ),
    }


@pytest.mark.parametrize("query", QUERIES)
async def test_the_fast_executor_answers_as_the_standard_one(query: str) -> None:
    standard, fast = _schemas()
    expected = _answer(await standard.execute(query))
    got = _answer(await fast.execute(query))
    assert got == expected
    assert got["data"] is not None


async def test_selections_of_leaves_and_inline_resolvers_are_compiled() -> None:
    """The shortcut the page takes (`api/compiled.py`) is the one these documents exercise."""
    from agent_engine.api import execution

    _, fast = _schemas()
    execution._COMPILED.clear()
    result = await fast.execute("{ items { id child { id child { id } } maybeKids { id } } }")
    assert result.data is not None
    compiled = {key[0]: entry for key, entry in execution._COMPILED.items()}
    # Query { items }, Item { id child maybeKids }, Item { id child }, Item { id }
    assert len(execution._COMPILED) == 4
    assert id(fast._schema.query_type) in compiled


async def test_null_in_a_non_null_leaf_and_a_bad_int_are_errors_with_their_paths() -> None:
    _, fast = _schemas()
    result = await fast.execute("{ items { id mandatory size } }")
    errors = {tuple(e.path or ()): e.message for e in result.errors or []}
    null_error = "Cannot return null for non-nullable field Item.mandatory."
    assert errors[("items", 2, "mandatory")] == null_error
    assert "Int cannot represent non-integer value: 'seven'" in errors[("items", 3, "size")]
    assert result.data is not None
    assert result.data["items"][2] is None  # nulled up to the nullable list item
    assert result.data["items"][0] == {"id": "1", "mandatory": "m", "size": 1}


def test_only_fields_without_arguments_are_rewired() -> None:
    _, fast = _schemas()
    item = fast._schema.type_map["Item"].fields  # type: ignore[attr-defined]
    query = fast._schema.query_type.fields  # type: ignore[union-attr]
    direct = {name for name, f in item.items() if f.resolve.__module__ == Executor.__module__}
    assert direct == {  # not `times` (an argument)
        "double",
        "where",
        "broken",
        "later",
        "child",
        "kids",
        "maybeKids",
        "must",
        "fails",
        "scores",
        "laterKid",
        "laterKids",
        "soon",
        "soonKids",
        "soonWhere",
        "shape",
        "square",
    }
    assert query["one"].resolve.__module__ == Executor.__module__  # async too


async def test_an_extension_that_wraps_resolvers_still_sees_every_field() -> None:
    from strawberry.extensions import SchemaExtension

    seen: list[str] = []

    class Watch(SchemaExtension):
        def resolve(self, _next: Any, root: Any, info: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(info.field_name)
            return _next(root, info, *args, **kwargs)

    fast = strawberry.Schema(query=Query, extensions=[Watch], execution_context_class=Executor)
    streamline(fast)
    result = await fast.execute("{ items { id name } }")
    assert result.data is not None
    assert seen.count("name") == len(ITEMS) and seen.count("id") == len(ITEMS)
