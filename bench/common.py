"""What every scenario shares: the servers, fresh databases, results, timing and subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis

from agent_engine.settings import Settings, to_asyncpg_url, to_libpq_url

# At least 32 bytes, so the API does not warn about a short HS256 secret.
JWT_SECRET = "bench-jwt-secret-0123456789abcdef0123456789"
FAKE_KEY_ENV = "BENCH_FAKE_OPENAI_KEY"
POLL_SECONDS = 0.02
PROCESS_STOP_SECONDS = 15.0
READY_TIMEOUT_SECONDS = 60.0


@dataclass
class Row:
    """One line of the results table. `ratio` is value ÷ baseline (both in `unit`)."""

    metric: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_label: str = ""
    target: str = ""
    ok: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "unit": self.unit,
            "baseline": self.baseline,
            "baseline_label": self.baseline_label,
            "ratio": self.ratio,
            "target": self.target,
            "ok": self.ok,
            "note": self.note,
        }


# A subscribe/close cycle must leave nothing behind: RSS after the cycles within 10 % of before.
TARGET_MEMORY_GROWTH = 1.10


def memory_growth_row(metric: str, memory: dict[str, Any], *, clean: bool, note: str) -> Row:
    """The RSS row of `memory` (`rss_before`, `rss_after` in bytes); `clean`: nothing was left
    registered and no cycle failed."""
    growth = memory["rss_after"] / memory["rss_before"]
    return Row(
        metric,
        memory["rss_after"] / 2**20,
        "MiB",
        baseline=memory["rss_before"] / 2**20,
        baseline_label="before",
        target=f"ratio ≤ {TARGET_MEMORY_GROWTH:.2f}",
        ok=growth <= TARGET_MEMORY_GROWTH and clean,
        note=note,
    )


@dataclass
class ScenarioResult:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)


# --- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(seconds),
        "p50_ms": percentile(seconds, 50) * 1000,
        "p90_ms": percentile(seconds, 90) * 1000,
        "p99_ms": percentile(seconds, 99) * 1000,
        "max_ms": (max(seconds) * 1000) if seconds else math.nan,
    }


# --- the environment ------------------------------------------------------------------------


class Bench:
    """The embedded servers plus fresh databases cloned from a migrated template."""

    def __init__(
        self,
        *,
        admin_url: str,
        redis_base_url: str,
        template: str,
        work_dir: Path,
        quick: bool,
    ) -> None:
        self.admin_url = admin_url  # libpq form, database "postgres"
        self.redis_base_url = redis_base_url
        self.template = template
        self.work_dir = work_dir
        self.quick = quick
        self._numbers = itertools.count(1)
        self._redis_numbers = itertools.cycle(range(1, 16))
        self.databases: list[str] = []
        self.ceilings: dict[str, float] = {}

    # databases

    def database_url(self, name: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        return f"{base}/{name}"

    async def create_database(self, label: str, *, template: str | None = None) -> str:
        """A new database cloned from `template` (default: the migrated one); its libpq URL."""
        name = f"bench_{label}_{next(self._numbers)}"
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template or self.template}"')
        finally:
            await conn.close()
        self.databases.append(name)
        return self.database_url(name)

    async def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    @staticmethod
    def database_name(url: str) -> str:
        return url.rsplit("/", 1)[1]

    # redis

    def redis_url(self) -> str:
        """A flushed logical Redis database."""
        base = self.redis_base_url.rsplit("/", 1)[0]
        url = f"{base}/{next(self._redis_numbers)}"
        client = redis.Redis.from_url(url)
        try:
            client.flushdb()
        finally:
            client.close()
        return url

    # settings

    def settings(self, database_url: str, redis_url: str, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": to_asyncpg_url(database_url),
            "redis_url": redis_url,
            "broker_url": None,
            "data_dir": self.work_dir / "data",
            "jwt_secret": JWT_SECRET,
            "log_format": "json",
            "log_level": "WARNING",
        }
        values.update(overrides)
        return Settings(**values)

    def env(self, settings: Settings, **extra: str) -> dict[str, str]:
        """The environment that makes a child process load exactly these settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ENGINE_")}
        for key in ("DATABASE_URL", "REDIS_URL", "BROKER_URL"):
            env.pop(key, None)
        for name, value in settings.model_dump().items():
            if value is not None:
                env[f"AGENT_ENGINE_{name.upper()}"] = str(value)
        env[FAKE_KEY_ENV] = "bench-key"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path.cwd()), env.get("PYTHONPATH", "")) if p
        )
        env.update(extra)
        return env


def libpq(url: str) -> str:
    return to_libpq_url(url)


# --- waiting and processes ------------------------------------------------------------------


async def eventually(
    probe: Callable[[], Awaitable[Any]],
    *,
    within: float,
    what: str,
    poll: float = POLL_SECONDS,
) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(poll)


def agent_engine_command(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("agent-engine")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from agent_engine.cli import main; main()", *args]


def python_module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class Process:
    """A child process logging to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, command: list[str], *, env: dict[str, str], log_path: Path) -> None:
        self.command = command
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=Path.cwd()
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(PROCESS_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


@contextlib.contextmanager
def running(command: list[str], *, env: dict[str, str], log_path: Path) -> Iterator[Process]:
    process = Process(command, env=env, log_path=log_path)
    try:
        yield process
    finally:
        process.stop()


def read_port_line(process: Process, *, timeout: float = READY_TIMEOUT_SECONDS) -> int:
    """Helpers print `PORT <n>` on their first line when they are ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.command} exited:\n{process.log_tail()}")
        with contextlib.suppress(OSError):
            for line in process.log_path.read_text(errors="replace").splitlines():
                if line.startswith("PORT "):
                    return int(line.split()[1])
        time.sleep(0.05)
    raise TimeoutError(f"{process.command} did not report its port:\n{process.log_tail()}")


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


# --- profiling ------------------------------------------------------------------------------

PYSPY_ENV = "BENCH_PYSPY_DIR"
PYSPY_RATE_ENV = "BENCH_PYSPY_RATE"  # samples per second (py-spy's default: 100)
# Set (to anything) to sample only the thread holding the GIL: Python's own CPU, without the
# threads and awaits py-spy cannot tell from work (a send or a lock wait can look busy).
PYSPY_GIL_ENV = "BENCH_PYSPY_GIL"


def pyspy_binary() -> str | None:
    import shutil

    found = shutil.which("py-spy")
    if found:
        return found
    for candidate in (Path(sys.executable).with_name("py-spy"), Path("/tmp/pyspy/bin/py-spy")):
        if candidate.exists():
            return str(candidate)
    return None


@contextlib.contextmanager
def profiled(pid: int, name: str) -> Iterator[None]:
    """With BENCH_PYSPY_DIR set, py-spy samples `pid` (collapsed stacks) while the block runs."""
    out_dir = os.environ.get(PYSPY_ENV)
    binary = pyspy_binary()
    if not out_dir or not binary:
        yield
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    output = Path(out_dir) / f"{name}.txt"
    sampler = subprocess.Popen(
        [
            binary,
            "record",
            "--nonblocking",
            *(["--gil"] if os.environ.get(PYSPY_GIL_ENV) else []),
            "--rate",
            os.environ.get(PYSPY_RATE_ENV, "100"),
            "--format",
            "raw",
            "-o",
            str(output),
            "--pid",
            str(pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)  # attach
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        try:
            sampler.wait(20)
        except subprocess.TimeoutExpired:
            sampler.kill()
