"""The structure's rules (issue 42), checked on the source with `ast`, so they stay:

- **Statements live in `db/`.** No `sqlalchemy.text(...)` and no SQL string literal
  (`SELECT … FROM`, `INSERT INTO`, `UPDATE … SET`, `DELETE FROM`, upper case as the code writes
  them; docstrings are prose and not read) in a module outside `agent_engine.db`, except
  `EXEMPT_FROM_DB_RULE`.
- **No module over 450 lines** (`wc -l`: docstrings and comments count).
- **One name per class in a layer**: a layer is a top-level package under `agent_engine` with its
  subpackages (`api/` with `api/live/`), or a top-level module; two classes of one name in a layer
  are two things a reader (and a traceback) cannot tell apart.
- **No import running back up the layers** (`LAYERS`, lowest first; imports under `TYPE_CHECKING`
  and inside functions included, the graph of `test_import_cycles.py`). A package may import its
  own layer's peers (the cycle test keeps those acyclic) and anything lower. The arrows that run
  up today are listed in `KNOWN_UPWARD_IMPORTS` with why; a new one fails, and so does a listed
  one that is gone (delete it from the list: the list only shrinks).

Each checker is a function of plain input, tested below on a synthetic violation.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.unit.test_import_cycles import PACKAGE, ROOT, _imports, _modules

MAX_LINES = 450

# Modules whose statements stay where they are, and why.
EXEMPT_FROM_DB_RULE = {
    # The Knowledge Store stand-in: a neighbouring service's own data layer (its own tables and
    # importer), kept whole so that it can be swapped for the real store; the engine's rules for
    # its own statements do not reach into it.
    f"{PACKAGE}.knowledge": "the Knowledge Store stand-in: a neighbour's own data layer",
}

# Lowest first. A module may import from its own layer and from lower ones.
LAYERS: tuple[frozenset[str], ...] = (
    # No I/O rules and small helpers that import nothing of the engine.
    frozenset({"domain", "bounded_reads", "collector", "embedded", "server_thread"}),
    frozenset({"settings"}),
    frozenset({"db"}),
    frozenset({"agents", "knowledge", "observability", "testing"}),
    frozenset({"oauth", "delivery"}),
    frozenset({"tool_sources"}),
    frozenset({"runtime"}),
    frozenset({"runs"}),
    frozenset({"workers", "demo"}),
    frozenset({"api"}),
    frozenset({"allinone", "cli", "cli_export", "cli_settings"}),
)

# (importer, imported) module pairs that run up the layers today: debts, each with its reason.
KNOWN_UPWARD_IMPORTS = {
    (f"{PACKAGE}.settings", f"{PACKAGE}.oauth.keys"): (
        "typing only (TYPE_CHECKING): the settings hand out the token keys they parse"
    ),
    (f"{PACKAGE}.agents.admin", f"{PACKAGE}.runs.resume_gate"): (
        "an admin's resume re-opens parked runs through the runs' resume gate"
    ),
    (f"{PACKAGE}.agents.definitions", f"{PACKAGE}.runs.resume_gate"): (
        "an owner's resume re-opens parked runs through the runs' resume gate"
    ),
    (f"{PACKAGE}.agents.deletion", f"{PACKAGE}.runs.resume_gate"): (
        "a deleted agent's parked runs are ended through the runs' resume gate"
    ),
    (f"{PACKAGE}.oauth.callback", f"{PACKAGE}.api.state"): (
        "the OAuth callback is a route of the API app and reads the app's state"
    ),
    (f"{PACKAGE}.tool_sources.sync", f"{PACKAGE}.runtime.tools.mcp"): (
        "the sync validates a tool's input schema with the runtime's own validator"
    ),
}

# SQL as the code writes it: upper-case keywords, a statement's shape (not a word in a sentence).
SQL_STATEMENT = re.compile(
    r"\bSELECT\b[^\n]*?\bFROM\s+\w"
    r"|\bSELECT\s+(EXISTS|COALESCE|1\b|\w+\()"
    r"|\bINSERT\s+INTO\s+\w"
    r"|\bUPDATE\s+\w+(\s+AS\s+\w+)?\s+SET\b"
    r"|\bDELETE\s+FROM\s+\w"
)


def layer_of(module: str) -> str:
    """`agent_engine.api.live.bus` → `api`; a top-level module is its own layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _sqlalchemy_text_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to `sqlalchemy.text`, and names bound to the `sqlalchemy` module itself."""
    functions, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            functions |= {a.asname or a.name for a in node.names if a.name == "text"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "sqlalchemy"}
    return functions, modules


def statements_in(source: str, filename: str = "<source>") -> list[str]:
    """Where `source` writes a statement: `line N: text(...)` or `line N: '<the literal>'`."""
    tree = ast.parse(source, filename)
    functions, modules = _sqlalchemy_text_names(tree)
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Name) and func.id in functions) or (
                isinstance(func, ast.Attribute)
                and func.attr == "text"
                and isinstance(func.value, ast.Name)
                and func.value.id in modules
            ):
                found.append((node.lineno, "text(...)"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SQL_STATEMENT.search(node.value)
        ):
            found.append((node.lineno, repr(node.value.strip()[:60])))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def statements_outside_db(
    sources: Mapping[str, str], exempt: Iterable[str] = EXEMPT_FROM_DB_RULE
) -> dict[str, list[str]]:
    """Module → its statements, for the modules outside `agent_engine.db` and the exemptions."""
    allowed = (f"{PACKAGE}.db", *exempt)
    return {
        name: hits
        for name, source in sorted(sources.items())
        if not any(name == a or name.startswith(a + ".") for a in allowed)
        and (hits := statements_in(source, name))
    }


def oversized(line_counts: Mapping[str, int], limit: int = MAX_LINES) -> dict[str, int]:
    """The modules over `limit` lines, longest first."""
    return dict(
        sorted(
            ((name, lines) for name, lines in line_counts.items() if lines > limit),
            key=lambda item: -item[1],
        )
    )


def _classes(body: list[ast.stmt]) -> Iterable[str]:
    """A module's classes, including those under `if TYPE_CHECKING:`/`try:` at module level."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.If | ast.Try):
            yield from _classes(node.body)
            yield from _classes(node.orelse)


def duplicate_classes(sources: Mapping[str, str]) -> dict[tuple[str, str], list[str]]:
    """(layer, class name) → the modules defining it, for names defined more than once."""
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, source in sorted(sources.items()):
        for cls in _classes(ast.parse(source, name).body):
            where[(layer_of(name), cls)].append(name)
    return {key: modules for key, modules in where.items() if len(modules) > 1}


def upward_imports(
    graph: Mapping[str, Iterable[str]], layers: tuple[frozenset[str], ...] = LAYERS
) -> set[tuple[str, str]]:
    """The (importer, imported) edges whose target is in a higher layer than the importer."""
    rank = {package: index for index, group in enumerate(layers) for package in group}
    found = set()
    for importer, targets in graph.items():
        here = rank.get(layer_of(importer))
        for target in targets:
            there = rank.get(layer_of(target))
            if here is not None and there is not None and there > here:
                found.add((importer, target))
    return found


def _sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in _modules().items()}


# The package as it is.


def test_statements_live_in_db() -> None:
    found = statements_outside_db(_sources())
    assert found == {}, "statements outside db/ (move them into a db/ module):\n" + "\n".join(
        f"  {name}: {', '.join(hits)}" for name, hits in found.items()
    )


def test_the_exempt_modules_exist() -> None:
    modules = _modules()
    assert all(name in modules for name in EXEMPT_FROM_DB_RULE)


def test_no_module_is_over_450_lines() -> None:
    counts = {name: len(path.read_bytes().splitlines()) for name, path in _modules().items()}
    found = oversized(counts)
    assert found == {}, f"modules over {MAX_LINES} lines (split them by concept):\n" + "\n".join(
        f"  {(_modules()[name]).relative_to(ROOT.parent)}: {lines}" for name, lines in found.items()
    )


def test_a_class_name_is_defined_once_in_a_layer() -> None:
    found = duplicate_classes(_sources())
    assert found == {}, "class names defined twice in one layer:\n" + "\n".join(
        f"  {layer}/: {cls} in {', '.join(modules)}" for (layer, cls), modules in found.items()
    )


def test_every_package_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert {layer_of(name) for name in _modules() if name != PACKAGE} <= placed


def test_no_import_runs_up_the_layers() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    found = upward_imports(graph)
    new = sorted(found - KNOWN_UPWARD_IMPORTS.keys())
    gone = sorted(KNOWN_UPWARD_IMPORTS.keys() - found)
    assert new == [], "imports running up the layers:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in new
    )
    assert gone == [], "no longer imported: remove from KNOWN_UPWARD_IMPORTS:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in gone
    )


def test_the_credential_guard_is_below_runtime_and_tool_sources() -> None:
    modules = _modules()
    sync = _imports(
        f"{PACKAGE}.tool_sources.sync", modules[f"{PACKAGE}.tool_sources.sync"], modules
    )
    assert f"{PACKAGE}.agents.credential_guard" in sync
    assert f"{PACKAGE}.runtime.credentials" not in sync


# The checkers, each on a deliberate violation.


def test_the_statement_check_sees_text_and_sql_literals_outside_db() -> None:
    sources = {
        f"{PACKAGE}.runs.bad": (
            '"""Reads SELECT rows FROM nowhere, a docstring: prose."""\n'
            "import sqlalchemy as sa\n"
            "from sqlalchemy import text as t\n"
            'A = t("SELECT 1")\n'
            'B = sa.text("x")\n'
            'C = "UPDATE agents SET enabled = false"\n'
            'D = "DELETE FROM agents WHERE id = 1"\n'
            'E = "INSERT INTO users (id) VALUES (1)"\n'
            'F = "SELECT id FROM agents"\n'
            'G = "select the agent to update"\n'
        ),
        f"{PACKAGE}.db.fine": 'from sqlalchemy import text\nA = text("SELECT id FROM agents")\n',
        f"{PACKAGE}.knowledge.store": 'A = "DELETE FROM documents"\n',
        f"{PACKAGE}.api.prose": 'MESSAGE = "update the agent, then select a model"\n',
    }
    found = statements_outside_db(sources)
    assert list(found) == [f"{PACKAGE}.runs.bad"]
    assert [hit.split(":")[0] for hit in found[f"{PACKAGE}.runs.bad"]] == [
        "line 4",  # t(...) as a call
        "line 4",  # and its literal
        "line 5",
        "line 6",
        "line 7",
        "line 8",
        "line 9",
    ]
    assert f"{PACKAGE}.knowledge.store" in statements_outside_db(sources, exempt=())


def test_the_size_check_names_the_modules_over_the_limit() -> None:
    assert oversized({"a": 451, "b": 450, "c": 900}) == {"c": 900, "a": 451}


def test_the_class_check_sees_one_name_twice_in_a_layer() -> None:
    sources = {
        f"{PACKAGE}.api.schema": "class Subscription:\n    pass\n",
        f"{PACKAGE}.api.live.bus": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    class Hidden: ...\n"
            "class Subscription:\n    class Inner: ...\n"
        ),
        f"{PACKAGE}.api.other": "class Hidden: ...\nclass Inner: ...\n",
        f"{PACKAGE}.runs.bus": "class Subscription: ...\n",  # another layer: allowed
    }
    assert duplicate_classes(sources) == {
        ("api", "Subscription"): [f"{PACKAGE}.api.live.bus", f"{PACKAGE}.api.schema"],
        ("api", "Hidden"): [f"{PACKAGE}.api.live.bus", f"{PACKAGE}.api.other"],
    }


def test_the_layer_check_sees_an_import_running_up() -> None:
    graph = {
        f"{PACKAGE}.tool_sources.sync": {
            f"{PACKAGE}.runtime.credentials",  # up: runtime is above tool_sources
            f"{PACKAGE}.agents.credential_guard",  # down
            f"{PACKAGE}.tool_sources.client",  # its own layer
        },
        f"{PACKAGE}.oauth.flow": {f"{PACKAGE}.delivery.sender"},  # a peer
        f"{PACKAGE}.domain.budget": {f"{PACKAGE}.db.spend"},  # up from the bottom
        f"{PACKAGE}.cli": {f"{PACKAGE}.api.app"},
    }
    assert upward_imports(graph) == {
        (f"{PACKAGE}.tool_sources.sync", f"{PACKAGE}.runtime.credentials"),
        (f"{PACKAGE}.domain.budget", f"{PACKAGE}.db.spend"),
    }


def test_layer_of_names_the_top_level_package() -> None:
    assert layer_of(f"{PACKAGE}.api.live.bus") == "api"
    assert layer_of(f"{PACKAGE}.cli") == "cli"
    assert Path(ROOT).name == PACKAGE
