"""Liveness and readiness: `/healthz` answers while the process serves; `/readyz` asks the
database and the broker and says which of them is down."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent_engine.api.state import state_of
from agent_engine.db.connections import any_owner_oauth_source
from agent_engine.db.engine import ping
from agent_engine.workers.broker import ping_broker

logger = logging.getLogger("agent_engine.api")

READINESS_TIMEOUT_SECONDS = 2.0


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the database and the broker answer (and, with a JWKS URL, the identity
    provider's keys are held); 503 naming what is down otherwise."""
    state = state_of(request)
    database, broker = await asyncio.gather(
        _check_database(state["engine"]), _check_broker(state["settings"].effective_broker_url)
    )
    body: dict[str, str] = {"database": database, "broker": broker}
    # Informational: a reconnecting listener delays subscription events, not requests.
    body["events"] = "listening" if state["live"].listening else "reconnecting"
    down = [name for name in ("database", "broker") if body[name] == "unreachable"]
    jwks = state["verifier"].jwks
    if jwks is not None:
        # Without the keys no token verifies: the api cannot serve anyone.
        try:
            async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
                status = await jwks.status()
            body["jwks"] = status.detail
        except TimeoutError:
            body["jwks"] = "unreachable: no answer in time"
        if not body["jwks"].startswith("ok"):
            down.append("jwks")
    if database == "ok" and state["settings"].token_keys is None:
        try:
            async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
                async with state["engine"].connect() as conn:
                    needed = await any_owner_oauth_source(conn)
        except Exception:
            needed = False
        if needed:
            # Informational: everything else works; owners cannot connect nor use accounts.
            body["tokenKeys"] = (
                "missing: an OWNER_OAUTH tool source exists and AGENT_ENGINE_TOKEN_KEYS is not"
                " set; owners cannot connect their accounts"
            )
    if down:
        return JSONResponse({"status": "unavailable", "down": down, **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


async def _check_database(engine: AsyncEngine) -> str:
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            async with engine.connect() as conn:
                await ping(conn)
    except Exception as exc:
        logger.warning("readiness: database unreachable: %s", exc)
        return "unreachable"
    return "ok"


async def _check_broker(url: str | None) -> str:
    if not url:
        return "not configured"
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            await ping_broker(url, timeout_seconds=READINESS_TIMEOUT_SECONDS)
    except Exception as exc:
        logger.warning("readiness: broker unreachable: %s", exc)
        return "unreachable"
    return "ok"
