"""The GraphQL-over-HTTP spec's own audit suite (npm `graphql-http`) against a running api: every
MUST and SHOULD it checks passes, for `application/json` and `application/graphql-response+json`
alike — no error, no warning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent_engine.settings import Settings
from tests.integration.api.support import Clock, running_server
from tests.support.graphql import token

NODE_DIR = Path(__file__).parent / "node"
AUDIT_SCRIPT = NODE_DIR / "graphql_http_audit.mjs"
AUDIT_USER = 61


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the graphql-http audit needs Node.js")
    if not (NODE_DIR / "node_modules" / "graphql-http").is_dir():
        # .ci/run runs `npm ci` there; without it the test would not say what is missing.
        pytest.fail(f"graphql-http is not installed: run `npm ci` in {NODE_DIR}")
    return node


def test_the_graphql_http_audit_passes_without_errors_or_warnings(settings: Settings) -> None:
    node = _node()
    with running_server(settings, Clock()) as url:
        done = subprocess.run(
            [node, str(AUDIT_SCRIPT), f"{url}/graphql"],
            cwd=NODE_DIR,
            env={**os.environ, "AGENT_ENGINE_AUDIT_TOKEN": token(settings, AUDIT_USER)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["notOk"] == [], json.dumps(summary["notOk"], indent=2)
    assert summary["error"] == 0 and summary["warn"] == 0
    # The suite really ran: graphql-http 1.23 has 60-odd audits for a server.
    assert summary["ok"] >= 50, summary
