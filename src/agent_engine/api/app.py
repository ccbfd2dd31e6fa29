"""The Starlette application: GraphQL (HTTP + graphql-transport-ws), GraphiQL, the dashboard page,
health, readiness and metrics.

The lifespan owns the process's resources and yields them as typed state (no globals): the engine,
the settings, the broker used to send execute messages after a manual start, and the run-event hub
(one LISTEN connection per api process) that feeds the subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict, cast
from urllib.parse import urlsplit

import dramatiq
import redis.asyncio as aioredis
from cross_web import HTTPException
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError, MissingQueryError
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType
from strawberry.types.unset import UNSET, UnsetType

from agent_engine.api.alert_events import BudgetAlertFeed
from agent_engine.api.auth import (
    Viewer,
    bearer_token,
    needs_provisioning,
    provision_user,
    read_user,
    short_secret_warning,
    verify_token,
    viewer_of,
)
from agent_engine.api.context import Context, Enqueue
from agent_engine.api.errors import ApiError, Unauthenticated
from agent_engine.api.events import RunEventHub
from agent_engine.api.fanout import Broadcaster, dumps
from agent_engine.api.guards import BodySizeLimit, document_guards
from agent_engine.api.loaders import Loaders
from agent_engine.api.schema import build_schema
from agent_engine.api.sessions import SessionHandler, SessionRegistry
from agent_engine.db.engine import create_engine
from agent_engine.observability.http import HttpMetrics
from agent_engine.observability.metrics import CONTENT_TYPE, database_snapshot, render
from agent_engine.runtime.tools.registry import sync_tool_catalog
from agent_engine.settings import Settings

logger = logging.getLogger("agent_engine.api")

STATIC_DIR = Path(__file__).parent / "static"
GRAPHQL_PATH = "/graphql"
DASHBOARD_PATH = "/dashboard"
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
STATIC_PATH = "/static"
READINESS_TIMEOUT_SECONDS = 2.0
# The api starts serving subscriptions once its LISTEN connection is up, or after this long (the
# listener keeps reconnecting in the background).
HUB_LISTEN_TIMEOUT_SECONDS = 10.0
AMQP_DEFAULT_PORT = 5672
AMQPS_DEFAULT_PORT = 5671
# The AMQP 0-9-1 protocol header; a broker answers with a Connection.Start method frame (type 1).
AMQP_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP_METHOD_FRAME = 1


class State(TypedDict):
    engine: AsyncEngine
    settings: Settings
    broker: dramatiq.Broker | None
    enqueue: Enqueue
    hub: RunEventHub
    sessions: SessionRegistry
    alert_feed: BudgetAlertFeed
    broadcaster: Broadcaster


def _no_broker(run_id: int) -> None:
    raise RuntimeError(f"no broker configured: run {run_id} waits for the reaper to re-send it")


def _broker(settings: Settings) -> tuple[dramatiq.Broker | None, Enqueue]:
    if not settings.effective_broker_url:
        logger.warning("no REDIS_URL/BROKER_URL: manual runs are journaled but not sent")
        return None, _no_broker
    from agent_engine.workers.broker import configure_broker, enqueue_execute

    return configure_broker(settings), enqueue_execute


def _state(connection: Request | WebSocket) -> State:
    # Starlette copies the lifespan's yielded mapping into each request's scope.
    return cast(State, connection.scope["state"])


async def _authenticate(
    state: State,
    authorization: str | None,
    *,
    now: datetime,
    loaders: Loaders | None = None,
) -> tuple[Viewer | None, ApiError | None]:
    """The viewer of a bearer token; over HTTP on the request's loaders' connection."""
    try:
        token = bearer_token(authorization)
        if token is None:
            return None, None
        claims = verify_token(state["settings"], token)
        # A read first; the upsert (its own transaction) only on first sight or changed claims,
        # after the reader went back to the pool.
        if loaders is not None:
            async with loaders.connection() as conn:
                row = await read_user(conn, claims.user_id)
        else:
            async with state["engine"].connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                row = await read_user(conn, claims.user_id)
        if needs_provisioning(row, claims):
            row = await provision_user(state["engine"], claims, now=now)
        return viewer_of(row, claims), None
    except ApiError as exc:
        return None, exc


class GraphQLView(GraphQL[Context, None]):
    """Strawberry's ASGI view with our context, auth, GraphiQL page and JSON transport errors.

    WebSocket sessions are held to a request's rules for their whole life (`api/sessions.py`).
    """

    graphql_transport_ws_handler_class = SessionHandler

    def __init__(self, settings: Settings, clock: Callable[[], datetime]) -> None:
        super().__init__(
            build_schema(document_guards(settings)),
            graphql_ide="graphiql",
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
            max_subscriptions_per_connection=settings.max_subscriptions_per_connection,
        )
        self.clock = clock

    def encode_json(self, data: object) -> str:
        return dumps(data)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        request = Request(scope, receive=receive)
        try:
            response = await self.run(request)
        except HTTPException as exc:
            response = _transport_error(exc.reason, exc.status_code)
        await response(scope, receive, send)

    async def get_context(self, request: Request | WebSocket, response: Any) -> Context:
        state = _state(request)
        context = Context(
            engine=state["engine"],
            settings=state["settings"],
            enqueue=state["enqueue"],
            now=self.clock(),
            request=request,
            response=response,
            hub=state["hub"],
            sessions=state["sessions"],
            alert_feed=state["alert_feed"],
            broadcaster=state["broadcaster"],
            clock=self.clock,
        )
        if isinstance(request, Request):
            context.viewer, context.auth_error = await _authenticate(
                state,
                request.headers.get("authorization"),
                now=context.now,
                loaders=context.loaders,
            )
        return context

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """graphql-transport-ws: the bearer token travels in the `connection_init` payload.

        A connection without a valid token is refused: Strawberry closes it with 4403 (and a
        `subscribe` before the acknowledgement with 4401), as the protocol says.
        """
        viewer, error = await _authenticate(
            _state(context.request),
            _ws_authorization(context.connection_params or {}),
            now=self.clock(),
        )
        if viewer is None:
            error = error or Unauthenticated()
            raise ConnectionRejectionError({"message": error.message, **error.extensions})
        context.viewer = viewer
        return cast(UnsetType, UNSET)

    async def reauthenticate(self, context: Context) -> Viewer:
        """The session's token checked again, as for a request (every WebSocket operation)."""
        viewer, error = await _authenticate(
            _state(context.request),
            _ws_authorization(context.connection_params or {}),
            now=self.clock(),
        )
        if viewer is None:
            raise error or Unauthenticated()
        return viewer

    async def render_graphql_ide(self, request: Request) -> Response:
        return HTMLResponse((STATIC_DIR / "graphiql.html").read_text())

    async def execute_single(
        self,
        request: Any,
        request_adapter: Any,
        sub_response: Any,
        context: Context,
        root_value: None,
        request_data: Any,
    ) -> ExecutionResult:
        """As Strawberry's, but subscriptions are for graphql-transport-ws only: over plain HTTP
        they are a 400 rather than a resolver run outside of a stream."""
        allowed = OperationType.from_http(request_adapter.method) - {OperationType.SUBSCRIPTION}
        try:
            return await self.schema.execute(
                request_data.query,
                root_value=root_value,
                variable_values=request_data.variables,
                context_value=context,
                operation_name=request_data.operation_name,
                allowed_operation_types=allowed,
                operation_extensions=request_data.extensions,
            )
        except CannotGetOperationTypeError as exc:
            raise HTTPException(400, exc.as_http_error_reason()) from exc
        except InvalidOperationTypeError as exc:
            raise HTTPException(400, exc.as_http_error_reason(request_adapter.method)) from exc
        except MissingQueryError as exc:
            raise HTTPException(400, "No GraphQL query found in the request") from exc
        finally:
            # The loaders' shared connection goes back to the pool with the request.
            await context.release()

    def _validate_batch_request(self, request_data: Any, protocol: Any) -> None:
        raise HTTPException(
            400, "batched requests are not supported: send one GraphQL operation per request"
        )


def _ws_authorization(params: dict[str, Any]) -> str | None:
    """`Authorization: Bearer …` (either case), or a bare `token`, from `connection_init`."""
    for key in ("Authorization", "authorization"):
        value = params.get(key)
        if isinstance(value, str):
            return value
    token = params.get("token")
    if isinstance(token, str) and token.strip():
        return token if token.lower().startswith("bearer ") else f"Bearer {token.strip()}"
    return None


def _transport_error(message: str, status_code: int) -> Response:
    code = "BAD_REQUEST" if status_code == 400 else "HTTP_" + str(status_code)
    return JSONResponse(
        {"errors": [{"message": message, "extensions": {"code": code}}]}, status_code=status_code
    )


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
        (STATIC_DIR / "dashboard.html").read_text(),
        headers={
            "Content-Security-Policy": policy,
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the database and the broker answer; 503 naming what is down otherwise."""
    state = _state(request)
    database, broker = await asyncio.gather(
        _check_database(state["engine"]), _check_broker(state["settings"].effective_broker_url)
    )
    body: dict[str, str] = {"database": database, "broker": broker}
    # Informational: a reconnecting listener delays subscription events, not requests.
    body["events"] = "listening" if state["hub"].listening else "reconnecting"
    down = [name for name in ("database", "broker") if body[name] == "unreachable"]
    if down:
        return JSONResponse({"status": "unavailable", "down": down, **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


async def _check_database(engine: AsyncEngine) -> str:
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    except Exception as exc:
        logger.warning("readiness: database unreachable: %s", exc)
        return "unreachable"
    return "ok"


async def _check_broker(url: str | None) -> str:
    if not url:
        return "not configured"
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            if url.startswith(("amqp://", "amqps://")):
                await _amqp_handshake(url)
            else:
                client = aioredis.Redis.from_url(
                    url,
                    socket_connect_timeout=READINESS_TIMEOUT_SECONDS,
                    socket_timeout=READINESS_TIMEOUT_SECONDS,
                )
                try:
                    await client.ping()
                finally:
                    await client.aclose()
    except Exception as exc:
        logger.warning("readiness: broker unreachable: %s", exc)
        return "unreachable"
    return "ok"


async def _amqp_handshake(url: str) -> None:
    """Open a connection and read the broker's Connection.Start: it speaks AMQP and accepts us.
    (Credentials are checked by the workers' own connections, not here.)"""
    parts = urlsplit(url)
    tls = parts.scheme == "amqps"
    port = parts.port or (AMQPS_DEFAULT_PORT if tls else AMQP_DEFAULT_PORT)
    reader, writer = await asyncio.open_connection(parts.hostname or "localhost", port, ssl=tls)
    try:
        writer.write(AMQP_PROTOCOL_HEADER)
        await writer.drain()
        frame_type = (await reader.readexactly(1))[0]
        if frame_type != AMQP_METHOD_FRAME:
            raise ConnectionError(f"not an AMQP 0-9-1 broker (frame type {frame_type})")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def metrics(request: Request) -> Response:
    """Prometheus text: this process's instruments plus the cluster-wide journal families."""
    try:
        async with _state(request)["engine"].connect() as conn:
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
) -> Starlette:
    """The API application.

    Tests may pass their engine (then not disposed here) and a clock (the request's `now`).
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        own_engine = engine is None
        active = (
            create_engine(settings, pre_ping=True, keep_connections=True)
            if engine is None
            else engine
        )
        if warning := short_secret_warning(settings):
            logger.warning(warning)
        try:
            async with active.begin() as conn:
                await sync_tool_catalog(conn)
            broker, enqueue = _broker(settings)
            hub = RunEventHub(
                active.url.render_as_string(hide_password=False),
                queue_size=settings.subscriber_queue_size,
            )
            # Budget alerts come over the hub's LISTEN connection too (budgetAlerts).
            alert_feed = BudgetAlertFeed(queue_size=settings.subscriber_queue_size)
            alert_feed.attach(hub)
            await hub.start()
            broadcaster = Broadcaster(queue_size=settings.subscriber_queue_size)
            # Tests and operators find the process's hub here (subscriber count, listening).
            app.state.hub = hub
            app.state.alert_feed = alert_feed
            app.state.broadcaster = broadcaster
            try:
                async with asyncio.timeout(HUB_LISTEN_TIMEOUT_SECONDS):
                    await hub.wait_listening()
            except TimeoutError:
                logger.warning("run events: not listening yet; subscriptions wait for it")
            sessions = SessionRegistry(active, interval_seconds=settings.session_check_seconds)
            await sessions.start()
            # Tests and operators find the process's sessions here too.
            app.state.sessions = sessions
            try:
                yield State(
                    engine=active,
                    settings=settings,
                    broker=broker,
                    enqueue=enqueue,
                    hub=hub,
                    sessions=sessions,
                    alert_feed=alert_feed,
                    broadcaster=broadcaster,
                )
            finally:
                await sessions.stop()
                await broadcaster.stop()
                await hub.stop()
                alert_feed.close()
        finally:
            if own_engine:
                await active.dispose()

    view = GraphQLView(settings, clock or (lambda: datetime.now(UTC)))
    return Starlette(
        routes=[
            Route(GRAPHQL_PATH, view, methods=["GET", "POST"]),
            WebSocketRoute(GRAPHQL_PATH, view),
            Route(DASHBOARD_PATH, dashboard),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
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
            Middleware(HttpMetrics),
            Middleware(BodySizeLimit, max_bytes=settings.max_body_bytes),
        ],
        lifespan=lifespan,
    )


def create_app_from_environment() -> Starlette:
    """Factory for `uvicorn --factory` worker processes: each loads Settings itself."""
    from agent_engine.settings import load_settings

    return create_app(load_settings())


__all__ = ["GraphQLView", "State", "create_app", "create_app_from_environment"]
