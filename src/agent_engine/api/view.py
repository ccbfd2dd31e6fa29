"""The GraphQL endpoint's view: Strawberry's ASGI view with our context, authentication (a bearer
token over HTTP, the `connection_init` payload over graphql-transport-ws), the GraphiQL page, one
operation per request and transport errors as GraphQL JSON (`api/app.py` mounts it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from cross_web import AsyncHTTPRequestAdapter, HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse
from strawberry.http.types import QueryParams
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types import ExecutionResult
from strawberry.types.unset import UNSET, UnsetType

from agent_engine.api.auth import bearer_token
from agent_engine.api.claims import Caller, needs_provisioning, provision_user, viewer_of
from agent_engine.api.context import Context
from agent_engine.api.encoding import dumps
from agent_engine.api.errors import (
    PAYLOAD_TOO_LARGE,
    ApiError,
    Unauthenticated,
    stray_cancellation,
)
from agent_engine.api.graphql_http import (
    APPLICATION_JSON,
    is_request_error,
    prefers_graphql_response_json,
)
from agent_engine.api.graphql_http import CONTENT_TYPE as GRAPHQL_RESPONSE_CONTENT_TYPE
from agent_engine.api.guards import document_guards, document_too_large
from agent_engine.api.http_operations import ReleaseLoaders, SubscriptionsOverSocketsOnly
from agent_engine.api.loaders import Loaders
from agent_engine.api.schema import build_schema
from agent_engine.api.sessions import SessionHandler, check_room
from agent_engine.api.state import State, state_of
from agent_engine.api.transport import UnreadableJson, decode_json_body
from agent_engine.db.users import read_user_with_platform
from agent_engine.settings import Settings

STATIC_DIR = Path(__file__).parent / "static"


async def _authenticate(
    state: State,
    authorization: str | None,
    *,
    now: datetime,
    loaders: Loaders | None = None,
) -> tuple[Caller | None, ApiError | None]:
    """The viewer of a bearer token; over HTTP on the request's loaders' connection."""
    try:
        token = bearer_token(authorization)
        if token is None:
            return None, None
        claims = await state["verifier"].verify(token)
        # A read first; the upsert (its own transaction) only on first sight or changed claims,
        # after the reader went back to the pool.
        if loaders is not None:
            async with loaders.connection() as conn:
                row, platform = await read_user_with_platform(conn, claims.user_id)
            loaders.prime_platform(platform)
        else:  # a WebSocket: read with the other sockets' checks of the moment
            row = await state["sessions"].read_user(claims.user_id)
        if row is None or needs_provisioning(row, claims):
            row = await provision_user(state["engine"], claims, now=now)
        return viewer_of(row, claims), None
    except ApiError as exc:
        return None, exc


class GraphQLView(GraphQL[Context, None]):
    """Strawberry's ASGI view with our context, auth, GraphiQL page and JSON transport errors.

    WebSocket sessions are held to a request's rules for their whole life (`api/sessions.py`).
    """

    graphql_transport_ws_handler_class = SessionHandler

    def __init__(
        self, settings: Settings, clock: Callable[[], datetime], *, fast_execution: bool = True
    ) -> None:
        super().__init__(
            build_schema(
                [SubscriptionsOverSocketsOnly, *document_guards(settings), ReleaseLoaders],
                fast_execution=fast_execution,
            ),
            graphql_ide="graphiql",
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
            max_subscriptions_per_connection=settings.max_subscriptions_per_connection,
        )
        self.clock = clock
        self.max_document_bytes = settings.max_document_bytes

    def encode_json(self, data: object) -> str:
        # Text, not bytes: the WebSocket transport sends bytes as binary frames.
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
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the request itself is cancelled (client gone, shutdown)
            response = JSONResponse(stray_cancellation(exc))
        if prefers_graphql_response_json(request.headers.get("accept")):
            _as_graphql_response_json(request, response)
        await response(scope, receive, send)

    async def process_result(
        self, request: Request, result: ExecutionResult
    ) -> GraphQLHTTPResponse:
        """A request error answered as `application/graphql-response+json` has no `data` entry
        (and a 400, set in `__call__`); `api/graphql_http.py`."""
        response = await super().process_result(request, result)
        if (
            isinstance(request, Request)
            and is_request_error(result)
            and prefers_graphql_response_json(request.headers.get("accept"))
        ):
            request.state.graphql_request_error = True
            response.pop("data", None)
        return response

    async def get_context(self, request: Request | WebSocket, response: Any) -> Context:
        state = state_of(request)
        engine = state["engine"]
        context = Context(
            new_loaders=lambda now: Loaders(engine, now=now),
            now=self.clock(),
            request=request,
            response=response,
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
            state_of(context.request),
            _ws_authorization(context.connection_params or {}),
            now=self.clock(),
        )
        if viewer is None:
            error = error or Unauthenticated()
            raise ConnectionRejectionError({"message": error.message, **error.extensions})
        check_room(context, viewer.user_id)  # closed 4429 by the session handler
        context.viewer = viewer
        return cast(UnsetType, UNSET)

    async def reauthenticate(self, context: Context) -> Caller:
        """The session's token checked again, as for a request (every WebSocket operation)."""
        viewer, error = await _authenticate(
            state_of(context.request),
            _ws_authorization(context.connection_params or {}),
            now=self.clock(),
        )
        if viewer is None:
            raise error or Unauthenticated()
        return viewer

    async def render_graphql_ide(self, request: Request) -> Response:
        return HTMLResponse((STATIC_DIR / "graphiql.html").read_text())

    def decode_json(self, data: str | bytes) -> object:
        """A JSON array is a batch of operations, which this API does not take."""
        decoded = decode_json_body(data)
        if isinstance(decoded, list):
            raise HTTPException(
                400, "batched requests are not supported: send one GraphQL operation per request"
            )
        return decoded

    def parse_json(self, data: str | bytes) -> Any:
        try:
            return self.decode_json(data)
        except UnreadableJson as exc:
            raise HTTPException(400, exc.reason) from exc
        except json.JSONDecodeError as exc:
            raise HTTPException(400, "Unable to parse request body as JSON") from exc

    async def parse_http_body(self, request: AsyncHTTPRequestAdapter) -> Any:
        """A document over the size limit is refused (413) before anything parses it."""
        data = await super().parse_http_body(request)
        query = getattr(data, "query", None)
        if isinstance(query, str) and (
            problem := document_too_large(query, self.max_document_bytes)
        ):
            raise HTTPException(413, problem)
        return data

    def parse_query_params(self, params: QueryParams) -> dict[str, Any]:
        """A GET's `variables` and `extensions` are JSON too, but an array there is no batch:
        Strawberry's own check then names the field."""
        parsed: dict[str, Any] = dict(params)
        for key in ("variables", "extensions"):
            if value := parsed.get(key):
                try:
                    parsed[key] = decode_json_body(value)
                except UnreadableJson as exc:
                    raise HTTPException(400, f"`{key}`: {exc.reason}") from exc
                except json.JSONDecodeError as exc:
                    raise HTTPException(400, f"`{key}` is not valid JSON") from exc
        return parsed


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


def _as_graphql_response_json(request: Request, response: Response) -> None:
    """A JSON answer of the GraphQL endpoint in the spec's media type (not GraphiQL's page)."""
    if not response.headers.get("content-type", "").startswith(APPLICATION_JSON):
        return
    response.headers["content-type"] = GRAPHQL_RESPONSE_CONTENT_TYPE
    if getattr(request.state, "graphql_request_error", False) and response.status_code == 200:
        response.status_code = 400


def _transport_error(message: str, status_code: int) -> Response:
    code = {400: "BAD_REQUEST", 413: PAYLOAD_TOO_LARGE}.get(status_code, f"HTTP_{status_code}")
    return JSONResponse(
        {"errors": [{"message": message, "extensions": {"code": code}}]}, status_code=status_code
    )
