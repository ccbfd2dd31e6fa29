"""What a Kubernetes scale-down does to a worker pod, on a real `agent-engine worker` process:
SIGTERM, then the drain (`AGENT_ENGINE_WORKER_DRAIN_SECONDS`). A run that ends within the drain
finishes; one that does not is journaled as interrupted. None is lost and none runs twice."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.finish import INTERRUPTED_ERROR
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import enqueue_execute
from tests.integration.conftest import broker, fake_agent, fake_openai  # noqa: F401 (fixtures)
from tests.integration.runs.support import (
    FakeAgent,
    agent_engine_command,
    eventually,
    processes,
    run_row,
    settings_env,
)

pytestmark = pytest.mark.slow

WORKER = agent_engine_command("worker", "--threads", "2")
EXIT_WITHIN_SECONDS = 60


async def _request(engine: AsyncEngine, agent_id: int) -> int:
    """A manual run of the agent, its execute message sent; its id."""
    run = await request_run(
        engine, agent_id, trigger=RunTrigger.MANUAL, now=datetime.now(UTC), enqueue=enqueue_execute
    )
    return run.id


async def _sigterm_mid_run(
    engine: AsyncEngine, settings: Settings, agent_id: int, tmp_path: Path, *, drain_seconds: float
) -> int:
    """A worker process with this drain takes a run of the agent and gets SIGTERM while the run is
    in flight; the worker exits cleanly within the limit. The run's id."""
    env = settings_env(settings, worker_drain_seconds=drain_seconds)
    with processes([WORKER], env=env, log_dir=tmp_path) as (worker,):
        run_id = await _request(engine, agent_id)

        async def running() -> bool:
            return bool((await run_row(engine, run_id))["state"] == "running")

        await eventually(running, what="the run to be in flight")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(EXIT_WITHIN_SECONDS) == 0
    return run_id


async def test_a_run_that_ends_within_the_drain_finishes_after_sigterm(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    fake_agent: FakeAgent,  # noqa: F811
    broker: dramatiq.Broker,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = await fake_agent()
    # Longer than the default drain (20 s): only the configured one lets it finish.
    fake_openai.enqueue(text_reply("Finished while draining.", delay_seconds=22))
    run_id = await _sigterm_mid_run(engine, settings, agent["id"], tmp_path, drain_seconds=45)
    row = await run_row(engine, run_id)
    assert (row["state"], row["output"]) == ("succeeded", "Finished while draining.")
    assert fake_openai.request_count == 1


async def test_a_run_longer_than_the_drain_is_interrupted_not_lost(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    fake_agent: FakeAgent,  # noqa: F811
    broker: dramatiq.Broker,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = await fake_agent()
    fake_openai.enqueue(text_reply("Never delivered.", delay_seconds=120))
    run_id = await _sigterm_mid_run(engine, settings, agent["id"], tmp_path, drain_seconds=1)
    row = await run_row(engine, run_id)
    assert (row["state"], row["reason"], row["error"]) == ("failed", "error", INTERRUPTED_ERROR)
    # The next worker (the replacement pod) runs the agent again; the interrupted run stays put.
    fake_openai.enqueue(text_reply("Next one."))
    with processes([WORKER], env=settings_env(settings), log_dir=tmp_path):
        again = await _request(engine, agent["id"])

        async def succeeded() -> bool:
            return bool((await run_row(engine, again))["state"] == "succeeded")

        await eventually(succeeded, what="the next run to succeed")
    assert (await run_row(engine, run_id))["error"] == INTERRUPTED_ERROR
    assert fake_openai.request_count == 2


SYS_TGKILL = 234  # x86-64


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """tgkill(2): `signum` to one thread of another process (os.kill lets the kernel pick)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's syscall number is x86-64's")
async def test_a_sigterm_that_lands_on_any_thread_stops_the_worker(
    settings: Settings,
    broker: dramatiq.Broker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The kernel hands a process-directed signal to any thread that does not block it. Here a
    thread other than the main one gets the SIGTERM (as the kernel may route Kubernetes' one):
    the worker drains and exits 0, rather than sleeping on until the grace period's SIGKILL."""
    env = settings_env(settings, worker_drain_seconds=1)
    with processes([WORKER], env=env, log_dir=tmp_path) as (worker,):
        log = tmp_path / "process-0-worker.log"

        async def started() -> list[int]:
            if "worker started" not in log.read_text(errors="replace"):
                return []
            return [int(t) for t in os.listdir(f"/proc/{worker.pid}/task") if int(t) != worker.pid]

        threads = await eventually(started, within=60, what="the worker to start its threads")
        _signal_thread(worker.pid, threads[-1], signal.SIGTERM)
        # A hang guard, not a speed bound: without the fix the worker never exits on its own.
        exit_code = await asyncio.to_thread(worker.wait, EXIT_WITHIN_SECONDS)
    assert exit_code == 0
    assert "worker stopping" in log.read_text(errors="replace")
