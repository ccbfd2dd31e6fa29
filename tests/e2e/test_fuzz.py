"""Fuzzing the live GraphQL endpoint of a real `agent-engine serve` process.

- Schemathesis generates operations from the introspected schema (every query and mutation, valid
  documents with generated arguments) and sends them with valid owner and admin tokens: no answer
  may be a server error (5xx) or a masked `INTERNAL` error.
- A hypothesis suite sends malformed schedules, ids, sizes and types: each gets its documented
  error code (BAD_USER_INPUT naming the field, NOT_FOUND) and the database is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent_engine.settings import Settings, to_libpq_url
from agent_engine.testing.fake_openai import FakeOpenAIServer
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Stack,
    codes,
    fake_model,
    fake_openai,
    stack,
    token,
)
from tests.support.factories import Factories

# The fuzzing budget: every query and mutation, with an owner's and an admin's token, for about
# FUZZ_SECONDS_PER_TOKEN per token (split evenly between the operations), at most
# FUZZ_EXAMPLES_PER_OPERATION examples each. Raise both for a longer local run, e.g.
# `FUZZ_SECONDS_PER_TOKEN=600 FUZZ_EXAMPLES_PER_OPERATION=2000 FUZZ_RANDOM=1 pytest …test_fuzz.py`.
FUZZ_SECONDS_PER_TOKEN = float(os.environ.get("FUZZ_SECONDS_PER_TOKEN", "120"))
FUZZ_EXAMPLES_PER_OPERATION = int(os.environ.get("FUZZ_EXAMPLES_PER_OPERATION", "200"))
FUZZ_RANDOM = os.environ.get("FUZZ_RANDOM", "") not in ("", "0")
MALFORMED_EXAMPLES = 40
HYPOTHESIS_SETTINGS = {
    "deadline": None,
    "database": None,
    "derandomize": True,
    "phases": [Phase.explicit, Phase.generate],
    "suppress_health_check": list(HealthCheck),
}


async def _seed(factories: Factories, fake: FakeOpenAIServer) -> dict[str, Any]:
    """A small world so generated ids hit real rows: two owners, agents, runs, a tool."""
    owner = (await factories.user(id=11))["id"]
    other = (await factories.user(id=12))["id"]
    admin = (await factories.user(id=13))["id"]
    model = await fake_model(factories, fake, is_default=True)
    agents = []
    for user in (owner, owner, other):
        agent = await factories.agent(
            user_id=user, model_id=model["id"], schedule={"type": "interval", "every_hours": 6}
        )
        agents.append(agent)
        await factories.run(agent_id=agent["id"], state="succeeded", tokens_used=3)
    await factories.tool("fuzz_tool")
    return {"owner": owner, "other": other, "admin": admin, "agents": agents}


@pytest.mark.slow
@pytest.mark.timeout(2 * FUZZ_SECONDS_PER_TOKEN + 240)
async def test_schemathesis_finds_no_server_error(
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    """Schemathesis's fuzzing phase against a real `agent-engine serve`: every query and mutation
    with an owner's and with an admin's token. No answer may be a 5xx or carry INTERNAL."""
    world = await _seed(factories, fake_openai)
    api = await stack.api()
    bearers = {
        "owner": token(stack.settings, world["owner"]),
        "admin": token(stack.settings, world["admin"], admin=True),
    }
    report = await asyncio.to_thread(_schemathesis, api.url or "", bearers)
    assert report.failures == [], "\n".join(str(f)[:600] for f in report.failures[:20])
    for who in bearers:
        # Every operation was sent with each token.
        assert report.operations_sent[who] == report.operations, (who, report)
    # Most generated operations are refused (random ids, admin-only fields): make sure a good
    # share of the schema was actually executed, or the run proves little. A quarter: of the 39
    # operations of contract version 3, the MCP source and approval mutations act on an existing
    # source or approval id, which random ids never hit (they still must not fail with a 5xx).
    assert len(report.served) >= len(report.operations) // 4, report.served
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{api.url}/healthz")).status_code == 200
    assert api.alive(), api.log_tail()


@dataclass
class FuzzReport:
    operations: set[str] = field(default_factory=set)
    operations_sent: dict[str, set[str]] = field(default_factory=dict)
    sent: int = 0
    served: set[str] = field(default_factory=set)  # answered without errors: generation reached
    failures: list[Any] = field(default_factory=list)


def _schemathesis(url: str, bearers: dict[str, str]) -> FuzzReport:
    endpoint = f"{url}/graphql"
    schema = schemathesis.graphql.from_url(
        endpoint, headers={"Authorization": f"Bearer {bearers['admin']}"}
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    report = FuzzReport(operations={op.label for op in operations})
    per_operation_seconds = FUZZ_SECONDS_PER_TOKEN / max(len(operations), 1)
    fuzz_settings = {**HYPOTHESIS_SETTINGS, "derandomize": not FUZZ_RANDOM}
    for who, bearer in bearers.items():
        sent_by = report.operations_sent.setdefault(who, set())
        for operation in operations:
            _fuzz_operation(
                url,
                operation,
                bearer,
                report=report,
                sent_by=sent_by,
                seconds=per_operation_seconds,
                fuzz_settings=fuzz_settings,
            )
    return report


def _fuzz_operation(
    url: str,
    operation: Any,
    bearer: str,
    *,
    report: FuzzReport,
    sent_by: set[str],
    seconds: float,
    fuzz_settings: dict[str, Any],
) -> None:
    """One operation's examples, until they or its share of the time run out."""
    deadline = time.monotonic() + seconds

    @settings(max_examples=FUZZ_EXAMPLES_PER_OPERATION, **fuzz_settings)
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        if operation.label in sent_by and time.monotonic() > deadline:
            raise _BudgetSpent  # no shrinking phase: Hypothesis stops at once
        response = case.call(
            base_url=url, headers={"Authorization": f"Bearer {bearer}"}, timeout=30
        )
        report.sent += 1
        sent_by.add(operation.label)
        _judge(report, case.body, response)

    with contextlib.suppress(_BudgetSpent):
        check()


class _BudgetSpent(Exception):
    """An operation's share of the fuzzing time is spent."""


def _judge(report: FuzzReport, sent: Any, response: Any) -> None:
    if response.status_code >= 500:
        report.failures.append((sent, response.status_code, response.text[:500]))
        return
    try:
        body = response.json()
    except ValueError:
        report.failures.append((sent, response.status_code, response.text[:500]))
        return
    if "INTERNAL" in codes(body):
        report.failures.append((sent, body))
    elif not body.get("errors") and body.get("data"):
        report.served.update(body["data"])


# --- malformed input ----------------------------------------------------------------------------

CREATE = "mutation($input: CreateAgentInput!) { createAgent(input: $input) { id } }"
UPDATE = (
    "mutation($id: ID!, $input: UpdateAgentInput!) { updateAgent(id: $id, input: $input) { id } }"
)
AGENT = "query($id: ID!) { agent(id: $id) { id } }"
RUN = "query($id: ID!) { run(id: $id) { id } }"
START = "mutation($id: ID!) { startRun(agentId: $id) { id } }"
RUNS = (
    "query($id: ID!, $first: Int!) { agent(id: $id) { runs(first: $first) { edges { cursor } } } }"
)

_SNAPSHOT_SQL = (
    "SELECT (SELECT coalesce(json_agg(a ORDER BY a.id), '[]') FROM agents a),"
    " (SELECT coalesce(json_agg(r ORDER BY r.id), '[]') FROM agent_runs r),"
    " (SELECT coalesce(json_agg(t ORDER BY t.agent_id, t.tool_id), '[]') FROM agent_tools t)"
)

bad_every_hours = st.one_of(
    st.integers(max_value=0), st.integers(min_value=169, max_value=2**31 - 1)
)
bad_time = st.one_of(
    st.text(alphabet=string.printable, max_size=8).filter(
        lambda s: (
            not (
                len(s) == 5
                and s[2] == ":"
                and s[:2].isdigit()
                and s[3:].isdigit()
                and int(s[:2]) < 24
                and int(s[3:]) < 60
            )
        )
    ),
    st.sampled_from(["24:00", "12:60", "7:5", "-1:00", "12:00:00", "", " 09:00"]),
)
bad_schedules = st.one_of(
    st.builds(lambda n: {"interval": {"everyHours": n}}, bad_every_hours),
    st.builds(lambda t: {"calendar": {"cadence": "DAILY", "time": t}}, bad_time),
    st.builds(
        lambda d: {"calendar": {"cadence": "WEEKLY", "weekday": d, "time": "09:00"}},
        st.one_of(
            st.none(), st.integers(max_value=-1), st.integers(min_value=7, max_value=2**31 - 1)
        ),
    ),
)
# Not a well-formed id: the API says which argument is wrong rather than looking it up.
bad_ids = st.one_of(
    st.text(max_size=30).filter(lambda s: not s.strip().isdigit()),
    st.integers(max_value=0).map(str),
    st.integers(min_value=2**63, max_value=2**80).map(str),
)
bad_sizes = st.one_of(
    st.builds(lambda n: {"name": "n" * n}, st.integers(min_value=201, max_value=5_000)),
    st.builds(lambda n: {"prompt": "p" * n}, st.integers(min_value=20_001, max_value=40_000)),
    st.builds(
        lambda n: {"meta": {"blob": "m" * n}}, st.integers(min_value=16_500, max_value=40_000)
    ),
    st.just({"name": "   "}),
    st.just({"meta": [1, 2, 3]}),
)
wrong_types = st.one_of(
    st.builds(
        lambda v: {"name": v},
        st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=3)),
    ),
    st.builds(
        lambda v: {"schedule": {"interval": {"everyHours": v}}},
        st.one_of(
            st.text(max_size=5),
            st.floats(allow_nan=False).filter(lambda f: not f.is_integer()),
            st.booleans(),
        ),
    ),
    st.builds(lambda v: {"schedule": v}, st.one_of(st.integers(), st.text(max_size=5))),
    st.builds(lambda v: {"enabled": v}, st.one_of(st.text(max_size=5), st.integers())),
)


@pytest.mark.slow
async def test_malformed_input_gets_documented_codes_and_changes_nothing(
    settings: Settings,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    world = await _seed(factories, fake_openai)
    api = await stack.api()
    bearer = token(stack.settings, world["owner"])
    mine = str(world["agents"][0]["id"])
    theirs = str(world["agents"][2]["id"])
    dsn = to_libpq_url(settings.database_url or "")
    failures = await asyncio.to_thread(_malformed, api.url or "", bearer, dsn, mine, theirs)
    assert failures == []


def _malformed(url: str, bearer: str, dsn: str, mine: str, theirs: str) -> list[Any]:
    failures: list[Any] = []
    http = httpx.Client(timeout=30.0, headers={"Authorization": f"Bearer {bearer}"})

    def snapshot() -> Any:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(_SNAPSHOT_SQL).fetchone()
        return json.dumps(row, sort_keys=True, default=str)

    def expect(
        query: str, variables: dict[str, Any], accept: Callable[[dict[str, Any]], bool]
    ) -> None:
        before = snapshot()
        response = http.post(f"{url}/graphql", json={"query": query, "variables": variables})
        after = snapshot()
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else {"raw": response.text[:300]}
        )
        if response.status_code != 200 or not accept(body):
            failures.append((query.split("(")[0], variables, response.status_code, body))
        elif before != after:
            failures.append(("database changed", query.split("(")[0], variables))

    def bad_input(field_prefix: str) -> Callable[[dict[str, Any]], bool]:
        def accept(body: dict[str, Any]) -> bool:
            errors = body.get("errors") or []
            return (
                # Nothing resolved: no data, or the nullable root field is null.
                all(value is None for value in (body.get("data") or {}).values())
                and len(errors) == 1
                and errors[0].get("extensions", {}).get("code") == "BAD_USER_INPUT"
                and (
                    # Coercion errors of the variables name the variable; ours name the field.
                    str(errors[0]["extensions"].get("field", "")).startswith(field_prefix)
                    or errors[0]["message"].startswith("Variable '$")
                )
            )

        return accept

    def not_found(body: dict[str, Any]) -> bool:
        return codes(body) == ["NOT_FOUND"]

    base = {"name": "fuzzed", "prompt": "p"}

    @settings(max_examples=MALFORMED_EXAMPLES, **HYPOTHESIS_SETTINGS)  # type: ignore[arg-type]
    @given(schedule=bad_schedules, change=bad_sizes, wrong=wrong_types)
    def schedules_sizes_types(
        schedule: dict[str, Any], change: dict[str, Any], wrong: dict[str, Any]
    ) -> None:
        expect(CREATE, {"input": {**base, "schedule": schedule}}, bad_input("input.schedule"))
        expect(UPDATE, {"id": mine, "input": {"schedule": schedule}}, bad_input("input.schedule"))
        expect(CREATE, {"input": {**base, **change}}, bad_input("input."))
        expect(UPDATE, {"id": mine, "input": change}, bad_input("input."))
        expect(CREATE, {"input": {**base, **wrong}}, bad_input("input"))

    @settings(max_examples=MALFORMED_EXAMPLES, **HYPOTHESIS_SETTINGS)  # type: ignore[arg-type]
    @given(
        ident=bad_ids,
        first=st.one_of(st.integers(max_value=0), st.integers(min_value=101, max_value=2**31 - 1)),
    )
    def ids_and_pages(ident: str, first: int) -> None:
        expect(AGENT, {"id": ident}, bad_input("id"))
        expect(RUN, {"id": ident}, bad_input("id"))
        expect(START, {"id": ident}, bad_input("agentId"))
        expect(UPDATE, {"id": ident, "input": {"name": "x"}}, bad_input("id"))
        expect(RUNS, {"id": mine, "first": first}, bad_input("first"))

    try:
        schedules_sizes_types()
        ids_and_pages()
        # Someone else's agent: NOT_FOUND, exactly as an id that does not exist.
        for query, variables in (
            (AGENT, {"id": theirs}),
            (START, {"id": theirs}),
            (UPDATE, {"id": theirs, "input": {"name": "mine now"}}),
            (AGENT, {"id": "999999999"}),
        ):
            expect(
                query,
                variables,
                lambda b: codes(b) == ["NOT_FOUND"] or b.get("data") == {"agent": None},
            )
    finally:
        http.close()
    return failures


ONE_OF_VIOLATIONS = [
    {},
    {"interval": {"everyHours": 2}, "calendar": {"cadence": "DAILY", "time": "09:00"}},
    {"interval": None},
]


async def test_a_schedule_with_zero_or_two_kinds_is_bad_user_input_naming_the_field(
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    world = await _seed(factories, fake_openai)
    api = await stack.api()
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token(stack.settings, world['owner'])}"}
    ) as http:
        for schedule in ONE_OF_VIOLATIONS:
            response = await http.post(
                f"{api.url}/graphql",
                json={
                    "query": CREATE,
                    "variables": {"input": {"name": "n", "prompt": "p", "schedule": schedule}},
                },
            )
            errors = response.json()["errors"]
            assert [e["extensions"].get("code") for e in errors] == ["BAD_USER_INPUT"], errors
            assert errors[0]["extensions"].get("field", "").startswith("input.schedule"), errors
