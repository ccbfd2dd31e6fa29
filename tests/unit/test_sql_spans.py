"""The lean asyncpg spans (observability/sql_spans.py) are upstream's spans: same name, kind and
attributes for the same statement and connection, and the same error status."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.instrumentation._semconv import _StabilityMode
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor as Upstream
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_engine.db import runs
from agent_engine.observability.sql_spans import AsyncPGInstrumentor


class _Params:
    database = "agent_engine"
    user = "worker"


class _Connection:
    _params = _Params()
    _addr = ("10.0.0.7", 5433)


async def _call(instrumentor: Any, query: str, *, fail: bool = False) -> None:
    async def execute(*_: Any, **__: Any) -> str:
        if fail:
            raise RuntimeError("boom")
        return "SELECT 1"

    await instrumentor._do_execute(execute, _Connection(), (query, 1), {})


def _spans(make: type[Any], query: str, *, fail: bool = False) -> list[Any]:
    import asyncio

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = make()
    # What `instrument()` sets, without wrapping asyncpg for the whole process.
    instrumentor._tracer = provider.get_tracer("test")
    instrumentor._semconv_opt_in_mode = _StabilityMode.DEFAULT
    for _ in range(2):  # the second call is served from the cache
        try:
            asyncio.run(_call(instrumentor, query, fail=fail))
        except RuntimeError:
            assert fail
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize(
    "query",
    [
        str(runs.CLAIM_AT_ONCE.text),
        "/* a comment */ UPDATE agent_runs SET state = 'running' WHERE id = $1",
        "   select 1",
    ],
)
@pytest.mark.parametrize("fail", [False, True])
def test_the_lean_spans_are_upstreams(query: str, fail: bool) -> None:
    ours = _spans(AsyncPGInstrumentor, query, fail=fail)
    theirs = _spans(Upstream, query, fail=fail)
    assert len(ours) == len(theirs) == 2
    for mine, upstream in zip(ours, theirs, strict=True):
        assert mine.name == upstream.name
        assert mine.kind == upstream.kind
        assert dict(mine.attributes) == dict(upstream.attributes)
        assert mine.status.status_code == upstream.status.status_code
