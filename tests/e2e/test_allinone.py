"""`agent-engine run` as a newcomer uses it: start, run the sample agent, stop, start again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from agent_engine.embedded import free_port

pytestmark = pytest.mark.slow

STARTUP_SECONDS = 120


class AllInOne:
    def __init__(self, data_dir: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env["AGENT_ENGINE_LOG_FORMAT"] = "json"
        self.base = f"http://127.0.0.1:{port}"
        self.log = data_dir.parent / f"run-{time.monotonic_ns()}.log"
        self._log_file = self.log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_engine.cli",
                "run",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def wait_ready(self) -> str:
        """Wait for the banner; return the demo owner's token."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            found = re.search(
                r'demo owner:\s+\{"Authorization": "Bearer ([^"]+)"\}', self.log.read_text()
            )
            if found:
                assert httpx.get(f"{self.base}/readyz", timeout=5).status_code == 200
                return found.group(1)
            time.sleep(0.5)
        raise AssertionError("not ready:\n" + self.log.read_text()[-3000:])

    def graphql(self, token: str, query: str) -> dict:
        response = httpx.post(
            f"{self.base}/graphql",
            json={"query": query},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        body = response.json()
        assert "errors" not in body, body
        return body["data"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=60)
        self._log_file.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent-engine"
    yield path


def test_run_starts_runs_the_sample_agent_and_keeps_data_across_restarts(data_dir: Path) -> None:
    first = AllInOne(data_dir, free_port())
    try:
        token = first.wait_ready()
        # The demo tokens are good for a week: the all-in-one raised the api's lifetime limit
        # for its own generated secret (a deployment's default is 24 h).
        lifetime = jwt.decode(token, options={"verify_signature": False})["exp"] - time.time()
        assert lifetime > 6 * 86400
        agents = first.graphql(token, "{ viewer { agents { id name status nextRunAt } } }")
        [sample] = agents["viewer"]["agents"]
        assert sample["status"] == "SCHEDULED" and sample["nextRunAt"]
        run = first.graphql(
            token, f'mutation {{ startRun(agentId: "{sample["id"]}") {{ id state }} }}'
        )
        assert run["startRun"]["state"] == "QUEUED"
        run_id = run["startRun"]["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = first.graphql(
                token, f'{{ run(id: "{run_id}") {{ state output tokensUsed }} }}'
            )["run"]
            if found["state"] not in ("QUEUED", "RUNNING"):
                break
            time.sleep(0.3)
        assert found["state"] == "SUCCEEDED", found
        assert "Release process" in found["output"]  # cites the sample documents
        assert found["tokensUsed"] > 0
        metrics = httpx.get(f"{first.base}/metrics", timeout=10).text
        assert re.search(
            r'agent_engine_runs_finished_recent\{[^}]*state="succeeded"[^}]*\} [1-9]', metrics
        ), metrics
    finally:
        first.stop()
    assert first.process.returncode == 0, first.log.read_text()[-3000:]
    # The api, worker and clock it started said nothing alarming on the way: in particular not
    # Dramatiq's "You're adding a middleware of the same type twice: _WorkerMiddleware" (the
    # worker's two Dramatiq workers on one broker, workers/main.py).
    output = first.log.read_text()
    assert "worker started" in output  # the worker's own log is in this output
    assert "same type twice" not in output, output[-3000:]

    second = AllInOne(data_dir, free_port())
    try:
        token = second.wait_ready()
        journal = second.graphql(
            token,
            f'{{ agent(id: "{sample["id"]}") {{ runs {{ edges {{ node {{ id state }} }} }} }} }}',
        )
        ids = [edge["node"]["id"] for edge in journal["agent"]["runs"]["edges"]]
        assert run_id in ids
        again = second.graphql(token, "{ viewer { agents { id } } }")
        assert len(again["viewer"]["agents"]) == 1  # the seed is idempotent
    finally:
        second.stop()
