"""`agent-engine run`: everything on one machine in one command.

Starts the embedded PostgreSQL and Valkey in the data directory (unless DATABASE_URL / REDIS_URL
are set), migrates, seeds the demo, then runs the api, a worker and the clock as child processes
-- the same commands a production deployment runs separately. Ctrl-C stops the children first,
then the servers; the data stays in the data directory for the next start.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from agent_engine.api.auth import mint_token
from agent_engine.db.engine import create_engine_for_url
from agent_engine.db.migrate import upgrade
from agent_engine.demo.seed import DEMO_ADMIN_ID, DEMO_OWNER_ID, seed_demo
from agent_engine.demo.tokens import DEV_TOKEN_TTL, MAX_LIFETIME_ENV, demo_max_lifetime
from agent_engine.embedded import EmbeddedServers
from agent_engine.oauth.keys import ENV as TOKEN_KEYS_ENV
from agent_engine.oauth.keys import new_key as new_token_key
from agent_engine.observability.logging import configure_logging
from agent_engine.settings import Settings, to_libpq_url
from agent_engine.testing.mcp_tickets import TicketServer
from agent_engine.testing.oauth_servers import AuthorizationServer, ResourceServer

READY_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 20.0


def _jwt_secret(settings: Settings, data_dir: Path) -> str:
    """The configured secret, or one generated once and kept beside the data (tokens survive)."""
    if settings.jwt_secret:
        return settings.jwt_secret
    path = data_dir / "jwt-secret"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _kept_secret(path: Path, fresh: str) -> str:
    """The value kept in `path` (0600), written from `fresh` the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh)
        path.chmod(0o600)
    return path.read_text().strip()


def run_all(
    settings: Settings,
    *,
    host: str,
    port: int,
    data_dir: Path,
    worker_threads: int,
    seed: bool = True,
) -> None:
    # Human-readable (a person started it) unless AGENT_ENGINE_LOG_FORMAT=json; the children log
    # the same way (they would default to JSON on their own).
    log_format = configure_logging(settings, interactive=True)
    data_dir = data_dir.resolve()
    servers = EmbeddedServers(
        data_dir, database_url=settings.database_url, redis_url=settings.redis_url
    )
    print(f"agent-engine: starting servers (data in {data_dir}) …", flush=True)
    servers.start()
    children: list[subprocess.Popen[bytes]] = []
    # The demo MCP source: a small ticket server (one READ, one WRITE tool) in this process, an
    # OAuth resource server of the demo authorization server beside it (OWNER_OAUTH: each owner
    # connects their own account; the tool list is open to anonymous listing).
    authorization: AuthorizationServer | None = None
    tickets: TicketServer | None = None
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        database_url = to_libpq_url(servers.database_url)
        upgrade(database_url)
        secret = _jwt_secret(settings, data_dir)
        if seed:
            oauth_secret = _kept_secret(data_dir / "demo-oauth-secret", secrets.token_urlsafe(32))
            authorization = AuthorizationServer(secret=oauth_secret).start()
            tickets = ResourceServer(issuer=authorization.issuer, secret=oauth_secret).start()
            tickets_url = tickets.url

            async def _seed() -> None:
                engine = create_engine_for_url(database_url, pool_size=2)
                try:
                    await seed_demo(
                        engine,
                        now=datetime.now(UTC),
                        tickets_url=tickets_url,
                        tickets_auth="owner_oauth",
                    )
                finally:
                    await engine.dispose()

            asyncio.run(_seed())
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": servers.redis_url,
            "AGENT_ENGINE_JWT_SECRET": secret,
            "AGENT_ENGINE_LOG_FORMAT": log_format,
        }
        # Owners' OAuth tokens: the operator's keys, else one kept in the data dir; the
        # callback at this address unless the operator says otherwise.
        if not settings.token_keys:
            env[TOKEN_KEYS_ENV] = _kept_secret(data_dir / "token-keys", new_token_key())
        if not settings.public_url:
            env["AGENT_ENGINE_PUBLIC_URL"] = base
        token_ttl = DEV_TOKEN_TTL
        if (demo_limit := demo_max_lifetime(settings)) is not None:
            env[MAX_LIFETIME_ENV] = str(int(demo_limit.total_seconds()))
        else:
            # The operator's own secret keeps the operator's limit: the demo tokens fit in it.
            token_ttl = min(DEV_TOKEN_TTL, timedelta(seconds=settings.jwt_max_lifetime_seconds))
        cli = [sys.executable, "-m", "agent_engine.cli"]
        for args in (
            ["serve", "--host", host, "--port", str(port)],
            ["worker", "--processes", "1", "--threads", str(worker_threads)],
            ["clock"],
        ):
            # Own sessions: Ctrl-C reaches us once, and we stop the children in order.
            children.append(
                subprocess.Popen(
                    [*cli, *args], env=env, start_new_session=True, preexec_fn=_die_with_parent
                )
            )
        _wait_ready(base, children)
        # Ready means our api answered: had another process taken the port meanwhile, ours
        # would have exited by now.
        if (serve := children[0]).poll() is not None:
            raise SystemExit(f"agent-engine: the api exited with {serve.returncode}")
        tokens = {
            "owner": mint_token(
                secret,
                user_id=DEMO_OWNER_ID,
                email="owner@example.com",
                name="Demo Owner",
                timezone="UTC",
                admin=False,
                ttl=token_ttl,
            ),
            "admin": mint_token(
                secret,
                user_id=DEMO_ADMIN_ID,
                email="admin@example.com",
                name="Demo Admin",
                timezone="UTC",
                admin=True,
                ttl=token_ttl,
            ),
        }
        _print_banner(base, tokens)
        _supervise(children)
    finally:
        _stop(children)
        if tickets is not None:
            tickets.stop()
        if authorization is not None:
            authorization.stop()
        servers.stop()
        print("agent-engine: stopped; data kept in", data_dir, flush=True)


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (checked before anything starts, so a
    busy port is one clear line instead of a banner followed by the api's bind error)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child: get SIGTERM if `run` itself dies (even by SIGKILL), so no api, worker or
    clock is left holding the port or the data after a crash. Linux only; elsewhere a no-op."""
    if sys.platform != "linux":
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _role(child: subprocess.Popen[bytes]) -> str:
    args = child.args
    return str(args[3]) if isinstance(args, list) and len(args) > 3 else "a child process"


def _wait_ready(base: str, children: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for child in children:
            if child.poll() is not None:
                raise SystemExit(f"agent-engine: {_role(child)} exited with {child.returncode}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("agent-engine: the api did not become ready in time")


def _print_banner(base: str, tokens: dict[str, str]) -> None:
    lines = [
        "",
        "Agent Engine is running.",
        f"  Dashboard: {base}/dashboard   (sign in by pasting one of the tokens below)",
        f"  GraphiQL:  {base}/graphql",
        f"  Health:    {base}/readyz    Metrics: {base}/metrics",
        "",
        "Paste one of these into GraphiQL's Headers tab:",
        f'  demo owner:  {{"Authorization": "Bearer {tokens["owner"]}"}}',
        "",
        f'  demo admin:  {{"Authorization": "Bearer {tokens["admin"]}"}}',
        "",
        "Connect the demo owner's own account at the ticket server (OWNER_OAUTH), as the owner:",
        "  { toolConnections { sourceId sourceName status account } }",
        '  mutation { connectToolSource(sourceId: "<sourceId>") { authorizationUrl } }',
        "  then open the authorizationUrl in a browser on this machine: the demo authorization",
        "  server signs you in (as demo@example.com) and the engine's page says you are connected.",
        "",
        "Press Ctrl-C to stop (data is kept for the next start).",
        "",
    ]
    print("\n".join(lines), flush=True)


def _supervise(children: list[subprocess.Popen[bytes]]) -> None:
    stop = False

    def _request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop:
            for child in children:
                if child.poll() is not None:
                    print(
                        f"agent-engine: {_role(child)} exited with {child.returncode}; stopping",
                        flush=True,
                    )
                    return
            time.sleep(0.3)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
