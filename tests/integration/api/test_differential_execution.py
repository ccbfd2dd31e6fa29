"""The fast executor (`api/execution.py`, `api/compiled.py`) answers exactly as Strawberry's
standard execution, on documents generated from the live schema and on a hand-written set.

Two apps serve the same database on the same clock: the one the engine runs and one built with
`create_app(fast_execution=False)`. Every document is sent to both as an owner, as an admin and
anonymously. The comparison rule (README, "Development"):

- the HTTP status and `data` must be equal exactly;
- errors are compared by message, path and `extensions.code` (the correlation id of an INTERNAL
  error is random: it is compared as `<id>`), as a multiset;
- except the errors under a position `data` nulled (a non-null field failed there): graphql-core
  cancels the sibling fields of such an error, so which of them had raised by then depends on
  timing. Those are compared as sets of possible outcomes: the document is run again on both
  executors (`RERUNS`), and every such error one executor gave must be among those the other gave
  in some run, and each nulled position must carry at least one error on both.

The documents are drawn (`hypothesis-graphql`) from the SDL the live schema exports now, so a field
added later is generated without touching this test; `ID` arguments are drawn from the seeded rows.
`DIFFERENTIAL_DOCUMENTS` in the default run; `DIFFERENTIAL_DOCUMENTS_SLOW` under the `slow` marker.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import graphql
import httpx
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis_graphql import queries
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.app import create_app
from agent_engine.api.schema import build_schema
from agent_engine.settings import Settings
from tests.integration.api.support import FIXED_NOW, Clock, serving
from tests.support.factories import Factories
from tests.support.graphql import GraphQL

DIFFERENTIAL_DOCUMENTS = 400
DIFFERENTIAL_DOCUMENTS_SLOW = 3000
RERUNS = 4
OWNER = 9101
OTHER_OWNER = 9102
ADMIN = 9103
# Who asks: (label, user id, admin).
VIEWERS = (("owner", OWNER, False), ("admin", ADMIN, True), ("anonymous", None, False))

_CORRELATION = re.compile(r"correlation id [0-9a-f]{32}")
Error = tuple[str, tuple[str | int, ...], str | None]


async def _seed(factories: Factories, engine: AsyncEngine) -> list[str]:
    """A world with every kind of row the API shows; returns the ids worth asking for."""
    await factories.user(OWNER)
    await factories.user(OTHER_OWNER, timezone="Europe/Berlin")
    await factories.user(ADMIN)
    model = await factories.model(name="Builtin")
    tool = await factories.tool("calculator")
    interval = await factories.agent(
        user_id=OWNER,
        name="Interval",
        model_id=model["id"],
        schedule={"type": "interval", "every_hours": 6},
        meta={"team": "ops"},
    )
    calendar = await factories.agent(
        user_id=OWNER,
        name="Calendar",
        model_id=model["id"],
        schedule={"type": "calendar", "cadence": "weekly", "weekday": 2, "time": "09:30"},
    )
    manual = await factories.agent(user_id=OTHER_OWNER, name="Manual", model_id=model["id"])
    no_model = await factories.agent(user_id=OTHER_OWNER, name="No model", model_id=None)
    finished = await factories.run(
        interval["id"],
        state="succeeded",
        tokens_used=120,
        prompt_tokens=100,
        completion_tokens=20,
        output="the digest",
        started_at=FIXED_NOW - timedelta(hours=2),
        finished_at=FIXED_NOW - timedelta(hours=1),
    )
    failed = await factories.run(
        calendar["id"],
        state="failed",
        reason="error",
        error="the model builtin failed",
        started_at=FIXED_NOW - timedelta(hours=3),
        finished_at=FIXED_NOW - timedelta(hours=3),
    )
    parked = await factories.run(interval["id"], state="running", tokens_used=40)
    skipped = await factories.run(manual["id"], state="skipped", reason="budget_exceeded")
    target = await factories._insert(
        "delivery_targets", {"name": "hook", "url": "https://hooks.example/x", "secret_env": "S"}
    )
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
            {"a": interval["id"], "t": tool["id"]},
        )
        await conn.execute(
            text("INSERT INTO agent_delivery_targets (agent_id, target_id) VALUES (:a, :t)"),
            {"a": interval["id"], "t": target["id"]},
        )
        await conn.execute(
            text(
                "INSERT INTO agent_run_steps (run_id, index, kind, name, input, output,"
                " prompt_tokens, completion_tokens, started_at, finished_at) VALUES"
                " (:r, 0, 'model_call', 'builtin', NULL, 'thinking', 100, 20, now(), now()),"
                " (:r, 1, 'tool_call', 'calculator', '{\"expression\": \"1+1\"}', '2',"
                " NULL, NULL, now(), now()),"
                " (:p, 0, 'tool_call', 'tickets__create_ticket', '{}', NULL, NULL, NULL,"
                " now(), NULL)"
            ),
            {"r": finished["id"], "p": parked["id"]},
        )
        await conn.execute(
            text(
                "INSERT INTO run_deliveries (run_id, target_id, webhook_id, event_type, payload,"
                " status, attempts, last_status_code, last_error)"
                " VALUES (:r, :t, 'msg_1', 'run.finished', '{}', 'failed', 3, 500,"
                " 'the target hook answered 500')"
            ),
            {"r": finished["id"], "t": target["id"]},
        )
        await conn.execute(
            text(
                "INSERT INTO audit_log (actor_id, action, agent_id, user_id, details)"
                " VALUES (:admin, 'agent.admin_paused', :a, :o, '{\"note\": \"why\"}'),"
                " (NULL, 'tool.allowed', NULL, NULL, NULL)"
            ),
            {"admin": ADMIN, "a": manual["id"], "o": OTHER_OWNER},
        )
        await conn.execute(
            text(
                "INSERT INTO budget_alerts (owner_id, window_start, percent, used_tokens,"
                " cap_tokens, crossed_at) VALUES (:o, :w, 80, 80, 100, :w)"
            ),
            {"o": OWNER, "w": FIXED_NOW - timedelta(days=2)},
        )
    approval = await factories.approval(parked, step_index=0, input={"title": "x"})
    await factories.approval(finished, status="approved", decided_at=FIXED_NOW, note="fine")
    await factories.setting("agent_weekly_token_cap", 1000)
    ids = {
        row["id"]
        for row in (interval, calendar, manual, no_model, finished, failed, parked, skipped)
    }
    ids |= {model["id"], tool["id"], target["id"], approval["id"], OWNER, ADMIN}
    return [*sorted(str(i) for i in ids), "0", "999999"]


# --- the hand-written set --------------------------------------------------------------------

HAND_WRITTEN: list[tuple[str, dict[str, Any]]] = [
    # Aliases with different arguments.
    (
        "query($a: ID!, $b: ID!) { one: agent(id: $a) { id name upcomingRunTimes(limit: 1) }"
        ' two: agent(id: $b) { id name upcomingRunTimes(limit: 3) } none: agent(id: "0") { id } }',
        {"a": "$agent", "b": "$calendar"},
    ),
    (
        "{ a: adminRuns(first: 1) { edges { cursor node { id state } } pageInfo { hasNextPage } }"
        " b: adminRuns(first: 3, states: [SUCCEEDED, FAILED]) { edges { node { id reason } } } }",
        {},
    ),
    # Fragments on the Schedule union.
    (
        "fragment S on Schedule { __typename ... on IntervalSchedule { everyHours }"
        " ... on CalendarSchedule { cadence weekday time } }"
        " { viewer { agents { id schedule { ...S } } } }",
        {},
    ),
    # @skip / @include with variables.
    (
        "query($more: Boolean!, $less: Boolean!) { viewer { isAdmin agents { id"
        " name @include(if: $more) prompt @skip(if: $less) lastRun @include(if: $more) {"
        " id output tokensUsed } } } }",
        {"more": True, "less": False},
    ),
    (
        "query($more: Boolean!, $less: Boolean!) { viewer { agents { id name @include(if: $more)"
        " runs @skip(if: $less) { edges { node { id } } } } } }",
        {"more": False, "less": True},
    ),
    # The same field twice, through fragments.
    (
        "fragment A on Agent { id name model { id name } }"
        " fragment B on Agent { id status model { id provider } runs { edges { node { id } } } }"
        " { viewer { agents { ...A ...B ... on Agent { name } } } }",
        {},
    ),
    (
        "fragment R on Run { id agent { id name } steps { index kind } }"
        " { toolApprovals { edges { node { id run { ...R } run { state ...R } } } } }",
        {},
    ),
    # Errors in non-null positions (and in nullable ones beside them).
    ("{ viewer { isAdmin user { id } } agentModels { id } }", {}),
    ("{ adminRuns { edges { node { id } } } tools { id } }", {}),
    (
        "query($run: ID!) { run(id: $run) { id output steps { index input output"
        " approval { id input status tool { id name } } } deliveries { status lastError"
        " target { id url secretEnv } } } }",
        {"run": "$run"},
    ),
    (
        "{ viewer { budget { usedTokens capTokens remainingTokens exceeded usedCost"
        " forecast { projectedTokens } } budgetAlerts { id percent owner { id } } } }",
        {},
    ),
    ("{ adminAuditLog { edges { node { id action agentId userId details actor { id } } } } }", {}),
    ("{ adminAgents(first: 2) { edges { node { id owner { id } } } pageInfo { endCursor } } }", {}),
    ('{ adminAgents(after: "not-a-cursor") { edges { cursor } } }', {}),
    ("{ adminSpend { tokens cost runs owner { id } } platformSettings { timezone } }", {}),
    # Introspection.
    ("{ __typename viewer { __typename agents { __typename id } } }", {}),
    (
        "{ __schema { queryType { name } types { name kind fields(includeDeprecated: true)"
        " { name args { name defaultValue } type { name kind ofType { name kind } } } } } }",
        {},
    ),
    ('{ __type(name: "Agent") { name fields { name type { kind ofType { name } } } } }', {}),
]


# --- comparing -------------------------------------------------------------------------------


def _errors(body: dict[str, Any]) -> list[Error]:
    return [
        (
            _CORRELATION.sub("correlation id <id>", e.get("message", "")),
            tuple(e.get("path") or ()),
            (e.get("extensions") or {}).get("code"),
        )
        for e in body.get("errors") or []
    ]


def _value_at(data: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        if data is None:
            return None
        data = data[key]
    return data


def _nulled_prefix(data: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The shortest proper prefix of `path` that is null in `data` (where an error below it
    propagated), if any: the errors under it are timing-dependent."""
    if data is None:
        return ()
    for end in range(1, len(path)):
        if _value_at(data, path[:end]) is None:
            return path[:end]
    return None


def _split(body: dict[str, Any]) -> tuple[Counter[Error], dict[tuple[str | int, ...], set[Error]]]:
    settled: Counter[Error] = Counter()
    timing: dict[tuple[str | int, ...], set[Error]] = {}
    for error in _errors(body):
        prefix = _nulled_prefix(body.get("data"), error[1]) if error[1] else None
        if prefix is None:
            settled[error] += 1
        else:
            timing.setdefault(prefix, set()).add(error)
    return settled, timing


def _possible_outcomes(fast: set[Error], reference: set[Error], where: str) -> None:
    """The errors under one nulled position, as each executor gave them over its runs: both saw
    a failure in common (what nulled the position), and where both report a field, they report
    the same error. A field only one of them reports is one the other had cancelled before it
    raised (graphql-core cancels the siblings of the failure)."""
    assert fast & reference, f"no failure in common {where}\nfast: {fast}\nreference: {reference}"
    by_path: dict[tuple[str | int, ...], set[Error]] = {}
    for error in reference:
        by_path.setdefault(error[1], set()).add(error)
    for error in fast:
        others = by_path.get(error[1])
        assert others is None or error in others, f"{error} vs {others} {where}"
    fast_paths = {error[1] for error in fast}
    for error in reference:
        if error[1] in fast_paths:
            assert error in fast, f"{error} missing {where}"


class Pair:
    """The fast app and the reference app, asked the same things."""

    def __init__(self, fast: GraphQL, reference: GraphQL) -> None:
        self.fast = fast
        self.reference = reference
        self.compared = 0
        self.answered = 0  # executions that produced data (not refused before execution)
        self.refused: Counter[tuple[str, tuple[str | None, ...]]] = Counter()

    async def _ask(
        self, client: GraphQL, query: str, variables: dict[str, Any], user: int | None, admin: bool
    ) -> tuple[int, dict[str, Any]]:
        response = await client.post(query, variables, as_user=user, admin=admin)
        return response.status_code, response.json()

    async def compare(
        self, query: str, variables: dict[str, Any], label: str, user: int | None, admin: bool
    ) -> None:
        fast = await self._ask(self.fast, query, variables, user, admin)
        reference = await self._ask(self.reference, query, variables, user, admin)
        where = f"as {label}: {query} {variables}"
        assert fast[0] == reference[0], f"HTTP status {fast[0]} != {reference[0]} {where}"
        assert fast[1].get("data") == reference[1].get("data"), (
            f"data differs {where}\nfast:      {fast[1]}\nreference: {reference[1]}"
        )
        fast_settled, fast_timing = _split(fast[1])
        ref_settled, ref_timing = _split(reference[1])
        assert fast_settled == ref_settled, (
            f"errors differ {where}\nfast:      {fast[1].get('errors')}\n"
            f"reference: {reference[1].get('errors')}"
        )
        assert fast_timing.keys() == ref_timing.keys(), f"nulled positions differ {where}"
        if fast_timing != ref_timing:
            # Timing-dependent: compared over the outcomes of a few more runs of each.
            fast_seen = {k: set(v) for k, v in fast_timing.items()}
            ref_seen = {k: set(v) for k, v in ref_timing.items()}
            for _ in range(RERUNS):
                for client, seen in ((self.fast, fast_seen), (self.reference, ref_seen)):
                    _, body = await self._ask(client, query, variables, user, admin)
                    for prefix, errors in _split(body)[1].items():
                        seen.setdefault(prefix, set()).update(errors)
            for prefix in fast_timing:
                _possible_outcomes(fast_seen[prefix], ref_seen[prefix], f"at {prefix} {where}")
        self.compared += 1
        self.answered += fast[1].get("data") is not None
        if fast[1].get("data") is None:
            self.refused[(label, tuple(sorted(set(c for _, _, c in _errors(fast[1])))))] += 1

    async def compare_as_everyone(self, query: str, variables: dict[str, Any]) -> None:
        for label, user, admin in VIEWERS:
            await self.compare(query, variables, label, user, admin)


@contextmanager
def _both_apps(settings: Settings, clock: Clock) -> Iterator[tuple[str, str]]:
    with (
        serving(create_app(settings, clock=clock)) as fast,
        serving(create_app(settings, clock=clock, fast_execution=False)) as reference,
    ):
        yield fast, reference


def _generated(ids: list[str], count: int) -> list[str]:
    """`count` documents drawn from the SDL the live schema exports, deterministically."""
    sdl = build_schema().as_str()
    id_values = st.sampled_from(ids).map(lambda value: graphql.StringValueNode(value=value))
    # Small ints (page sizes, limits), a few out of range: arbitrary ones are nearly all refused.
    ints = st.integers(-1, 60).map(lambda value: graphql.IntValueNode(value=str(value)))
    scalars = {"ID": id_values, "Int": ints}
    roots = sorted(graphql.build_schema(sdl).query_type.fields)  # type: ignore[union-attr]
    # Documents over several root fields, and over one (which a forbidden sibling does not null).
    strategy = st.one_of(
        queries(sdl, custom_scalars=scalars, allow_x00=False),
        st.sampled_from(roots).flatmap(
            lambda root: queries(sdl, fields=[root], custom_scalars=scalars, allow_x00=False)
        ),
    )
    drawn: list[str] = []

    @hypothesis_settings(
        max_examples=count,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(document: str) -> None:
        drawn.append(document)

    collect()
    return drawn


async def _run(settings_: Settings, engine: AsyncEngine, factories: Factories, count: int) -> None:
    ids = await _seed(factories, engine)
    clock = Clock()
    documents = _generated(ids, count)
    with _both_apps(settings_, clock) as (fast_url, reference_url):
        async with httpx.AsyncClient(timeout=30.0) as http:
            pair = Pair(
                GraphQL(url=fast_url, settings=settings_, http=http),
                GraphQL(url=reference_url, settings=settings_, http=http),
            )
            agent_ids = await pair.fast.data("{ viewer { agents { id } } }", as_user=OWNER)
            agent, calendar = (a["id"] for a in agent_ids["viewer"]["agents"])
            run = await pair.fast.data(
                "{ adminRuns(states: [SUCCEEDED]) { edges { node { id } } } }",
                as_user=ADMIN,
                admin=True,
            )
            run_id = run["adminRuns"]["edges"][0]["node"]["id"]
            named = {"$agent": agent, "$calendar": calendar, "$run": run_id}
            for query, variables in HAND_WRITTEN:
                bound = {
                    k: named.get(v, v) if isinstance(v, str) else v for k, v in variables.items()
                }
                await pair.compare_as_everyone(query, bound)
            for document in documents:
                await pair.compare_as_everyone(document, {})
    assert pair.compared == len(VIEWERS) * (len(HAND_WRITTEN) + len(documents))
    assert len(set(documents)) > count // 2  # the documents vary
    # Many executions get past validation, the guards and authentication into the executors
    # (anonymous callers are refused almost everything, owners the admin fields).
    assert pair.answered > pair.compared // 3, (pair.answered, pair.compared, pair.refused)


async def test_the_fast_executor_answers_as_strawberrys_own_execution(
    settings: Settings, engine: AsyncEngine, factories: Factories
) -> None:
    await _run(settings, engine, factories, DIFFERENTIAL_DOCUMENTS)


# Known, not yet fixed (issue 42 follow-up): a sync resolver's coroutine (`awaited_later`, e.g.
# `Agent.lastRun` -> `Agent._load_run`) is never awaited when graphql-core abandons its field
# after a sibling's failure, and Python warns when it is collected. It changes no answer (the
# comparison holds); this run draws a document that shows it, so the warning is let through here
# only, and only this one.
@pytest.mark.slow
# ~90 s alone on 2 cores; beside the rest of the suite in 4 processes, several times that.
@pytest.mark.timeout(1200)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_the_fast_executor_answers_as_strawberrys_own_execution_on_thousands(
    settings: Settings, engine: AsyncEngine, factories: Factories
) -> None:
    await _run(settings, engine, factories, DIFFERENTIAL_DOCUMENTS_SLOW)
