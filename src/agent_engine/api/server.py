"""`agent-engine serve`: the API under Uvicorn."""

from __future__ import annotations

import uvicorn

from agent_engine.collector import tune_gc
from agent_engine.observability.logging import configure_logging, library_log_level
from agent_engine.observability.tracing import API_SERVICE, configure_tracing
from agent_engine.settings import Settings

APP_FACTORY = "agent_engine.api.app:create_app_from_environment"


def serve(settings: Settings, *, host: str, port: int, workers: int = 1) -> None:
    log_level = library_log_level(settings, configure_logging(settings))
    configure_tracing(API_SERVICE)
    if workers > 1:
        # Worker processes cannot receive a live object: each builds its app from the environment.
        uvicorn.run(
            APP_FACTORY,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            log_config=None,  # keep our structlog handlers
            proxy_headers=True,
            # A WebSocket message is limited like a request body.
            ws_max_size=settings.max_body_bytes,
        )
        return
    # Imported only here: the supervisor of several workers never builds an app (start-up cost).
    from agent_engine.api.app import create_app

    app = create_app(settings)
    tune_gc()
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,  # keep our structlog handlers
        proxy_headers=True,
        ws_max_size=settings.max_body_bytes,
    )
