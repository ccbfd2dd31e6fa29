"""The builtin offline model answers from imported documents, citing them, with no network."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.knowledge.importer import import_paths
from agent_engine.runtime.context import load_run_context
from agent_engine.runtime.loop import Runtime
from agent_engine.runtime.providers.builtin import FOOTER
from tests.support.factories import Factories

NOW = datetime(2025, 3, 3, 9, 30, tzinfo=UTC)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Refuse every connection except to the local database (loopback or a Unix socket)."""
    attempts: list[Any] = []
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else "unix"
        if host not in ("127.0.0.1", "::1", "localhost", "unix"):
            attempts.append(address)
            raise OSError(f"network access to {address!r} refused by the test")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield attempts


def _write(root: Path, relative: str, content: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


async def test_builtin_model_answers_with_a_cited_digest(
    engine: AsyncEngine, factories: Factories, tmp_path: Path, no_network: list[Any]
) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    _write(
        public,
        "vpn.md",
        "# VPN access\n\nRequest VPN access through the IT portal."
        " Approval takes one day.\n\nSee also [laptops](laptops.md).\n",
    )
    _write(
        public, "laptops.md", "# Laptop setup\n\nLaptops ship with the VPN client preinstalled.\n"
    )
    _write(public, "canteen.md", "# Canteen\n\nLunch is served at noon.\n")
    _write(
        private,
        "vpn-incident.md",
        "# VPN incident report\n\nThe VPN outage was caused by"
        " an expired certificate. Internal only.\n",
    )
    owner = (await factories.user())["id"]
    other = (await factories.user())["id"]
    await import_paths(engine, [public], owner_id=None, public=True, progress=False)
    imported_private = await import_paths(
        engine, [private], owner_id=other, public=False, progress=False
    )
    secret_id = next(iter(imported_private.document_ids.values()))

    model = await factories.model(provider="builtin", model="builtin-digest")
    agent = await factories.agent(
        user_id=owner, model_id=model["id"], prompt="How do I get VPN access?"
    )
    run = await factories.run(agent_id=agent["id"], state="running")
    async with engine.connect() as conn:
        ctx = await load_run_context(conn, run["id"])
    assert ctx is not None
    spent: list[int] = []
    async with Runtime(engine) as runtime:
        outcome = await runtime.execute(ctx, now=NOW, on_tokens=spent.append)
        again = await runtime.execute(ctx, now=NOW)

    assert outcome.state == "succeeded", outcome.error
    assert outcome.output is not None
    assert "Request VPN access through the IT portal." in outcome.output
    cited = re.findall(r"^\[(\d)\] (.+) \(document (\d+)\)$", outcome.output, re.MULTILINE)
    assert [title for _, title, _ in cited][:2] == ["VPN access", "Laptop setup"]
    assert str(secret_id) not in {doc for _, _, doc in cited}
    assert "incident" not in outcome.output and "certificate" not in outcome.output
    assert "Canteen" not in outcome.output
    assert outcome.output.endswith(FOOTER)
    # Three model calls (search, read, answer); usage is an estimate, the same every time.
    assert len(spent) == 3 and spent[-1] == outcome.tokens_used > 0
    assert again == outcome
    assert no_network == []


async def test_builtin_model_with_an_empty_knowledge_base(
    engine: AsyncEngine, factories: Factories
) -> None:
    model = await factories.model(provider="builtin", model="builtin-digest")
    agent = await factories.agent(model_id=model["id"], prompt="Quarterly zeppelin figures")
    run = await factories.run(agent_id=agent["id"], state="running")
    async with engine.connect() as conn:
        ctx = await load_run_context(conn, run["id"])
    assert ctx is not None
    async with Runtime(engine) as runtime:
        outcome = await runtime.execute(ctx, now=NOW)
    assert outcome.state == "succeeded"
    assert outcome.output is not None and "No documents" in outcome.output
