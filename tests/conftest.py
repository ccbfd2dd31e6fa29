"""Test harness.

Session-scoped real servers: an embedded PostgreSQL and Valkey in a temporary directory, or the
servers named by DATABASE_URL / REDIS_URL (CI runs the integration suite against the machine's
system services that way). Every test that asks for a database gets a fresh one, cloned from a
migrated template (a few tens of milliseconds), and a flushed logical Redis database.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import redis
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.engine import create_engine_for_url
from agent_engine.db.migrate import upgrade
from agent_engine.embedded import EmbeddedServers
from agent_engine.settings import Settings, to_asyncpg_url, to_libpq_url
from tests.support.factories import Factories

TEST_JWT_SECRET = "test-secret-that-is-at-least-32-bytes-long"


@dataclass
class Servers:
    admin_url: str  # libpq form, database "postgres" (or the one given)
    redis_base_url: str
    template: str
    prefix: str
    embedded: EmbeddedServers | None

    def database_url(self, name: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        query = ""
        if "?" in self.admin_url:
            query = "?" + self.admin_url.split("?", 1)[1]
        return f"{base}/{name}{query}"

    def redis_url(self, db: int) -> str:
        base = (
            self.redis_base_url.rsplit("/", 1)[0]
            if self.redis_base_url.count("/") > 2
            else (self.redis_base_url)
        )
        return f"{base}/{db}"


def _admin_url_from_env(url: str) -> str:
    return to_libpq_url(url)


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    database_url = os.environ.get("DATABASE_URL")
    redis_url = os.environ.get("REDIS_URL")
    embedded: EmbeddedServers | None = None
    if not (database_url and redis_url):
        tmp = Path(tempfile.mkdtemp(prefix="agent-engine-test-"))
        embedded = EmbeddedServers(
            tmp, database_url=database_url, redis_url=redis_url, ephemeral=True
        ).start()
        database_url = embedded.database_url
        redis_url = embedded.redis_url
    prefix = f"ae_test_{os.getpid()}"
    template = f"{prefix}_template"
    admin_url = _admin_url_from_env(database_url)
    found = Servers(admin_url, redis_url, template, prefix, embedded)
    _run_admin(
        admin_url,
        f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)',
        f'CREATE DATABASE "{template}"',
    )
    upgrade(found.database_url(template))
    try:
        yield found
    finally:
        _drop_prefixed(admin_url, prefix)
        if embedded is not None:
            embedded.stop()


def _run_admin(admin_url: str, *statements: str) -> None:
    import asyncio

    async def go() -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(go())


def _drop_prefixed(admin_url: str, prefix: str) -> None:
    import asyncio

    async def go() -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            names = await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE $1", prefix + "%"
            )
            for row in names:
                await conn.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(go())


_database_numbers = itertools.count(1)


@pytest.fixture
async def database_url(servers: Servers) -> AsyncIterator[str]:
    name = f"{servers.prefix}_{next(_database_numbers)}"
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{servers.template}"')
    finally:
        await conn.close()
    yield to_asyncpg_url(servers.database_url(name))
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _redis_databases() -> range:
    """Logical Redis databases 1-15 for this test process. Under pytest-xdist with one shared
    server (REDIS_URL), each worker takes every n-th one, so no two workers flush each other's;
    with the embedded servers each worker has a Valkey of its own and takes them all."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    if workers > 1 and os.environ.get("REDIS_URL"):
        return range(1 + worker, 16, workers)
    return range(1, 16)


_redis_numbers = itertools.cycle(_redis_databases())


@pytest.fixture
def redis_url(servers: Servers) -> str:
    url = servers.redis_url(next(_redis_numbers))
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine_for_url(database_url, pool_size=5)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def settings(database_url: str, redis_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        broker_url=os.environ.get("BROKER_URL"),
        data_dir=tmp_path / "data",
        jwt_secret=TEST_JWT_SECRET,
        heartbeat_interval_seconds=1.0,
        stale_after_seconds=3.0,
        queued_resend_after_seconds=2.0,
        queued_fail_after_seconds=60.0,
        schedule_tick_seconds=0.5,
        reap_tick_seconds=1.0,
        log_format="console",
        # Tests open many sockets of one user at once (one user stands for many); the cap's own
        # tests (tests/integration/api/subscriptions/test_limits.py) use the default.
        max_sockets_per_user=1_000,
    )


@pytest.fixture
def factories(engine: AsyncEngine) -> Factories:
    return Factories(engine)
