"""Operators can follow one run through the logs: JSON lines carrying run_id and agent_id."""

from __future__ import annotations

import json
import logging

import pytest
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.observability.logging import configure_logging
from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings
from tests.integration.runs.support import execute_run
from tests.support.factories import Factories


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


async def test_lines_logged_during_a_run_carry_run_and_agent_ids(
    engine: AsyncEngine,
    factories: Factories,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    restore_logging: object,
) -> None:
    configure_logging(settings.model_copy(update={"log_format": "json"}))
    agent = await factories.agent(prompt="anything")
    run = await factories.run(agent["id"], state="queued")
    async with Runtime(engine) as runtime:
        with structlog.contextvars.bound_contextvars(run_id=run["id"]):
            await execute_run(engine, runtime, run["id"])
    lines = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    finished = [line for line in lines if "finished" in line["event"]]
    assert finished, lines
    assert finished[0]["run_id"] == run["id"]
    assert finished[0]["agent_id"] == agent["id"]
    assert finished[0]["level"] == "info"
    assert "timestamp" in finished[0]
