"""The Starlette application: GraphQL (HTTP + graphql-transport-ws), GraphiQL, health and readiness.

The lifespan owns the process's resources and yields them as typed state (no globals): the engine,
the settings, and the broker used to send execute messages after a manual start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict, cast

import dramatiq
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
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types.unset import UNSET, UnsetType

from agent_engine.api.auth import (
    Viewer,
    bearer_token,
    provision_user,
    short_secret_warning,
    verify_token,
)
from agent_engine.api.context import Context, Enqueue
from agent_engine.api.errors import ApiError
from agent_engine.api.guards import BodySizeLimit, document_guards
from agent_engine.api.schema import build_schema
from agent_engine.db.engine import create_engine
from agent_engine.runtime.tools.registry import sync_tool_catalog
from agent_engine.settings import Settings

logger = logging.getLogger("agent_engine.api")

STATIC_DIR = Path(__file__).parent / "static"
GRAPHQL_PATH = "/graphql"
STATIC_PATH = "/static"
READINESS_TIMEOUT_SECONDS = 2.0


class State(TypedDict):
    engine: AsyncEngine
    settings: Settings
    broker: dramatiq.Broker | None
    enqueue: Enqueue


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
    state: State, authorization: str | None
) -> tuple[Viewer | None, ApiError | None]:
    try:
        token = bearer_token(authorization)
        if token is None:
            return None, None
        claims = verify_token(state["settings"], token)
        async with state["engine"].begin() as conn:
            return await provision_user(conn, claims), None
    except ApiError as exc:
        return None, exc


class GraphQLView(GraphQL[Context, None]):
    """Strawberry's ASGI view with our context, auth, GraphiQL page and JSON transport errors."""

    def __init__(self, settings: Settings, clock: Callable[[], datetime]) -> None:
        super().__init__(
            build_schema(document_guards(settings)),
            graphql_ide="graphiql",
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
            max_subscriptions_per_connection=settings.max_subscriptions_per_connection,
        )
        self.clock = clock

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
        )
        if isinstance(request, Request):
            context.viewer, context.auth_error = await _authenticate(
                state, request.headers.get("authorization")
            )
        return context

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """graphql-transport-ws: the bearer token travels in the `connection_init` payload."""
        params = context.connection_params or {}
        authorization = params.get("Authorization") or params.get("authorization")
        state = _state(context.request)
        viewer, error = await _authenticate(
            state, authorization if isinstance(authorization, str) else None
        )
        if error is not None:
            raise ConnectionRejectionError({"message": error.message, **error.extensions})
        context.viewer = viewer
        return cast(UnsetType, UNSET)

    async def render_graphql_ide(self, request: Request) -> Response:
        return HTMLResponse((STATIC_DIR / "graphiql.html").read_text())

    def _validate_batch_request(self, request_data: Any, protocol: Any) -> None:
        raise HTTPException(
            400, "batched requests are not supported: send one GraphQL operation per request"
        )


def _transport_error(message: str, status_code: int) -> Response:
    code = "BAD_REQUEST" if status_code == 400 else "HTTP_" + str(status_code)
    return JSONResponse(
        {"errors": [{"message": message, "extensions": {"code": code}}]}, status_code=status_code
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    state = _state(request)
    try:
        async with state["engine"].connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        logger.warning("readiness: database unreachable: %s", exc)
        return JSONResponse({"status": "unavailable", "database": "unreachable"}, status_code=503)
    return JSONResponse({"status": "ready", "database": "ok"})


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
        active = create_engine(settings) if engine is None else engine
        if warning := short_secret_warning(settings):
            logger.warning(warning)
        try:
            async with active.begin() as conn:
                await sync_tool_catalog(conn)
            broker, enqueue = _broker(settings)
            yield State(engine=active, settings=settings, broker=broker, enqueue=enqueue)
        finally:
            if own_engine:
                await active.dispose()

    view = GraphQLView(settings, clock or (lambda: datetime.now(UTC)))
    return Starlette(
        routes=[
            Route(GRAPHQL_PATH, view, methods=["GET", "POST"]),
            WebSocketRoute(GRAPHQL_PATH, view),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="static"),
        ],
        middleware=[
            Middleware(BodySizeLimit, max_bytes=settings.max_body_bytes),
            # GraphiQL's bundle is a few MB; compressed it is a few hundred KB.
            Middleware(GZipMiddleware, minimum_size=1024),
        ],
        lifespan=lifespan,
    )


def create_app_from_environment() -> Starlette:
    """Factory for `uvicorn --factory` worker processes: each loads Settings itself."""
    from agent_engine.settings import load_settings

    return create_app(load_settings())


__all__ = ["GraphQLView", "State", "create_app", "create_app_from_environment"]
