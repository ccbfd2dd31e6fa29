"""SQL spans: the asyncpg instrumentation, with its per-statement work done once per statement.

`opentelemetry-instrumentation-asyncpg` names each span by running a comment-stripping regex over
the whole SQL text and splitting all of it into words, then reads the connection's parameters
into the span's attributes -- per call. The worker's statements are constants of a few KB (the
claim is 2.8 KB), so that is ~20 µs a statement before the span exists: the largest single piece
of tracing's cost per run after the spans themselves (bench/tracing.py). Here the name and the
attributes are worked out once per (statement, connection target) and reused; the span made is
the same (tests/unit/test_sql_spans.py compares it with the upstream one). Calls with captured
parameters and the other wrapped methods (prepared statements, cursors) are upstream's own.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from opentelemetry.instrumentation.asyncpg import (
    AsyncPGInstrumentor as UpstreamAsyncPGInstrumentor,
)
from opentelemetry.instrumentation.asyncpg import _hydrate_span_from_args
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind, Status, StatusCode

# Distinct (statement, database, user, address) pairs remembered; the engine has a few hundred.
CACHED_STATEMENTS = 2048


class AsyncPGInstrumentor(UpstreamAsyncPGInstrumentor):
    """Upstream's instrumentation; `Connection.execute/fetch/…` spans described once per
    statement."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._describe = lru_cache(maxsize=CACHED_STATEMENTS)(self._described)

    def _described(
        self, query: str, database: Any, user: Any, addr: Any
    ) -> tuple[str, dict[str, Any]]:
        try:
            name = self._leading_comment_remover.sub("", query).split()[0]
        except IndexError:
            name = ""
        connection = _Target(database, user, addr)
        attributes = _hydrate_span_from_args(
            connection, query, None, semconv_opt_in_mode=self._semconv_opt_in_mode
        )
        return name, attributes

    async def _do_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        query = args[0] if args else None
        if self.capture_parameters or not isinstance(query, str) or not query:
            return await super()._do_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
        if not is_instrumentation_enabled():
            return await func(*args, **kwargs)
        params = getattr(instance, "_params", None)
        addr = getattr(instance, "_addr", None)
        name, attributes = self._describe(
            query,
            getattr(params, "database", None),
            getattr(params, "user", None),
            addr if isinstance(addr, (str, tuple)) else None,
        )
        tracer: Any = self._tracer
        with tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                return await func(*args, **kwargs)
            except Exception as exc:
                if span.is_recording():
                    span.set_status(Status(StatusCode.ERROR))
                    self._error_type(span, exc)
                raise

    def _error_type(self, span: Any, exc: Exception) -> None:
        from opentelemetry.instrumentation._semconv import _report_new
        from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

        if _report_new(self._semconv_opt_in_mode):
            span.set_attribute(ERROR_TYPE, type(exc).__qualname__)


class _Target:
    """What `_hydrate_span_from_args` reads of a connection: its parameters and address."""

    __slots__ = ("_addr", "_params")

    def __init__(self, database: Any, user: Any, addr: Any) -> None:
        self._params = _Params(database, user)
        self._addr = addr


class _Params:
    __slots__ = ("database", "user")

    def __init__(self, database: Any, user: Any) -> None:
        self.database = database
        self.user = user
