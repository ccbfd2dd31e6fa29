"""Selections compiled to Python: a page's objects completed by straight-line code.

`Executor._execute_steps` walks a selection's steps for each object: per field a tuple unpacked,
its kind tested, a response path made, a call or two. A page completes ~550 objects that way
(100 agents, their models, tools and runs), and that walk cost more than the fields themselves.
A selection whose every step is a plain leaf or an inline resolver (`_Direct.inline`) of objects
whose own selection compiles too is turned, once per process and shape, into one function that
does for an object exactly what the walk does in the usual case:

- a plain leaf read off the object and coerced; an inline resolver called once, its object (of
  exactly its type's class) or list of such objects completed by the nested selection's function;
- response paths made only when something needs one (an error, the standard path), from plain
  tuples passed down meanwhile;
- anything unusual — null where the type is non-null, a coercion that fails, an exception, a
  result of another shape, an awaitable — handed to the executor's own methods for that one
  field, with the resolver's result in hand (a resolver is never called twice; a plain leaf may be
  read again, as the walk reads it again).

The function's source names no value of the request: response keys and attribute names are
GraphQL and Python identifiers written as literals (`repr`), everything else is bound by name.
`tests/unit/api/test_execution.py` holds its answers, errors and paths to graphql-core's.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from graphql.pyutils import Path, Undefined, gather_with_cancel

# The kinds of step a compiled selection takes.
LEAF, OBJECT, OBJECTS = "leaf", "object", "objects"

# Result types that are never awaitable: the usual results skip `is_awaitable`'s checks (here
# and in `execution.Executor`).
SETTLED = frozenset({dict, list, str, int, float, bool, type(None)})

# A selection's results by name, or a list's by index, as they are settled.
_Settled = TypeVar("_Settled", dict[str, Any], list[Any])


def real_path(path: Any) -> Path | None:
    """The response path of a compiled function's plain `(prev, key, typename)` tuple."""
    if path is None or type(path) is Path:
        return path
    prev, key, typename = path
    return Path(real_path(prev), key, typename)


class Part(NamedTuple):
    """One step of a selection as the compiler takes it."""

    kind: str  # LEAF, OBJECT or OBJECTS
    key: str  # the response key
    plan: Any  # the step's plan (`execution._Leaf` or `execution._Direct`)
    nested: Callable[..., Any] | None  # the objects' selection, compiled


def compile_selection(parent_type: Any, parts: Sequence[Part]) -> Callable[..., Any]:
    """`complete(ex, source, path, steps)`: the object's results (a dict), or an awaitable of
    them when a field is awaited. `path` is the object's response path (a `Path` or a plain
    tuple), `steps` the execution's steps of this selection (for the standard path)."""
    typename = parent_type.name
    names: dict[str, Any] = {
        "PT": parent_type,
        "TN": typename,
        "UNDEFINED": Undefined,
        "SETTLED": SETTLED,
        "real_path": real_path,
        "gathered": gathered,
        "Exception": Exception,
        "isinstance": isinstance,
        "type": type,
        "list": list,
        "dict": dict,
        "enumerate": enumerate,
        "getattr": getattr,
    }
    lines = [
        "def complete(ex, src, path, steps):",
        "    r = {}",
        "    awaiting = None",
        "    try:",
    ]
    for index, part in enumerate(parts):
        names[f"P{index}"] = part.plan
        body = {LEAF: _leaf, OBJECT: _object, OBJECTS: _objects}[part.kind](index, part, names)
        lines.extend("        " + line for line in body)
    lines += [
        "    except Exception:",
        "        if awaiting:",
        "            ex.settle_in_background([r[k] for k in awaiting])",
        "        raise",
        "    if awaiting is None:",
        "        return r",
        "    return gathered(r, awaiting)",
    ]
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<selection on {typename}>", "exec"), names, namespace)
    complete: Callable[..., Any] = namespace["complete"]
    return complete


def _settle(key: str, value: str) -> list[str]:
    """Lines that set a result the standard path produced (maybe Undefined, maybe awaitable)."""
    return [
        f"x = {value}",
        "if x is not UNDEFINED:",
        f"    r[{key!r}] = x",
        "    if type(x) not in SETTLED and ex.is_awaitable(x):",
        *("        " + line for line in _awaited("awaiting", repr(key))),
    ]


def _awaited(waiting: str, mark: str) -> list[str]:
    """Lines that note `mark` (a response key, an index) among the results awaited later."""
    return [f"{waiting} = {waiting} or []", f"{waiting}.append({mark})"]


def _nested(index: int, call: str, at: str, return_type: str, waiting: str, mark: str) -> list[str]:
    """Lines that complete one object by the nested selection's function (`call`) into `c`: its
    error handled at the response path `at` as a field of `return_type`, an awaited result
    noted as `mark` in `waiting`."""
    step = f"steps[{index}]"
    return [
        "try:",
        f"    c = {call}",
        "except Exception as error:",
        f"    c = ex._nested_failed(error, {return_type}, {step}, {at})",
        "else:",
        "    if type(c) is not dict:",
        f"        c = ex._await_completed(c, {return_type}, {step}.field_details_list,"
        f" real_path({at}))",
        *("        " + line for line in _awaited(waiting, mark)),
    ]


def _read(attribute: str) -> str:
    if attribute.isidentifier() and not keyword.iskeyword(attribute):
        return f"src.{attribute}"
    return f"getattr(src, {attribute!r})"


def _leaf(index: int, part: Part, names: dict[str, Any]) -> list[str]:
    names[f"C{index}"] = part.plan.coerce
    key = part.key
    slow = _settle(key, f"ex._slow_leaf(PT, src, path, steps[{index}])")
    on_null = [f"r[{key!r}] = None"] if not part.plan.non_null else ["ok = False"]
    return [
        "ok = True",
        "try:",
        f"    v = {_read(part.plan.attribute)}",
        "    if v is None:",
        *("        " + line for line in on_null),
        "    elif isinstance(v, Exception):",
        "        ok = False",
        "    else:",
        f"        v = C{index}(v)",
        "        if v is None:",
        "            ok = False",
        "        else:",
        f"            r[{key!r}] = v",
        "except Exception:",
        "    ok = False",
        "if not ok:",
        *("    " + line for line in slow),
    ]


def _called(index: int, part: Part, handled: list[str]) -> list[str]:
    """An inline resolver called once, then `handled` with its result in `v`; on an exception
    the field is null (or the error propagates, as the executor's `handle_field_error` decides)."""
    return [
        "try:",
        f"    v = P{index}.function(src)",
        "except Exception as error:",
        f"    r[{part.key!r}] = ex._inline_failed(error, PT, path, steps[{index}])",
        "else:",
        *("    " + line for line in handled),
    ]


def _object(index: int, part: Part, names: dict[str, Any]) -> list[str]:
    plan, key = part.plan, part.key
    names[f"K{index}"] = plan.object_class
    names[f"N{index}"] = part.nested
    step = f"steps[{index}]"
    # Null where the type allows it; else (as any other result) the standard path's.
    null = [] if plan.non_null else ["if v is None:", f"    r[{key!r}] = None"]
    completed = _nested(
        index,
        f"N{index}(ex, v, fp, {step}.below[0])",
        "fp",
        f"P{index}.field_def.type",
        "awaiting",
        repr(key),
    )
    handled = [
        *null,
        f"{'elif' if null else 'if'} type(v) is K{index}:",
        f"    fp = (path, {key!r}, TN)",
        *("    " + line for line in completed),
        f"    r[{key!r}] = c",
        "else:",
        *("    " + line for line in _settle(key, f"ex._slow_inline(PT, path, {step}, v)")),
    ]
    return _called(index, part, handled)


def _objects(index: int, part: Part, names: dict[str, Any]) -> list[str]:
    plan, key = part.plan, part.key
    names[f"K{index}"] = plan.object_class
    names[f"N{index}"] = part.nested
    step = f"steps[{index}]"
    item = _nested(
        index, f"N{index}(ex, item, ip, below)", "ip", f"P{index}.item_type", "waiting", "at"
    )
    fast = [
        f"fp = (path, {key!r}, TN)",
        f"below = {step}.below[0]",
        "items = []",
        "waiting = None",
        "try:",
        "    for at, item in enumerate(v):",
        "        ip = (fp, at, None)",
        *("        " + line for line in item),
        "        items.append(c)",
        "except Exception as error:",
        f"    r[{key!r}] = ex._nested_failed(error, P{index}.field_def.type, {step}, fp)",
        "else:",
        "    if waiting is None:",
        f"        r[{key!r}] = items",
        "    else:",
        f"        r[{key!r}] = ex._await_completed(gathered(items, waiting),"
        f" P{index}.field_def.type, {step}.field_details_list, real_path(fp))",
        *("        " + line for line in _awaited("awaiting", repr(key))),
    ]
    checked = [
        "ok = type(v) is list",
        "if ok:",
        "    for item in v:",
        f"        if type(item) is not K{index}:",
        "            ok = False",
        "            break",
        "if ok:",
        *("    " + line for line in fast),
        "else:",
        *("    " + line for line in _settle(key, f"ex._slow_inline(PT, path, {step}, v)")),
    ]
    if not plan.non_null:
        checked = [
            "if v is None:",
            f"    r[{key!r}] = None",
            "else:",
            *("    " + line for line in checked),
        ]
    return _called(index, part, checked)


async def gathered(results: _Settled, awaiting: list[Any]) -> _Settled:
    """As graphql-core's `execute_fields` and `complete_iterable_value` settle the fields (by
    name) or items (by index) that returned awaitables."""
    if len(awaiting) == 1:
        key = awaiting[0]
        results[key] = await results[key]
    else:
        settled = await gather_with_cancel(*(results[key] for key in awaiting))
        for key, value in zip(awaiting, settled, strict=True):
            results[key] = value
    return results
