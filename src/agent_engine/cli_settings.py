"""The settings a command of the `agent-engine` command line (`cli.py`) runs with.

Invalid settings stop the command at once with what is wrong (exit status 2); a long-running
process refuses to start without its database or broker; a one-off command attaches to the
embedded PostgreSQL (and the JWT secret) that `agent-engine run` keeps in the data dir.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from agent_engine.settings import Settings


def command_settings() -> Settings:
    """The settings from the environment; settings that are invalid or contradict each other
    stop the command at once with what is wrong (exit status 2)."""
    from pydantic import ValidationError

    from agent_engine.settings import load_settings

    try:
        return load_settings()
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            typer.echo(f"invalid configuration: {where + ': ' if where else ''}{message}", err=True)
        raise typer.Exit(2) from None


def required_settings(*, database: bool, broker: bool) -> Settings:
    """Settings for a long-running process, refusing to start without what it needs."""
    settings = command_settings()
    if database and not settings.database_url:
        typer.echo("DATABASE_URL is not set", err=True)
        raise typer.Exit(2)
    if broker and not settings.effective_broker_url:
        typer.echo("no broker: set REDIS_URL (or BROKER_URL=amqp://… for RabbitMQ)", err=True)
        raise typer.Exit(2)
    return settings


def attached_settings() -> Settings:
    """Settings for a one-off command. Without DATABASE_URL, attach to the embedded PostgreSQL
    that `agent-engine run` keeps in the data dir, if it is running; without a JWT secret, use the
    one `run` generated there. So `knowledge import` and `token` work beside `make run`."""
    from agent_engine.embedded import EmbeddedPostgres

    settings = command_settings()
    updates: dict[str, object] = {}
    if not settings.database_url:
        postgres = EmbeddedPostgres(settings.data_dir / "postgres")
        if postgres.attach():
            updates["database_url"] = postgres.url
    secret_file = settings.data_dir / "jwt-secret"
    if not settings.jwt_secret and secret_file.exists():
        updates["jwt_secret"] = secret_file.read_text().strip()
    return settings.model_copy(update=updates) if updates else settings
