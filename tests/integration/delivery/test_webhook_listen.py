"""`agent-engine webhook listen`: a real process that prints verified deliveries and refuses
unsigned ones."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent_engine.delivery.signing import body_bytes, new_secret, signed_headers, signer
from agent_engine.embedded import free_port
from tests.integration.runs.support import agent_engine_command

START_SECONDS = 20.0


def test_listen_prints_verified_deliveries_and_refuses_the_rest(tmp_path: Path) -> None:
    secret = new_secret()
    port = free_port()
    env = {**os.environ, "HOOK_SECRET": secret}
    with (tmp_path / "listen.out").open("wb") as out:
        _exercise(secret, port, env, out)
    lines = (tmp_path / "listen.out").read_text().splitlines()
    verified = [json.loads(line) for line in lines if line.startswith("{")]
    assert [v["webhook-id"] for v in verified] == ["msg_abc"]
    assert verified[0]["payload"] == {"type": "run.succeeded", "data": {"runId": "7"}}
    assert sum(1 for line in lines if line.startswith("REJECTED (401)")) == 2


def _exercise(secret: str, port: int, env: dict[str, str], out: Any) -> None:
    proc = subprocess.Popen(
        agent_engine_command(
            "webhook", "listen", "--secret-env", "HOOK_SECRET", "--port", str(port)
        ),
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/hooks"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                httpx.post(url, content=b"{}")
                break
            except httpx.ConnectError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        body = body_bytes({"type": "run.succeeded", "data": {"runId": "7"}})
        headers = signed_headers(signer(secret), "msg_abc", datetime.now(UTC), body)
        assert httpx.post(url, content=body, headers=headers).status_code == 204
        forged = {**headers, "webhook-signature": "v1,AAAA"}
        assert httpx.post(url, content=body, headers=forged).status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


def test_listen_without_the_secret_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOOK_SECRET_UNSET"}
    result = subprocess.run(
        agent_engine_command("webhook", "listen", "--secret-env", "HOOK_SECRET_UNSET"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "HOOK_SECRET_UNSET is not set" in result.stdout + result.stderr
