"""Logs for people and for machines, from real processes on a real terminal (a pty).

`agent-engine run` in a terminal prints readable lines (structlog's console renderer), for its own
lines and its children's; `serve`, `worker` and `clock` print JSON even on a terminal, unless
AGENT_ENGINE_LOG_FORMAT=console.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agent_engine.embedded import free_port
from agent_engine.settings import Settings
from tests.integration.runs.support import agent_engine_command, settings_env

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STOP_SECONDS = 30.0


class Terminal:
    """A process whose stdout and stderr are a pseudo-terminal, as in an interactive shell."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
        )
        os.close(slave)
        self.output = ""

    def read_until(self, pattern: str, within: float) -> str:
        deadline = time.monotonic() + within
        while not re.search(pattern, self.output):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} in:\n{self.output[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the process closed the terminal
                    chunk = b""
                if not chunk and self.process.poll() is not None:
                    raise AssertionError(f"exited before {pattern!r}:\n{self.output[-3000:]}")
                self.output += ANSI.sub("", chunk.decode(errors="replace")).replace("\r", "")
        return self.output

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal the process and keep draining its terminal until it exits (a full pty buffer
        would block its shutdown logging); idempotent."""
        if self.master < 0:
            return
        if self.process.poll() is None:
            self.process.send_signal(signum)
            deadline = time.monotonic() + STOP_SECONDS
            while self.process.poll() is None and time.monotonic() < deadline:
                self._drain(0.2)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        os.close(self.master)
        self.master = -1

    def _drain(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.output += os.read(self.master, 65536).decode(errors="replace")
            except OSError:
                time.sleep(timeout)


@contextmanager
def terminal(argv: list[str], env: dict[str, str]) -> Iterator[Terminal]:
    running = Terminal(argv, env)
    try:
        yield running
    finally:
        running.stop()


def log_line(output: str, event: str) -> str:
    [line] = [line for line in output.splitlines() if event in line][:1]
    return line


def test_the_clock_logs_json_on_a_terminal_by_default(settings: Settings) -> None:
    env = settings_env(settings)
    env.pop("AGENT_ENGINE_LOG_FORMAT")
    with terminal(agent_engine_command("clock"), env) as clock:
        output = clock.read_until(r"clock started[^\n]*\n", within=30)
    record = json.loads(log_line(output, "clock started"))
    assert record["event"].startswith("clock started")
    assert record["level"] == "info" and record["logger"] == "agent_engine.workers.clock"


def test_the_clock_logs_for_people_when_asked(settings: Settings) -> None:
    env = settings_env(settings, log_format="console")
    with terminal(agent_engine_command("clock"), env) as clock:
        output = clock.read_until(r"clock started[^\n]*\n", within=30)
    line = log_line(output, "clock started")
    assert not line.lstrip().startswith("{")
    assert re.search(r"\[info\s*\] clock started", line), line


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Outside pytest's basetemp: that is one 0700 tree shared by every pytest run of this user,
    and the embedded PostgreSQL runs as a system user that must traverse to its data."""
    path = Path(tempfile.mkdtemp(prefix="ae-logs-"))
    try:
        yield path / "data"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_run_on_a_busy_port_says_so_in_one_line_and_starts_nothing(data_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ENGINE_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "agent_engine.cli", "run", "--port", str(port)]
        done = subprocess.run(
            [*argv, "--data-dir", str(data_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"agent-engine run: port {port} on 127.0.0.1 is in use (another `agent-engine run`?);"
        " choose another with --port"
    ]
    assert "Agent Engine is running" not in done.stdout
    assert not data_dir.exists()


@pytest.mark.slow
def test_run_on_a_terminal_prints_readable_logs_and_links_the_dashboard(data_dir: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AGENT_ENGINE_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    port = free_port()
    argv = [sys.executable, "-m", "agent_engine.cli", "run", "--port", str(port)]
    argv += ["--data-dir", str(data_dir)]
    with terminal(argv, env) as run:
        # The banner may reach the terminal in pieces: read to the end of its dashboard line.
        output = run.read_until(r"Agent Engine is running\.\s+Dashboard: [^\n]*\n", within=180)
        assert f"Dashboard: http://127.0.0.1:{port}/dashboard" in output
        # Libraries' chatter stays out of a person's console (Alembic's steps, uvicorn's start).
        assert "Running upgrade" not in output and "Uvicorn running" not in output, output
        # The children log readable lines too (they would default to JSON on their own).
        run.read_until(r"clock started[^\n]*\n", within=60)
        output = run.read_until(r"worker started[^\n]*\n", within=60)
        for event in ("worker started", "clock started"):
            line = log_line(output, event)
            assert re.search(rf"\[info\s*\] {event}", line), line
        assert not [line for line in output.splitlines() if line.startswith('{"')]
        # The banner's link is the page.
        page = httpx.get(f"http://127.0.0.1:{port}/dashboard", timeout=10)
        assert page.status_code == 200 and "/static/dashboard.js" in page.text
        run.stop(signal.SIGINT)
    assert run.process.returncode == 0
