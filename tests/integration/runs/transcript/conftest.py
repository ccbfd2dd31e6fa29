"""Fixtures: the api under Uvicorn (real clock), a real Dramatiq worker, the fake model server."""

from __future__ import annotations

from tests.integration.api.subscriptions.conftest import http, server, worker
from tests.integration.runs.conftest import fake_agent, fake_openai

__all__ = ["fake_agent", "fake_openai", "http", "server", "worker"]
