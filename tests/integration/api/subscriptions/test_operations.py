"""Several api processes, /metrics and /readyz."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import dramatiq
import httpx
from starlette.applications import Starlette

from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import (
    RUN_EVENTS,
    START_RUN,
    GraphQLWs,
    Server,
    acknowledged_client,
    running_api,
    token,
)
from tests.integration.runs.support import agent_engine_command, eventually, processes, settings_env
from tests.support.factories import Factories

PROCESS_READY_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the exposition text."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(match.group(2))
    return None


async def test_two_api_processes_both_deliver_the_same_event(
    settings: Settings, factories: Factories, tmp_path: Path
) -> None:
    agent = await factories.agent()
    ports = [free_port(), free_port()]
    commands = [
        agent_engine_command("serve", "--host", "127.0.0.1", "--port", str(p)) for p in ports
    ]
    with processes(commands, env=settings_env(settings), log_dir=tmp_path):
        servers = [Server(url=f"http://127.0.0.1:{port}", app=Starlette()) for port in ports]
        async with httpx.AsyncClient(timeout=5.0) as http:
            for server in servers:
                await eventually(
                    lambda server=server: _ready(http, server),
                    within=PROCESS_READY_SECONDS,
                    what=f"{server.url}/readyz",
                )
            bearer = token(settings, agent["user_id"])
            async with (
                acknowledged_client(servers[0], bearer) as first,
                acknowledged_client(servers[1], bearer) as second,
            ):
                await first.subscribe("1", RUN_EVENTS)
                await second.subscribe("1", RUN_EVENTS)
                for server in servers:  # each process counts its own subscriptions
                    await eventually(
                        lambda server=server: _subscriptions(http, server, 1),
                        what=f"the subscription on {server.url}",
                    )
                run = await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
                for client in (first, second):
                    event = (await client.next_data("1"))["runEvents"]
                    assert (event["run"]["id"], event["run"]["state"]) == (
                        str(run["id"]),
                        "SKIPPED",
                    )


async def _ready(http: httpx.AsyncClient, server: Server) -> bool:
    try:
        response = await http.get(f"{server.url}/readyz")
    except httpx.TransportError:
        return False
    return response.status_code == 200 and response.json()["events"] == "listening"


async def _subscriptions(http: httpx.AsyncClient, server: Server, count: int) -> bool:
    text = (await http.get(f"{server.url}/metrics")).text
    return metric(text, "agent_engine_active_subscriptions") == count


async def test_metrics_show_a_run_that_just_happened(
    server: Server,
    settings: Settings,
    factories: Factories,
    worker: dramatiq.Worker,
) -> None:
    agent = await factories.agent()
    bearer = token(settings, agent["user_id"])
    async with httpx.AsyncClient(timeout=10.0) as http, acknowledged_client(server, bearer) as ws:
        await ws.subscribe("1", RUN_EVENTS)
        await server.wait_subscribers(1)
        before = await http.get(f"{server.url}/metrics")
        assert before.status_code == 200
        assert before.headers["content-type"].startswith("text/plain")
        assert metric(before.text, "agent_engine_active_subscriptions") == 1
        assert not metric(before.text, "agent_engine_runs_finished_recent", state="succeeded")

        response = await http.post(
            f"{server.url}/graphql",
            json={"query": START_RUN, "variables": {"id": str(agent["id"])}},
            headers={"Authorization": f"Bearer {bearer}"},
        )
        assert not response.json().get("errors"), response.text
        await _until_state(ws, "SUCCEEDED")

        after = (await http.get(f"{server.url}/metrics")).text
    finished = metric(after, "agent_engine_runs_finished_recent", state="succeeded", reason="")
    assert finished is not None and finished >= 1
    tokens = metric(after, "agent_engine_tokens_spent_recent")
    assert tokens is not None and tokens > 0
    assert metric(after, "agent_engine_runs_unfinished", state="running") == 0
    assert metric(after, "agent_engine_run_duration_seconds", quantile="0.5") is not None


async def _until_state(ws: GraphQLWs, state: str) -> None:
    while (await ws.next_data("1"))["runEvents"]["run"]["state"] != state:
        pass


async def test_readyz_names_a_dead_broker(settings: Settings) -> None:
    dead = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{free_port()}/0"})
    with running_api(dead) as server:
        async with httpx.AsyncClient(timeout=10.0) as http:
            response = await http.get(f"{server.url}/readyz")
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["down"] == ["broker"]
    assert (body["database"], body["broker"]) == ("ok", "unreachable")


async def test_readyz_checks_an_amqp_broker_too(settings: Settings) -> None:
    dead = settings.model_copy(
        update={"broker_url": f"amqp://guest:guest@127.0.0.1:{free_port()}/"}
    )
    with running_api(dead) as server:
        async with httpx.AsyncClient(timeout=10.0) as http:
            response = await http.get(f"{server.url}/readyz")
    assert response.status_code == 503, response.text
    assert response.json()["down"] == ["broker"]


async def test_readyz_is_ready_with_database_and_broker(server: Server) -> None:
    async with httpx.AsyncClient(timeout=10.0) as http:
        response = await http.get(f"{server.url}/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": "ready",
        "database": "ok",
        "broker": "ok",
        "events": "listening",
    }
