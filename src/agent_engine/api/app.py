"""The Starlette application: GraphQL (HTTP + graphql-transport-ws), GraphiQL, the dashboard page,
health and readiness (`api/health.py`) and metrics.

The lifespan owns the process's resources and yields them as typed state (`api/state.py`; the api
keeps no module-level state): the engine, the settings, the broker used to send execute messages
after a manual start, the token verifier, the sessions, and the live-update path (`api/live/`, one
LISTEN connection per api process) that feeds the subscriptions. The GraphQL endpoint itself
(context, authentication, transport errors) is the view of `api/view.py`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from agent_engine.api.auth import TokenVerifier, verification_problem
from agent_engine.api.health import healthz, readyz
from agent_engine.api.live import LiveUpdates
from agent_engine.api.sessions import SessionRegistry
from agent_engine.api.state import State, state_of
from agent_engine.api.transport import BodySizeLimit
from agent_engine.api.view import STATIC_DIR, GraphQLView
from agent_engine.collector import tune_gc
from agent_engine.db.engine import create_engine
from agent_engine.oauth.callback import oauth_callback
from agent_engine.observability import tracing, tracing_page
from agent_engine.observability.http import HttpMetrics
from agent_engine.observability.metrics import CONTENT_TYPE, database_snapshot, render
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.tools.registry import sync_tool_catalog
from agent_engine.settings import Settings, load_settings
from agent_engine.workers.broker import configure_broker, enqueue_execute

logger = logging.getLogger("agent_engine.api")

GRAPHQL_PATH = "/graphql"
DASHBOARD_PATH = "/dashboard"
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
STATIC_PATH = "/static"
# The api starts serving subscriptions once its LISTEN connection is up, or after this long (the
# listener keeps reconnecting in the background).
HUB_LISTEN_TIMEOUT_SECONDS = 10.0


def _no_broker(run_id: int) -> None:
    raise RuntimeError(f"no broker configured: run {run_id} waits for the reaper to re-send it")


def _broker(settings: Settings) -> tuple[dramatiq.Broker | None, Enqueue]:
    if not settings.effective_broker_url:
        logger.warning("no REDIS_URL/BROKER_URL: manual runs are journaled but not sent")
        return None, _no_broker
    return configure_broker(settings), enqueue_execute


async def dashboard(request: Request) -> Response:
    """The operators' page: static HTML whose script talks to /graphql like any client. The
    policy keeps every asset, request and socket on this origin (the token sits in the tab's
    session storage, so no foreign script may run beside it)."""
    host = request.headers.get("host", "")
    # The page's WebSocket goes to this same host ('self' covers ws: only in newer browsers).
    sockets = f" ws://{host} wss://{host}" if _HOST.fullmatch(host) else ""
    policy = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"connect-src 'self'{sockets}; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
    return HTMLResponse(
        tracing_page.with_trace_url(
            (STATIC_DIR / "dashboard.html").read_text(),
            state_of(request)["settings"].trace_url_template,
        ),
        headers={
            "Content-Security-Policy": policy,
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )


async def metrics(request: Request) -> Response:
    """Prometheus text: this process's instruments plus the cluster-wide journal families."""
    try:
        async with state_of(request)["engine"].connect() as conn:
            snapshot = await database_snapshot(conn)
    except Exception as exc:
        # The scrape fails visibly (an alert) but still shows the process's own instruments.
        logger.warning("metrics: database unreachable: %s", exc)
        return Response(render([]), status_code=503, media_type=CONTENT_TYPE)
    return Response(render(snapshot), media_type=CONTENT_TYPE)


def create_app(
    settings: Settings,
    *,
    engine: AsyncEngine | None = None,
    clock: Callable[[], datetime] | None = None,
    fast_execution: bool = True,
) -> Starlette:
    """The API application.

    Tests may pass their engine (then not disposed here) and a clock (the request's `now`);
    `fast_execution=False` serves Strawberry's standard execution instead of `api/execution.py`
    (the differential test's reference).
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        own_engine = engine is None
        active = (
            create_engine(settings, pre_ping=True, keep_connections=True, lifo=True)
            if engine is None
            else engine
        )
        if problem := verification_problem(settings):
            # `serve` and `run` refuse to start first (exit 2); a factory caller gets this.
            raise RuntimeError(problem)
        try:
            async with active.begin() as conn:
                await sync_tool_catalog(conn)
            broker, enqueue = _broker(settings)
            # One bus over one LISTEN connection feeds every subscription (api/live/).
            live = LiveUpdates(active, queue_size=settings.subscriber_queue_size)
            await live.start(listen_timeout=HUB_LISTEN_TIMEOUT_SECONDS)
            # Tests find the process's live path here (subscriber counts, listening).
            app.state.live = live
            sessions = SessionRegistry(
                active,
                interval_seconds=settings.session_check_seconds,
                max_sockets_per_user=settings.max_sockets_per_user,
            )
            await sessions.start()
            # Tests and operators find the process's sessions here too.
            app.state.sessions = sessions
            try:
                yield State(
                    engine=active,
                    settings=settings,
                    broker=broker,
                    enqueue=enqueue,
                    live=live,
                    sessions=sessions,
                    verifier=verifier,
                )
            finally:
                await sessions.stop()
                await live.stop()
        finally:
            if own_engine:
                await active.dispose()

    # One per process, for HTTP requests and WebSocket sessions alike (the JWKS cache).
    verifier = TokenVerifier(settings)
    view = GraphQLView(
        settings, clock or (lambda: datetime.now(UTC)), fast_execution=fast_execution
    )
    return Starlette(
        routes=[
            Route(GRAPHQL_PATH, view, methods=["GET", "POST"]),
            WebSocketRoute(GRAPHQL_PATH, view),
            Route(DASHBOARD_PATH, dashboard),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/oauth/callback", oauth_callback, methods=["GET"]),
            Route("/metrics", metrics),
            # GraphiQL's bundle is a few MB; compressed it is a few hundred KB. Only the assets:
            # compressing every GraphQL answer (level 9) cost the agents page ~6 % of its CPU.
            Mount(
                STATIC_PATH,
                GZipMiddleware(StaticFiles(directory=STATIC_DIR), minimum_size=1024),
                name="static",
            ),
        ],
        middleware=[
            *tracing.asgi_middleware(),
            Middleware(HttpMetrics),
            Middleware(BodySizeLimit, max_bytes=settings.max_body_bytes),
        ],
        lifespan=lifespan,
    )


def create_app_from_environment() -> Starlette:
    """Factory for `uvicorn --factory` worker processes: each loads Settings itself."""
    # Before the app: its middleware list reads the flag.
    tracing.configure_tracing(tracing.API_SERVICE)
    app = create_app(load_settings())
    tune_gc()
    return app


__all__ = ["GraphQLView", "State", "create_app", "create_app_from_environment"]
