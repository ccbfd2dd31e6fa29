"""The `agent-engine` command line (Typer).

Every command is thin: it loads Settings once, then calls one function of the package. Imports of
heavy modules happen inside the commands so `--help` stays fast. The settings a command runs
with are `cli_settings.py`; what `export-schema` writes, `cli_export.py`.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from agent_engine.cli_export import database_schema, write_export
from agent_engine.cli_settings import attached_settings, command_settings, required_settings

app = typer.Typer(
    name="agent-engine",
    help="Agent Engine: personal AI agents with schedules, budgets and a run journal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
knowledge_app = typer.Typer(help="The Knowledge Store stand-in.", no_args_is_help=True)
schedule_app = typer.Typer(help="Schedules.", no_args_is_help=True)
webhook_app = typer.Typer(help="Signed run deliveries (Standard Webhooks).", no_args_is_help=True)
app.add_typer(knowledge_app, name="knowledge")
app.add_typer(schedule_app, name="schedule")
app.add_typer(webhook_app, name="webhook")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


@app.command()
def run(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="HTTP port.")] = DEFAULT_PORT,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Embedded PostgreSQL and Valkey data "
            "(default: AGENT_ENGINE_DATA_DIR, else ./.agent-engine)."
        ),
    ] = None,
    worker_threads: Annotated[
        int,
        typer.Option(
            help="Worker claiming threads (runs in flight: AGENT_ENGINE_RUNS_IN_FLIGHT, 200)."
        ),
    ] = 4,
    seed: Annotated[bool, typer.Option(help="Seed the demo users, model and agent.")] = True,
) -> None:
    """All in one: embedded servers, migrations, demo seed, then api + worker + clock."""
    from agent_engine.api.auth import verification_problem
    from agent_engine.embedded import missing_servers_message

    settings = command_settings()
    # The slim install (no `embedded` extra) runs only against servers it is given.
    missing = missing_servers_message(
        database_url=settings.database_url, redis_url=settings.redis_url
    )
    if missing:
        typer.echo(missing, err=True)
        raise typer.Exit(2)
    # Without a secret, `run` generates one; a given one must be strong enough, and a JWKS
    # needs its audience.
    if (settings.jwt_secret or settings.jwt_jwks_url) and (
        problem := verification_problem(settings)
    ):
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    from agent_engine.allinone import port_in_use, run_all

    if port_in_use(host, port):
        typer.echo(
            f"agent-engine run: port {port} on {host} is in use (another `agent-engine run`?);"
            " choose another with --port",
            err=True,
        )
        raise typer.Exit(2)

    run_all(
        settings,
        host=host,
        port=port,
        data_dir=data_dir or settings.data_dir,
        worker_threads=worker_threads,
        seed=seed,
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="HTTP port.")] = DEFAULT_PORT,
    workers: Annotated[int, typer.Option(help="Uvicorn worker processes.")] = 1,
) -> None:
    """The GraphQL API (HTTP and WebSocket), /healthz, /readyz and /metrics."""
    from agent_engine.api.auth import verification_problem
    from agent_engine.api.server import serve as serve_api

    settings = required_settings(database=True, broker=False)
    # Fail at start, not with every request refused: a server that cannot verify tokens is
    # useless, and one with a short secret lets anyone who holds a token forge others.
    if problem := verification_problem(settings):
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    serve_api(settings, host=host, port=port, workers=workers)


@app.command()
def worker(
    processes: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    threads: Annotated[
        int, typer.Option(help="Claiming threads per process (not the runs in flight).", min=1)
    ] = 16,  # workers.main.DEFAULT_THREADS (not imported here: the CLI starts light)
    runs_in_flight: Annotated[
        int | None,
        typer.Option(
            help="Runs executing at once per process (default: AGENT_ENGINE_RUNS_IN_FLIGHT, 200).",
            min=1,
        ),
    ] = None,
    queues: Annotated[list[str] | None, typer.Option(help="Only these queues.")] = None,
) -> None:
    """A Dramatiq worker: executes runs, scans schedules and reaps stale runs."""
    from agent_engine.workers.main import run_worker

    settings = required_settings(database=True, broker=True)
    if runs_in_flight is not None:
        settings = settings.model_copy(update={"runs_in_flight": runs_in_flight})
    run_worker(settings, processes=processes, threads=threads, queues=queues)


@app.command()
def clock() -> None:
    """Sends the schedule tick every few seconds and the reap tick every ~30 s. Safe to run many."""
    from agent_engine.workers.clock import run_clock

    run_clock(required_settings(database=False, broker=True))


@app.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "heads",
) -> None:
    """Bring the database (DATABASE_URL) to the latest schema."""
    from agent_engine.db.migrate import upgrade

    settings = attached_settings()
    if not settings.database_url:
        typer.echo("DATABASE_URL is not set (and no embedded server is running)", err=True)
        raise typer.Exit(2)
    upgrade(settings.database_url, revision)
    typer.echo(f"migrated to {revision}")


@app.command()
def token(
    user_id: Annotated[int, typer.Option("--user-id", help="The `sub` claim.")],
    email: Annotated[str | None, typer.Option(help="`email` claim.")] = None,
    name: Annotated[str | None, typer.Option(help="`name` claim.")] = None,
    timezone: Annotated[str | None, typer.Option(help="`zoneinfo` claim (IANA).")] = None,
    admin: Annotated[bool, typer.Option(help="Grant the agent_admin role.")] = False,
    ttl: Annotated[str, typer.Option(help="Lifetime: seconds or 30m, 12h, 7d.")] = "12h",
) -> None:
    """Print a development token signed with AGENT_ENGINE_JWT_SECRET."""
    from agent_engine.api.auth import mint_token, parse_ttl
    from agent_engine.demo.tokens import demo_max_lifetime

    settings = attached_settings()
    if not settings.jwt_secret:
        typer.echo("AGENT_ENGINE_JWT_SECRET is not set", err=True)
        raise typer.Exit(2)
    try:
        lifetime = parse_ttl(ttl)
    except ValueError as exc:
        typer.echo(f"--ttl: {exc}", err=True)
        raise typer.Exit(2) from exc
    # Beside `agent-engine run` (its generated secret), the api takes week-long demo tokens.
    demo_limit = demo_max_lifetime(command_settings())
    limit = (
        demo_limit.total_seconds() if demo_limit is not None else settings.jwt_max_lifetime_seconds
    )
    if lifetime.total_seconds() > limit:
        typer.echo(
            f"warning: --ttl {ttl} is longer than the api accepts ({limit:g} s, "
            "AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS): the token will be refused",
            err=True,
        )
    typer.echo(
        mint_token(
            settings.jwt_secret,
            user_id=user_id,
            email=email,
            name=name,
            timezone=timezone,
            admin=admin,
            ttl=lifetime,
        )
    )


@app.command("rotate-token-keys")
def rotate_token_keys(
    new_key: Annotated[
        bool, typer.Option("--new-key", help="Only print a fresh key (base64) and exit.")
    ] = False,
) -> None:
    """Re-encrypt every stored OAuth token with the first key of AGENT_ENGINE_TOKEN_KEYS.

    Rotation: put a new key first (keep the old ones after it), restart the api and workers, run
    this, then drop the old keys."""
    import asyncio

    from agent_engine.db.engine import create_engine
    from agent_engine.oauth.keys import Undecryptable
    from agent_engine.oauth.keys import new_key as fresh_key
    from agent_engine.oauth.rotate import rotate_token_keys as rotate

    if new_key:
        typer.echo(fresh_key())
        return
    settings = attached_settings()
    keys = settings.token_keyring()
    if keys is None:
        typer.echo("AGENT_ENGINE_TOKEN_KEYS is not set", err=True)
        raise typer.Exit(2)
    if not settings.database_url:
        typer.echo("DATABASE_URL is not set (and no embedded server is running)", err=True)
        raise typer.Exit(2)

    async def go() -> None:
        engine = create_engine(settings, pool_size=1)
        try:
            done = await rotate(engine, keys)
        finally:
            await engine.dispose()
        typer.echo(
            f"re-encrypted with the first key: {done.connections} connection(s),"
            f" {done.clients} client secret(s), {done.states} pending sign-in(s)"
        )

    try:
        asyncio.run(go())
    except Undecryptable as exc:
        typer.echo(f"nothing changed: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command("export-schema")
def export_schema(
    output: Annotated[
        Path | None,
        typer.Option(
            help="Where to write; '-' for stdout. Default: schema/schema.graphql, or "
            "schema/database.sql with --database."
        ),
    ] = None,
    database: Annotated[
        bool,
        typer.Option(
            "--database",
            help="Export the database schema of record (pg_dump of DATABASE_URL, which must be "
            "at the latest migration; without DATABASE_URL, a throwaway embedded PostgreSQL "
            "migrated to head) instead of the GraphQL SDL.",
        ),
    ] = False,
) -> None:
    """Write the GraphQL SDL of the running code, or with --database the database schema."""
    if database:
        write_export(database_schema(), output or Path("schema/database.sql"))
        return
    from agent_engine.api.schema import export_sdl

    write_export(export_sdl(), output or Path("schema/schema.graphql"))


def knowledge_import(
    paths: Annotated[list[Path], typer.Argument(help="Markdown/text files or folders.")],
    owner_id: Annotated[
        int | None, typer.Option("--owner-id", help="Grant to this user only.")
    ] = None,
    public: Annotated[bool, typer.Option("--public", help="Visible to everyone.")] = False,
) -> None:
    """Import Markdown and text files into the Knowledge Store stand-in."""
    if (owner_id is None) == (not public):
        typer.echo("give exactly one of --owner-id N or --public", err=True)
        raise typer.Exit(2)
    from agent_engine.knowledge.importer import import_command

    settings = attached_settings()
    if not settings.database_url:
        typer.echo(
            "DATABASE_URL is not set and no embedded server is running in "
            f"{settings.data_dir} (start one with `make run`)",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(import_command(settings, paths, owner_id=owner_id, public=public))


@schedule_app.command("preview")
def schedule_preview(
    schedule: Annotated[
        str, typer.Argument(help='Schedule JSON, e.g. {"type":"interval","every_hours":6}')
    ],
    timezone: Annotated[str, typer.Option(help="IANA zone of the owner.")] = "UTC",
    after: Annotated[
        str | None, typer.Option(help="ISO-8601 instant to start from (default: now).")
    ] = None,
    count: Annotated[int, typer.Option(min=1, max=1000, help="How many slots.")] = 5,
) -> None:
    """Print the next slots of a schedule, one ISO-8601 timestamp per line."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from agent_engine.domain.schedule import ScheduleError, next_slots, parse_schedule

    def fail(message: str) -> typer.Exit:
        typer.echo(f"error: {message}", err=True)
        return typer.Exit(2)

    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise fail(f"--timezone: unknown time zone {timezone!r}") from exc
    try:
        data = json.loads(schedule)
    except json.JSONDecodeError as exc:
        raise fail(f"schedule: not valid JSON ({exc.msg})") from exc
    try:
        parsed = parse_schedule(data)
    except ScheduleError as exc:
        raise fail(str(exc)) from exc
    if parsed is None:
        raise fail("schedule: null means manual only; there are no slots")
    start = datetime.now(UTC)
    if after is not None:
        try:
            start = datetime.fromisoformat(after)
        except ValueError as exc:
            raise fail(f"--after: not an ISO-8601 instant: {after!r}") from exc
        if start.tzinfo is None:
            start = start.replace(tzinfo=zone)
    for slot in next_slots(parsed, after=start, zone=zone, count=count):
        typer.echo(slot.astimezone(zone).isoformat())


@webhook_app.command("new-secret")
def webhook_new_secret() -> None:
    """Print a new whsec_… signing secret for a delivery target."""
    from agent_engine.delivery.signing import new_secret

    typer.echo(new_secret())


@webhook_app.command("listen")
def webhook_listen(
    secret_env: Annotated[
        str, typer.Option(help="Environment variable holding the target's whsec_… secret.")
    ] = "AGENT_ENGINE_WEBHOOK_SECRET",
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 9000,
) -> None:
    """A local receiver: verifies each delivery's signature and prints the verified ones."""
    from agent_engine.delivery.receiver import WebhookReceiver, describe
    from agent_engine.delivery.signing import SecretProblem

    secret = os.environ.get(secret_env)
    if not secret:
        typer.echo(f"{secret_env} is not set (create one with `agent-engine webhook new-secret`)")
        raise typer.Exit(2)
    try:
        receiver = WebhookReceiver(
            secret, host=host, port=port, on_delivery=lambda r: typer.echo(describe(r))
        )
    except SecretProblem as exc:
        typer.echo(f"{secret_env}: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"listening on http://{host}:{port}/ (Ctrl-C to stop)", err=True)
    receiver.serve_forever()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
