"""The static cost estimate: objects the answer can hold, from the document alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import strawberry
from graphql import GraphQLSchema, parse
from graphql import build_schema as build_sdl_schema
from strawberry.extensions import ParserCache

from agent_engine.api import cost as cost_module
from agent_engine.api.cost import (
    DEFAULT_LIST_CAP,
    CostModel,
    KnownCosts,
    QueryCostLimiter,
    estimate_cost,
)
from agent_engine.api.errors import GRAPHQL_VALIDATION_FAILED
from agent_engine.api.guards import MAX_PAGE_SIZE, cost_model
from agent_engine.api.schema import export_sdl
from agent_engine.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = Settings()
MODEL = cost_model(SETTINGS)
AGENTS_CAP = SETTINGS.max_agents_per_owner


@pytest.fixture(scope="module")
def schema() -> GraphQLSchema:
    return build_sdl_schema(export_sdl())


def cost(schema: GraphQLSchema, document: str, **options: Any) -> int:
    return estimate_cost(schema, parse(document), MODEL, **options)


def test_scalars_are_free_and_objects_count_once(schema: GraphQLSchema) -> None:
    assert cost(schema, "{ __typename }") == 0
    assert cost(schema, "{ viewer { isAdmin } }") == 1
    assert cost(schema, "{ viewer { isAdmin user { id } budget { usedTokens } } }") == 3


def test_an_unpaginated_list_counts_its_cap(schema: GraphQLSchema) -> None:
    assert cost(schema, "{ viewer { agents { id } } }") == 1 + AGENTS_CAP
    assert cost(schema, "{ viewer { agents { id model { name } } } }") == 1 + 2 * AGENTS_CAP
    assert cost(schema, "{ agentModels { id } }") == DEFAULT_LIST_CAP
    # Scalar lists are free, whatever their size.
    assert cost(schema, "{ viewer { agents { coreTools upcomingRunTimes(limit: 50) } } }") == (
        1 + AGENTS_CAP
    )


def test_a_connection_counts_its_first(schema: GraphQLSchema) -> None:
    page = "{ adminRuns(first: 7) { pageInfo { hasNextPage } edges { node { id } } } }"
    # connection + pageInfo + 7 edges + 7 nodes
    assert cost(schema, page) == 1 + 1 + 7 + 7
    # The argument's default when absent (adminRuns: 50), the variable's value when given.
    assert cost(schema, "{ adminRuns { edges { node { id } } } }") == 1 + 50 + 50
    by_variable = "query($n: Int!) { adminRuns(first: $n) { edges { node { id } } } }"
    assert cost(schema, by_variable, variables={"n": 3}) == 1 + 3 + 3
    defaulted = "query($n: Int! = 4) { adminRuns(first: $n) { edges { node { id } } } }"
    assert cost(schema, defaulted) == 1 + 4 + 4
    # More than a page is refused by the resolver; the estimate counts at most a page.
    assert cost(schema, "{ adminRuns(first: 100000) { edges { node { id } } } }") == (
        1 + 2 * MAX_PAGE_SIZE
    )


def test_nested_lists_multiply(schema: GraphQLSchema) -> None:
    document = "{ viewer { agents { runs(first: 10) { edges { node { agent { id } } } } } } }"
    # viewer + agents + a connection per agent + 10 edges, nodes and agents per connection
    assert cost(schema, document) == 1 + AGENTS_CAP * (1 + 1 + 10 * 3)


def test_fragments_and_inline_fragments_count_like_the_fields_they_hold(
    schema: GraphQLSchema,
) -> None:
    inline = "{ viewer { agents { schedule { ... on CalendarSchedule { time } } model { id } } } }"
    spread = (
        "query { viewer { agents { ...A } } } fragment A on Agent { schedule { __typename }"
        " model { ...M } } fragment M on AgentModel { id }"
    )
    assert cost(schema, inline) == cost(schema, spread) == 1 + 3 * AGENTS_CAP


def test_cyclic_and_unknown_fragments_cost_nothing_more(schema: GraphQLSchema) -> None:
    cyclic = (
        "{ viewer { ...A } }"
        " fragment A on Viewer { user { id } ...B } fragment B on Viewer { ...A }"
    )
    assert cost(schema, cyclic) == 1 + 1
    assert cost(schema, "{ viewer { ...Missing } }") == 1


def test_a_fragment_spread_many_times_is_estimated_without_expanding_it(
    schema: GraphQLSchema,
) -> None:
    # Each level spreads the next ten times: 10**8 copies of `user` -- estimated, not walked.
    levels = 8
    fragments = " ".join(
        f"fragment F{i} on Viewer {{ " + " ".join([f"...F{i + 1}"] * 10) + " }"
        for i in range(levels)
    )
    document = (
        f"{{ viewer {{ ...F0 }} }} {fragments} fragment F{levels} on Viewer {{ user {{ id }} }}"
    )
    assert cost(schema, document) == 1 + 10**levels


def test_the_operation_named_in_the_request_is_the_one_estimated(schema: GraphQLSchema) -> None:
    document = "query Small { viewer { isAdmin } } query Large { viewer { agents { id } } }"
    assert cost(schema, document, operation_name="Small") == 1
    assert cost(schema, document, operation_name="Large") == 1 + AGENTS_CAP
    assert cost(schema, document) == 1 + AGENTS_CAP


def test_subscriptions_are_estimated_per_event(schema: GraphQLSchema) -> None:
    document = (
        "subscription { runEvents { run { agent { runs(first: 5) { edges { node { id } } } } } } }"
    )
    assert cost(schema, document) == 1 + 1 + 1 + 1 + 5 + 5


def test_the_issues_document_is_over_the_default_limit(schema: GraphQLSchema) -> None:
    nested = (
        "viewer { agents { runs(first: 100) { edges { node { id agent {"
        " runs(first: 100) { edges { node { id } } } } } } } } }"
    )
    document = "{ " + " ".join(f"a{i}: {nested}" for i in range(30)) + " }"
    assert cost(schema, document) > 100 * SETTINGS.max_query_cost


def _readme_documents() -> list[str]:
    """Every GraphQL document in the README and the docs (the tour included) and the GraphiQL start
    page."""
    documents = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for block in re.findall(r"```graphql\n(.*?)```", page.read_text(), re.S):
            documents += [part for part in re.split(r"^#.*$", block, flags=re.M) if part.strip()]
    page = (ROOT / "src/agent_engine/api/static/graphiql.html").read_text()
    documents += re.findall(r"^(query Me \{.*?^\})", page, re.S | re.M)
    return documents


def test_every_document_of_the_readme_and_graphiql_is_within_the_default_limit(
    schema: GraphQLSchema,
) -> None:
    documents = _readme_documents()
    assert len(documents) >= 9
    costs = {document[:60]: cost(schema, document) for document in documents}
    assert all(value <= SETTINGS.max_query_cost for value in costs.values()), costs


def test_the_agents_page_with_every_relation_is_within_the_default_limit(
    schema: GraphQLSchema,
) -> None:
    page = """{ viewer { agents { id model { name } tools { name } lastRun { id state }
      activeRun { id } owner { displayName } runs(first: 20) { edges { node { id state } } } }
      budget { usedTokens } } }"""
    assert cost(schema, page) <= SETTINGS.max_query_cost


@strawberry.type
class Item:
    id: int


@strawberry.type
class Query:
    @strawberry.field
    def items(self, first: int = 3) -> list[Item]:
        RESOLVED.append(first)
        return [Item(id=i) for i in range(first)]


RESOLVED: list[int] = []
LIMITED = strawberry.Schema(
    query=Query,
    extensions=[lambda: QueryCostLimiter(max_cost=5, model=CostModel(max_page_size=10))],
)


def test_a_document_at_the_limit_runs_and_one_over_is_refused_before_it_runs() -> None:
    RESOLVED.clear()
    assert LIMITED.execute_sync("{ items(first: 5) { id } }").errors is None
    assert RESOLVED == [5]
    result = LIMITED.execute_sync("query($n: Int!) { items(first: $n) { id } }", {"n": 6})
    assert result.errors is not None
    [error] = [e.formatted for e in result.errors]
    assert error["extensions"] == {"code": GRAPHQL_VALIDATION_FAILED, "cost": 6, "maxCost": 5}
    assert error["message"].startswith("the query's estimated cost is 6, over the limit of 5")
    assert RESOLVED == [5]


def test_an_estimate_is_remembered_by_document_operation_and_variables() -> None:
    """A page sent again (the guards hand back the same parsed document) is not estimated again,
    and no other request is answered with its estimate."""
    known = KnownCosts()
    document = parse("query Page($n: Int!) { items(first: $n) { id } }")
    known.put(document, "Page", {"n": 5}, 5)
    assert known.get(document, "Page", {"n": 5}) == 5
    assert known.get(document, "Page", {"n": 6}) is None
    assert known.get(document, "Page", {"n": True}) is None  # equal to 1 in Python, not here
    assert known.get(document, None, {"n": 5}) is None
    again = parse("query Page($n: Int!) { items(first: $n) { id } }")
    assert known.get(again, "Page", {"n": 5}) is None  # another document
    known.put(document, "Page", {"n": [5]}, 5)  # not plain values: not remembered
    assert known.get(document, "Page", {"n": [5]}) is None


def test_a_remembered_estimate_still_refuses_a_page_over_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    estimates: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> int:
        estimates.append(cost := estimate_cost(*args, **kwargs))
        return cost

    monkeypatch.setattr(cost_module, "estimate_cost", counted)
    known = KnownCosts()
    limiter = strawberry.Schema(
        query=Query,
        extensions=[
            ParserCache,  # the same document object for the same text, as the guards' cache
            lambda: QueryCostLimiter(max_cost=5, model=CostModel(max_page_size=10), known=known),
        ],
    )
    RESOLVED.clear()
    page = "query($n: Int!) { items(first: $n) { id } }"
    for _ in range(2):
        assert limiter.execute_sync(page, {"n": 5}).errors is None
        refused = limiter.execute_sync(page, {"n": 6})
        assert refused.errors is not None and "over the limit of 5" in refused.errors[0].message
    assert RESOLVED == [5, 5]
    assert estimates == [5, 6]  # each estimated once
